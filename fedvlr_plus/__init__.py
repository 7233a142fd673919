"""fedvlr-plus: personalised multimodal fusion for federated recommenders."""
__version__ = "0.1.0"
