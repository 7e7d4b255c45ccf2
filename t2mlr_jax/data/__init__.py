"""Synthetic-task data generators (pure numpy; never imports the model)."""
