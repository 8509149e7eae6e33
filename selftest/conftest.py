"""Shared fixtures of the selftests."""

from __future__ import annotations

from pathlib import Path

import pytest

from selftest.fakenvml import build_library


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """The fake libnvidia-ml.so.1, built once into selftest/.cache (git-ignored)."""
    return build_library(Path(__file__).resolve().parent / ".cache")
