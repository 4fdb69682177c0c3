"""Tensors and state dicts as keys, and their broadcast from one rank to the others."""
