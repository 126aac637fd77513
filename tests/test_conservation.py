"""A simulated cluster conserves work: properties over random clusters and traces (hypothesis).

Whatever the cluster (colocated instances or prefill and decode pools, either router, any token
budget, memory tight enough to force preemption, a decode instance failing and resuming its
requests by recomputing or by re-sending their prompts' caches), summed over its instances:

- the forwards compute every token whose K/V a request stores exactly once: its prompt once and
  one row per output token fed back, ``longest_tokens(P, O) = P + O - 1``;
- every token computed again was forced: dropped by a preemption, or lost with the failed
  instance and not brought back by the resume; the runners' count equals that exactly;
- no row starts past the K/V computed so far, a prefill instance never decodes (unless it
  recomputes a resumed request), and a decode instance never runs prompt work unless a
  preemption or the failure forced it;
- every byte moved is ``kv_bytes_per_token`` times a token moved, and each token moved was
  computed where it left; without a failure each request's prompt moves once;
- every request completes with all its tokens, each stamped once.

The counts are the runners' (``inferlab.sim.work``), row by row, never the simulator's own
bookkeeping. Before commit 262e119 these properties failed on the first disaggregated example:
the decode instance computed every transferred prompt again, unforced.
"""

import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferlab.analysis import formulas
from inferlab.serving.config import ServingConfig
from inferlab.serving.request import Request, longest_tokens
from inferlab.sim.disaggregation import Cluster, Failure, simulate_cluster
from inferlab.sim.simulator import FittedCosts, simulate
from inferlab.sim.work import Work

# Cheap, deterministic step costs (seconds): a fixed part and a part per token, context, pair.
COSTS = FittedCosts(prefill=(1e-3, 2e-5, 0.0), decode=(1e-3, 1e-5, 1e-7),
                    mixed=(1e-3, 2e-5, 1e-9, 1e-7))


@st.composite
def traces(draw, max_prompt=60, max_new=24):
    n = draw(st.integers(1, 16), label="requests")
    t, out = 0.0, []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 0.0, 0.001, 0.01, 0.05]), label="gap")
        p = draw(st.integers(1, max_prompt), label="prompt")
        o = draw(st.integers(1, max_new), label="new")
        out.append(Request((0,) * p, o, t, f"r{i}"))
    return out


