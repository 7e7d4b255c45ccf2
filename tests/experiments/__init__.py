"""Tests of the scripts under experiments/."""
