"""The model: layers, the recurrence, the stacked transformer, execution modes, decoding."""
