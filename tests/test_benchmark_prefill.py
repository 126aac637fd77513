"""The side-by-side benchmark against transformers: runs where transformers is installed, and
says politely that it needs it where it is not (transformers is no requirement of the course)."""

import sys

import pytest

from inferlab.benchmarks import prefill


def test_it_needs_transformers_and_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now fails
    assert prefill.main(["--model", "tiny"]) == 0
    assert "pip install transformers" in capsys.readouterr().out


def test_same_weights_same_logits_and_timed_when_transformers_is_installed(capsys):
    pytest.importorskip("transformers")
    assert prefill.main(["--model", "tiny", "--prompts", "16", "--min-run-time", "0.01",
                         "--rounds", "1"]) == 0  # compare() checks the logits agree first
    out = capsys.readouterr().out
    assert "prompt    16: prefill" in out and "decode" in out
