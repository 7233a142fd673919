"""ClientApp: the simulator's RecClient under Flower; private state stays on the SuperNode."""

from fedvlr_plus.flower.node import make_client_app

app = make_client_app()
