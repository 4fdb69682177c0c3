"""kinetic 0.0.4's content hash of a tree: the walk, the one-pass hash, the per-machine
stat cache (its file format, and the optional C comparison ``_lstatcmp.c``).  Uses
errors only.
"""
