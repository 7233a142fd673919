"""Attacks used by the robustness experiments: poisoned clients and item-promotion uploads."""
