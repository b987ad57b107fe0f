"""One place builds a model for inference, in either engine (load), and looks inside it."""
