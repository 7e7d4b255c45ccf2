"""Tests of the data room."""
