"""Routing chats across replicas: the simulation's invariants, and what it shows."""

import pytest

from inferlab.analysis.prefix_routing import ChatWorkload, Replica, simulate


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
