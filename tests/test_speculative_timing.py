"""Chapter 6's measurement helpers and its recorded benchmark run, at small sizes."""

import json

import pytest
import torch

from inferlab.analysis import speculation
from inferlab.analysis.speculative_timing import (acceptance, best_of, held_out_prompts,
    load_pair, step_costs, wall_clock)
from inferlab.data import data_path
from inferlab.model.speculative import ModelDrafter, PromptLookup


@pytest.fixture(scope="module")
def pair():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_pair()
    torch.set_num_threads(before)


def test_best_of_keeps_each_functions_fastest_run():
    calls = []
    best = best_of({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=2,
                   min_run_time=0.02)
    assert set(best) == {"a", "b"} and all(0 < t < 0.01 for t in best.values())
    assert calls.index("b") < len(calls) - calls[::-1].index("a")  # interleaved, not a a a b b b


def test_prompts_come_from_held_out_text(pair):
    _, _, tok = pair
    prompts = held_out_prompts(tok, 2, 16)
    assert len(prompts) == 2 and all(len(p) == 16 for p in prompts)


def test_acceptance_checks_outputs_and_merges_stats(pair):
    target, draft, tok = pair
    prompts = held_out_prompts(tok, 2, 16, split="validation")
    stats = acceptance(target, lambda: ModelDrafter(draft), prompts, (2,), 12)
    assert stats[2].emitted == 2 * 12
    wrong = [[0] * 28, [0] * 28]
    with pytest.raises(AssertionError, match="differs from plain greedy"):
        acceptance(target, PromptLookup, prompts, (2,), 12, check_against=wrong)


def test_costs_and_wall_clock_return_ratios(pair):
    target, draft, tok = pair
    costs = step_costs(target, draft, (1, 3), context=16, min_run_time=0.05, rounds=1)
    assert 0 < costs["c"] < 2 and all(v > 0 for v in costs["verify_cost"].values())
    prompts = held_out_prompts(tok, 1, 16)
    speed = wall_clock(target, PromptLookup, prompts, (2,), 8, rounds=1, min_run_time=0.05)
    assert speed["plain_s"] == min(speed["generate_s"], speed["loop_k0_s"])
    assert speed["speedup"][2] == pytest.approx(speed["plain_s"] / speed["spec_s"][2])


def test_the_recorded_run_meets_the_formula_bar_and_is_self_consistent():
    path = data_path("hardware.csv").parent / "measurements" / "speculative_cpu.json"
    record = json.loads(path.read_text())
    assert record["benchmark"] == "speculative" and record["device"] == "cpu"
    for row in record["results"] + record["sampled"]:
        assert row["formula"] == pytest.approx(
            speculation.expected_tokens(row["acceptance"], row["k"]), rel=1e-9)
        assert abs(row["tokens_per_verification"] / row["formula"] - 1) <= 0.10
    costs = record["costs"]
    for row in record["results"]:
        assert row["predicted_speedup"] == pytest.approx(speculation.speedup(
            row["acceptance"], row["k"], costs["c"], costs["verify_cost"][str(row["k"])]))
