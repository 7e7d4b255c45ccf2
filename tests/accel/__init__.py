"""Tests of the accel room: compiling for TPU/GPU, multi-process."""
