"""Tests of the train room."""
