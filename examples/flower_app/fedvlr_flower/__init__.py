"""A Flower App whose ServerApp and ClientApp come from fedvlr_plus.flower.app."""
