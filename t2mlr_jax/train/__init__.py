"""Training: experiment config, optimizer, train step, tasks, metrics, the loop."""
