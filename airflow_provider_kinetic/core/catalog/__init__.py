"""What can be scheduled: the accelerator table, the ``accelerator=`` parser (wire-compatible
with kinetic 0.0.4), capacity kinds and the GKE facts behind them."""
