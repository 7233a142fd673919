"""ServerApp: our aggregation strategies and validation-based selection (fedvlr_plus.federation.flower)."""
from fedvlr_plus.federation.flower import make_server_app

app = make_server_app()
