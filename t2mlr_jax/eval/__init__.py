"""Task metrics and evaluation loops (computed with the exact recurrence)."""
