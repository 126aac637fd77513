"""Shared test set-up: every test, and every notebook kernel nbval starts, runs the CPU profile."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("INFERLAB_PROFILE", "cpu")
# A non-interactive MPLBACKEND (Agg) would reach the Jupyter kernels that nbval and the book
# build start, and the notebooks would then show no figures at all (tests/test_site.py catches
# that). Without a display, matplotlib picks Agg by itself in this process anyway.
os.environ.pop("MPLBACKEND", None)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
