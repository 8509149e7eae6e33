"""Tests of the test doubles and the probe against them (no GPU needed)."""
