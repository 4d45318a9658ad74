"""Benchmarks of accel-agent (``make bench``); results go to BENCHMARKS.md.

Speed is measured here, never asserted in tests.
"""
