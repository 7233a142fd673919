"""The same clients under Flower's deployment engine: the ClientApp and ServerApp (:mod:`.app`), a node
holding users (:mod:`.node`), the server side (:mod:`.server`), SecAgg+ (:mod:`.secagg`), settings, the wire
format, and the commands that start SuperLink and SuperNodes (:mod:`.deploy`)."""