@st.composite
def clusters(draw, requests):
    """A cluster whose every instance can hold the trace's longest request, memory often tight
    enough to preempt, and (for a disaggregated one) perhaps a failing decode instance."""
    block_size = draw(st.sampled_from([1, 4, 16]), label="block_size")
    longest = max(longest_tokens(len(r.prompt), r.max_new_tokens) for r in requests)
    need = -(-longest // block_size)
    blocks = lambda: draw(st.integers(need, 3 * need), label="num_blocks")  # noqa: E731
    batch = lambda: draw(st.integers(1, 8), label="max_batch")  # noqa: E731
    config = lambda **kw: ServingConfig(block_size=block_size, num_blocks=blocks(),  # noqa
                                        max_batch=batch(), **kw)
    if draw(st.booleans(), label="colocated"):
        policy = draw(st.sampled_from(["continuous", "chunked", "static"]), label="policy")
        budget = draw(st.sampled_from([8, 32, 256]), label="budget") \
            if policy == "chunked" else None
        cluster = Cluster(COSTS, colocated=draw(st.integers(1, 3), label="instances"),
                          colocated_config=config(policy=policy, token_budget=budget),
                          router=draw(st.sampled_from(["least_loaded", "round_robin"])))
        return cluster, None
    p, d = draw(st.integers(1, 2), label="prefill"), draw(st.integers(1, 3), label="decode")
    cluster = Cluster(
        COSTS, prefill=p, decode=d,
        prefill_config=config(policy="chunked",
                              token_budget=draw(st.sampled_from([16, 64, 4096]))),
        decode_config=config(policy="chunked", token_budget=draw(st.sampled_from([8, 16, 256]))),
        kv_bytes_per_token=draw(st.sampled_from([1.0, 2048.0, 819200.0]), label="kv_bytes"),
        link_bandwidth=draw(st.sampled_from([1e6, 1e9, math.inf]), label="link"),
        router=draw(st.sampled_from(["least_loaded", "round_robin"]), label="router"))
    failure = None
    if draw(st.integers(0, 2), label="failure") > 0:  # two in three: a failure
        downs = [0.01, 0.2] + ([math.inf] if d >= 2 else [])
        failure = Failure(draw(st.integers(0, d - 1), label="failed"),
                          draw(st.sampled_from([r.arrival_s for r in requests]), label="near")
                          + draw(st.sampled_from([0.002, 0.005, 0.02]), label="after"),
                          draw(st.sampled_from(["recompute", "retransfer"]), label="mode"),
                          draw(st.sampled_from(downs), label="down_s"))
    return cluster, failure


def check_conservation(requests, out):
    """The properties of the module docstring, on one ``ClusterRun``."""
    work = out.instances
    # every request completes with its tokens, each stamped once
    for r, result in zip(requests, out.run.results):
        assert len(result.tokens) == r.max_new_tokens == result.timing.n_tokens
    # each stored token computed once, and only K/V that exist are read
    baseline = sum(longest_tokens(len(r.prompt), r.max_new_tokens) for r in requests)
    assert sum(w.first_time_tokens for w in work) == baseline
    assert all(w.skipped_tokens == 0 for w in work), [w.as_dict() for w in work]
    # every recompute forced, and exactly as many as forced
    assert out.recomputed_tokens == out.forced_recompute, [w.as_dict() for w in work]
    forced = any(w.preemptions for w in work) or out.lost
    assert out.recomputed_tokens == 0 or forced
    # roles: a prefill instance decodes nothing (a resumed request's recomputation may end in
    # a one-token row); a decode instance runs prompt work only when a preemption there or the
    # failure forced it
    if not out.lost:
        assert all(w.decode_rows == 0 for w in out.work("prefill"))
    for w in out.work("decode"):
        if not (w.preemptions or out.lost):
            assert w.prompt_tokens == 0 and w.recomputed_tokens == 0, w.as_dict()
    # bytes follow tokens; what leaves one instance reaches another
    kv = out.cluster.kv_bytes_per_token
    for w in work:
        assert w.bytes_out == pytest.approx(kv * w.tokens_out)
    assert out.tokens_moved == sum(w.tokens_in for w in work)
    assert out.transfer_bytes == pytest.approx(sum(w.bytes_in for w in work))
    if out.cluster.decode and not out.lost:  # each prompt moves once, after its prefill
        handed = [r for r in requests if r.max_new_tokens > 1]
        assert out.transfers == len(handed)
        assert out.tokens_moved == sum(len(r.prompt) for r in handed)
    if not out.cluster.decode:
        assert out.transfers == 0 and out.transfer_bytes == 0


@given(st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_cluster_computes_each_token_once_unless_a_counted_event_forces_it(data):
    requests = data.draw(traces(), label="trace")
    cluster, failure = data.draw(clusters(requests), label="cluster")
    try:
        out = simulate_cluster(requests, cluster, failure)
    except ValueError as e:  # a failure the cluster cannot survive is refused up front
        assert "another one" in str(e)
        return
    event("disaggregated" if cluster.decode else "colocated")
    event(f"failure: {failure.mode}" if failure and out.lost else "no requests lost")
    event("preempted" if any(w.preemptions for w in out.instances) else "no preemption")
    check_conservation(requests, out)


@given(traces(), st.sampled_from(["continuous", "chunked", "static"]), st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_one_simulated_engine_recomputes_exactly_what_its_preemptions_dropped(requests, policy,
                                                                             slack):
    longest = max(longest_tokens(len(r.prompt), r.max_new_tokens) for r in requests)
    config = ServingConfig(block_size=4, num_blocks=slack * -(-longest // 4), max_batch=4,
                           policy=policy, token_budget=16 if policy == "chunked" else None)
    work = Work()
    simulate(requests, COSTS, config, work)
    assert work.first_time_tokens == sum(longest_tokens(len(r.prompt), r.max_new_tokens)
                                         for r in requests)
    assert work.recomputed_tokens == work.dropped_tokens and work.skipped_tokens == 0
    event("preempted" if work.preemptions else "no preemption")


# -- the case, by hand: counts a reader can check ----------------------------------------
def test_six_documents_on_1p1d_decode_only_their_outputs():
    """Issue 33's repro: six 3,000-token prompts two seconds apart, 16 tokens each, Llama-2-13B
    on a 1P1D pair of A100s. The prefill instance computes the 18,000 prompt tokens, 18,000
    tokens' K/V cross the link once, and the decode instance computes the 15 fed-back output
    rows of each request and nothing else (before 262e119 it computed 18,090 tokens)."""
    from inferlab.sim import cluster_study

    ex = cluster_study.handoff()
    prefill, decode = ex["work"]["prefill 0"], ex["work"]["decode 0"]
    assert prefill["prompt_tokens"] == 6 * 3000 and prefill["decode_rows"] == 0
    assert decode["prompt_tokens"] == 0 and decode["decode_rows"] == 6 * 15
    assert decode["recomputed_tokens"] == prefill["recomputed_tokens"] == 0
    assert prefill["transfers_out"] == decode["transfers_in"] == 6
    assert decode["tokens_in"] == 18000
    assert decode["bytes_in"] == 18000 * formulas.kv_bytes_per_token(cluster_study.model())


def test_the_properties_catch_a_decode_instance_that_recomputes_what_it_received(monkeypatch):
    """The check can fail: a transfer that hands over the cache but not the count of tokens it
    holds (the bug before 262e119, planted here in the simulator) makes the decode instance
    prefill every prompt again, unforced."""
    from inferlab.serving.request import Sequence
    from inferlab.sim import disaggregation

    real = disaggregation.Sequence

    def forgetful(*args, num_computed=0, **kw):
        return real(*args, **kw)  # the K/V arrive, the count of them does not

    monkeypatch.setattr(disaggregation, "Sequence", forgetful)
    requests = [Request((0,) * 40, 5, 0.01 * i) for i in range(4)]
    cluster = Cluster(COSTS, prefill=1, decode=1,
                      prefill_config=ServingConfig(num_blocks=64, policy="chunked",
                                                   token_budget=64),
                      decode_config=ServingConfig(num_blocks=64, policy="chunked",
                                                  token_budget=64),
                      kv_bytes_per_token=1.0)
    out = simulate_cluster(requests, cluster)
    assert out.recomputed_tokens == 4 * 40 and out.forced_recompute == 0
    with pytest.raises(AssertionError):
        check_conservation(requests, out)
    assert Sequence is real
