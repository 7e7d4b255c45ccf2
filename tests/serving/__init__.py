"""Tests of the serving room."""
