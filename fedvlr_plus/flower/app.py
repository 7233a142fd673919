"""The same clients under Flower's deployment engine (``flwr`` >= 1.40, the Message API; no Ray).

A federated run here is one SuperLink, one or more SuperNodes (a device, or a silo holding many users) and a
Flower App whose two halves are built by this module:

- :func:`make_client_app` -> ``ClientApp``. Its ``train`` and ``evaluate`` handlers run the node's users through
  the *same* :class:`~fedvlr_plus.federation.engine.FederatedRun` as ``fedvlr-plus run`` (the batched simulator,
  or the sequential reference clients with ``simulator = "sequential"``), over the same
  :class:`~fedvlr_plus.adapters.base.Backbone` (optionally wrapped by the FedVLR
  :class:`~fedvlr_plus.fedvlr.FusionLayer`). The shared state arrives as an ``ArrayRecord``; the reply is the
  node's weighted sums where the strategy is linear (:mod:`.node_sums`), else each user's upload (keys
  ``u<cid>/<name>`` and ``u<cid>/<name>/rows``). Private state (router, head, user embedding) lives in the node:
  in the run's store and in a local file written atomically after every local training, so a SuperNode that
  restarts continues from it. It never enters a message.
- :func:`make_server_app` -> ``ServerApp``. Its :class:`FedVLRStrategy` (a Flower ``Strategy``) sends the shared
  state, turns the replies back into :class:`~fedvlr_plus.federation.messages.ClientUpdate` objects and hands them
  to *our* strategies (:func:`~fedvlr_plus.federation.strategies.base.make_strategy`: FedAvg, gradient aggregation
  with a
  server optimizer, sparse row averaging, ...), wrapped by the FedVLR server fusion when the layer is on. Stock
  Flower FedAvg cannot do this: uploads carry different item rows per client. Evaluation is federated (each node
  ranks its own users' held-out items and returns metric *sums*, never per-user values) or on the server
  (``evaluation = "server"``: the global model scored for users with a fresh, untrained private state).

Model selection follows the simulator (:mod:`fedvlr_plus.federation.engine`): the round with the best validation
metric is selected, and its test figures are reported; test is never read to make a decision. With the same
settings and seed a deployment reproduces the simulator's numbers (``tests/test_flower.py`` checks it on real
processes).

Node configuration (``flower-supernode --node-config``): ``partition-id``, ``num-partitions`` (users are split
into contiguous blocks of user ids; one partition = one silo or device), ``state-dir`` (where the private state
file lives; default ``$FLWR_HOME/fedvlr-state``), optionally ``data`` (this node's copy of the data; default: the
run's ``data``).

Run configuration (``[tool.flwr.app.config]``, overridable with ``flwr run --run-config``): ``data``,
``max-users`` and every :class:`~fedvlr_plus.federation.config.FedConfig` field in kebab case (``rounds``,
``local-epochs``, ``strategy``, ``server-lr``, ...), the FedVLR layer (``fusion``, ``router-temperature``,
``router-balance``, ``cold-neighbours``), and the deployment knobs ``min-train-nodes``, ``min-evaluate-nodes``,
``min-available-nodes``, ``fraction-train``, ``round-timeout``, ``evaluation`` (``federated`` | ``server``),
``result`` (path of the result JSON the ServerApp writes) and ``audit-dir`` (if set, every reply the ServerApp
receives is written there, so anyone can check what left the nodes). Fault drills: ``fault-partition``,
``fault-round``, ``fault-delay-s`` make that partition's node wait before training in that round, which leaves
time to kill it mid-round (the tests use it; leave them unset otherwise).
"""

from __future__ import annotations

from .node import _NODE_CACHE, NodeRun, _config_dict, make_client_app, node_evaluate, node_run, node_train  # noqa: F401
from .node_state import STATE_FORMAT, NodeStateFile, file_digest, read_states  # noqa: F401
from .server import FedVLRStrategy, SecureFedVLRStrategy, make_server_app, server_main  # noqa: F401
from .settings import DEPLOY_KEYS, Settings, build_backbone, fedvlr_options, load_data, partition_users  # noqa: F401

# the deployment's files, all named here: the settings, the wire format, the node side, the server side
from .wire import content_to_updates, record_to_shared, shared_to_record, updates_to_content  # noqa: F401  (checks for flwr)
