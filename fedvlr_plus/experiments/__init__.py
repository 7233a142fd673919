"""Experiments that produce the tables a user reads: ``fedvlr-plus experiment paper-table``."""
