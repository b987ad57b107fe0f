"""Training: the loop shared by both engines, the engine adapters, plots and DDP."""
