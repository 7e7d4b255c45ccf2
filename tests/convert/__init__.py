"""Tests of the convert room."""
