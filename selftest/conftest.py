"""Shared fixtures of the selftests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from selftest import suite
from selftest.fakenvml import build_library


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tell run_suite which test is running, before any fixture of it is set up."""
    suite.CURRENT[0] = item


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """The fake libnvidia-ml.so.1, built once into selftest/.cache (git-ignored)."""
    return build_library(Path(__file__).resolve().parent / ".cache")


@pytest.fixture
def bare_python(tmp_path: Path) -> str:
    """An interpreter with no site-packages: like a GPU node without nvidia-ml-py."""
    wrapper = tmp_path / "bare-python3"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


_FUZZ_CASES: list[int] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Collect the fuzz tests' case counts (they travel back from xdist workers too)."""
    if report.when == "call":
        _FUZZ_CASES.extend(int(v) for k, v in report.user_properties if k == "fuzz_cases")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _FUZZ_CASES:
        terminalreporter.write_line(
            f"fuzz: {sum(_FUZZ_CASES)} cases in {len(_FUZZ_CASES)} fuzz tests "
            "(GPUHEALTH_FUZZ_EXAMPLES per target; make fuzz for a longer campaign)"
        )
