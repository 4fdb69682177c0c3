"""Peer transfer: the registry of which runners serve what, the runner's server, reads
from a peer or the store, and the broadcast window that shapes a batch's tree."""
