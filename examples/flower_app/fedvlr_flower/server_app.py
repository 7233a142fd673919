"""ServerApp: our aggregation strategies and validation-based selection (fedvlr_plus.flower.app)."""

from fedvlr_plus.flower.app import make_server_app

app = make_server_app()
