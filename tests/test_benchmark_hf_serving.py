"""The serving comparison against transformers' continuous batching: its workload and its
agreement count everywhere; the run itself only where transformers is installed (it is no
requirement of the course)."""

import sys

import pytest

from inferlab.benchmarks import hf_serving


def test_the_workload_is_seeded_and_every_request_asks_for_the_same_output():
    a = hf_serving.workload(512, 8, 4, 12, output=5, seed=1)
    b = hf_serving.workload(512, 8, 4, 12, output=5, seed=1)
    assert [r.prompt for r in a] == [r.prompt for r in b]
    assert all(4 <= len(r.prompt) <= 12 and r.max_new_tokens == 5 for r in a)
    assert all(0 < t < 512 for r in a for t in r.prompt) and not any(r.eos_token_ids for r in a)
    assert [r.prompt for r in hf_serving.workload(512, 8, 4, 12, 5, seed=2)] != \
        [r.prompt for r in a]


def test_agreement_counts_identical_outputs_and_finds_the_first_difference():
    same = hf_serving.agreement([[1, 2], [3, 4]], [[1, 2], [3, 4]])
    assert same == {"identical": 2, "requests": 2, "first_difference": None}
    diff = hf_serving.agreement([[1, 2], [3, 4, 5]], [[1, 2], [3, 9, 5]])
    assert diff["identical"] == 1 and diff["first_difference"] == (1, 1)


def test_it_needs_transformers_and_says_so(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now fails
    assert hf_serving.main(["--model", "tiny"]) == 0
    assert "pip install transformers" in capsys.readouterr().out


def test_both_engines_give_the_same_greedy_tokens_when_transformers_is_installed():
    pytest.importorskip("transformers")
    from conftest import tiny_model

    model = tiny_model(128, dtype="float32")
    requests = hf_serving.workload(model.config.vocab_size, 6, 8, 40, output=6)
    pair = hf_serving.Pair(model, requests, max_batch=4, token_budget=64)
    result = hf_serving.compare(pair, rounds=1)
    assert result["identical"] == 6 and result["output_tokens"] == 36
