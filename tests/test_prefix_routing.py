"""Routing chats across replicas: the simulation's invariants, and what it shows."""

import pytest

from inferlab.analysis.prefix_routing import (ChatWorkload, Replica, batched_steps, priced,
    simulate)
from inferlab.analysis.step_time import StepModel
from inferlab.model.config import model_presets


def test_every_turn_arrives_once_and_in_order_within_its_session():
    w = ChatWorkload(sessions=5, turns=3, seed=1)
    reqs = w.requests()
    assert sorted(reqs) == [(s, t) for s in range(5) for t in range(3)]
    for s in range(5):
        assert [t for (x, t) in reqs if x == s] == [0, 1, 2]


def test_a_replica_hits_only_a_leading_run_and_evicts_the_least_recent():
    r = Replica(capacity=4)
    assert r.serve(["a", "b", "c"]) == 0
    assert r.serve(["a", "b", "x"]) == 2          # a and b, not x
    assert r.serve(["z", "b"]) == 0                # b alone is not a prefix
    assert "c" not in r.cache and len(r.cache) == 4  # c was the least recently used


def test_prefix_aware_routing_hits_more_with_balanced_load():
    w = ChatWorkload()
    rr = simulate(w, 4, 256, "round_robin")
    pa = simulate(w, 4, 256, "prefix_aware")
    assert pa["hit_rate"] > rr["hit_rate"] and pa["prefill_tokens"] < rr["prefill_tokens"]
    assert rr["prompt_tokens"] == pa["prompt_tokens"]
    assert pa["load_imbalance"] < 1.1 and sum(pa["loads"]) == sum(rr["loads"])


def test_without_a_load_bound_everything_follows_the_shared_prompt_to_one_replica():
    w = ChatWorkload()
    greedy = simulate(w, 4, 256, "prefix_aware", balance_slack=10**9)
    assert greedy["load_imbalance"] == 4.0 and sorted(greedy["loads"])[:3] == [0, 0, 0]


def test_an_unknown_router_is_refused():
    with pytest.raises(ValueError, match="router"):
        simulate(ChatWorkload(sessions=2, turns=1), 2, 8, "random")


def _h100_llama3():
    return StepModel.for_device(model_presets()["llama-3-8b"], "H100 SXM")


def test_ttft_is_the_lone_prefill_and_gpu_time_the_batched_steps():
    # one session, two turns, one roomy replica: turn 0 prefills its 8 + 4 blocks of 16 tokens
    # from nothing; turn 1 finds those 192 tokens cached and prefills its 4 new blocks (64)
    w = ChatWorkload(sessions=1, turns=2, system_blocks=8, turn_blocks=4, block_size=16)
    run = simulate(w, 1, 100, "round_robin")
    assert run["requests"] == [(0, 0, 192), (0, 192, 64)]
    m = _h100_llama3()
    out = priced(run, m, usd_per_hour=3.6)
    alone = [m.rows_s([(192, 0)]), m.rows_s([(64, 192)])]
    assert list(out["ttft_s"]) == pytest.approx(alone)
    assert out["gpu_s_alone"] == pytest.approx(sum(alone))
    # a busy engine runs both in one step of 256 tokens: one weight read for the two rows
    assert out["gpu_s"] == pytest.approx(m.rows_s([(192, 0), (64, 192)]))
    assert out["gpu_s"] < out["gpu_s_alone"]
    # $3.60 an hour is $0.001 a second, over 448 prompt tokens
    assert out["usd_per_m_input"] == pytest.approx(1e-3 * out["gpu_s"] / 448 * 1e6)
    assert out["ttft_s"][1] < out["ttft_s"][0]  # the hit made the second turn cheaper


def test_a_busy_replica_packs_uncached_tokens_into_budgeted_steps():
    steps = batched_steps([(0, 300), (100, 50), (0, 700)], token_budget=400)
    assert steps == [[(300, 0), (50, 100), (50, 0)], [(400, 50)], [(250, 450)]]
    assert sum(n for rows in steps for n, _ in rows) == 1050  # every uncached token once
    assert all(sum(n for n, _ in rows) <= 400 for rows in steps)


def test_prefix_aware_routing_is_no_slower_and_no_dearer():
    w = ChatWorkload(block_size=128)
    m = _h100_llama3()
    rr = priced(simulate(w, 4, 256, "round_robin"), m, 6.88)
    pa = priced(simulate(w, 4, 256, "prefix_aware"), m, 6.88)
    assert pa["hit_rate"] >= rr["hit_rate"]
    assert pa["gpu_s"] < rr["gpu_s"] and pa["usd_per_m_input"] < rr["usd_per_m_input"]
    assert pa["ttft_mean_s"] < rr["ttft_mean_s"]
    assert len(rr["ttft_s"]) == w.sessions * w.turns


def test_in_a_batched_engine_short_prompts_save_with_the_tokens_they_skip():
    """Priced one lone forward each, a short prompt costs its weight read whatever its length,
    so hits save little; packed into steps whose weight read the batch shares, the saving
    follows the prefill tokens skipped."""
    w = ChatWorkload(block_size=16)
    m = _h100_llama3()
    runs = {n: simulate(w, 4, 256, n) for n in ("round_robin", "prefix_aware")}
    cost = {n: priced(r, m, 6.88) for n, r in runs.items()}
    skipped = 1 - runs["prefix_aware"]["prefill_tokens"] / runs["round_robin"]["prefill_tokens"]
    batched = 1 - cost["prefix_aware"]["gpu_s"] / cost["round_robin"]["gpu_s"]
    alone = 1 - cost["prefix_aware"]["gpu_s_alone"] / cost["round_robin"]["gpu_s_alone"]
    assert batched == pytest.approx(skipped, abs=0.05)
    assert alone < 0.2 * batched
