"""Shared test set-up: every test, and every notebook kernel nbval starts, runs the CPU profile."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("INFERLAB_PROFILE", "cpu")
os.environ.setdefault("MPLBACKEND", "Agg")

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
