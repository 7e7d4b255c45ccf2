"""Tests of the model room: layers, modes, schedules, recurrence types, decoding."""
