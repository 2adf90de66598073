"""Fake backend plugins used by accel's discovery and conformance tests."""
