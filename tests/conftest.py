"""Shared test set-up: every test, and every notebook kernel nbval starts, runs the CPU profile."""

import os
from pathlib import Path

import pytest

os.environ.setdefault("INFERLAB_PROFILE", "cpu")
# The fused paged-attention kernel (inferlab/serving/paged_triton.py) runs here under Triton's
# interpreter, on CPU tensors, so its correctness tests run on every machine. Triton reads this
# when the kernel is defined, so it is set before anything imports inferlab. Nothing else
# changes: the paged cache picks the kernel by default only on a GPU.
os.environ.setdefault("TRITON_INTERPRET", "1")
# A non-interactive MPLBACKEND (Agg) would reach the Jupyter kernels that nbval and the book
# build start, and the notebooks would then show no figures at all (tests/test_site.py catches
# that). Without a display, matplotlib picks Agg by itself in this process anyway.
os.environ.pop("MPLBACKEND", None)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for the test (restored after). Small forward passes on a shared
    2-core machine are faster and steadier on one thread, and with a server's engine thread
    running beside the test, OpenMP's spinning threads can slow either side many times over.
    A module uses it with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def strict_checks():
    """The tests call the labs' checks as the grader does: a wrong answer raises CheckFailed
    (a notebook instead reports it and lends the reference; tests of that leave strict mode)."""
    from inferlab.course import checks

    with checks.strict():
        yield
