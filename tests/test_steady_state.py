"""Steady-state simulation (inferlab.sim.steady_state) and Chapter 4's stored sweep.

A server whose every decode step takes 10 ms, with no prefill cost, batches of at most four and
ten output tokens per request can finish at most 4 / (10 x 10 ms) = 40 requests a second: the
tests check the machinery against that arithmetic. The stored sweep is checked against the
tables it was computed from and against recomputation.
"""

import functools
import json
import math

import pytest

from inferlab.serving.config import ServingConfig
from inferlab.serving.metrics import SLO, Percentiles
from inferlab.sim import records
from inferlab.sim import steady_state as ss
from inferlab.sim import sweeps
from inferlab.sim.simulator import simulate


class Fixed:
    """Every decode step 10 ms, prefills free: capacity = max_batch / (output x 10 ms)."""

    def prefill_s(self, n_tokens):
        return 0.0

    def decode_s(self, batch, context_tokens):
        return 0.01


WORK = ss.Workload.fixed(8, 10)
CONFIG = ServingConfig(num_blocks=64, max_batch=4)
CAPACITY = 4 / (10 * 0.01)  # requests per second
SERVE = ss.simulated(Fixed(), CONFIG)


def test_a_longer_trace_extends_a_shorter_one_and_rates_rescale_time():
    short, long = WORK.requests(50, 5.0, seed=3), WORK.requests(200, 5.0, seed=3)
    assert [(r.arrival_s, len(r.prompt), r.max_new_tokens) for r in short] == \
        [(r.arrival_s, len(r.prompt), r.max_new_tokens) for r in long[:50]]
    fast = WORK.requests(50, 10.0, seed=3)
    assert all(math.isclose(a.arrival_s, 2 * b.arrival_s) for a, b in zip(short, fast))
    sharegpt = ss.Workload.sharegpt()
    a, b = sharegpt.requests(100, 1.0, seed=1), sharegpt.requests(400, 1.0, seed=1)
    assert [len(r.prompt) for r in a] == [len(r.prompt) for r in b[:100]]


def test_below_capacity_the_server_keeps_up_and_the_window_adds_up():
    w = ss.measure(WORK.requests(2000, 0.5 * CAPACITY), SERVE, SLO(1.0, 0.05))
    assert w.window_requests == pytest.approx(0.7 * 2000, rel=0.1)  # 20% warm-up, 10% drain
    assert w.achieved_out_tok_s == pytest.approx(w.offered_out_tok_s, rel=0.03)
    assert w.offered_out_tok_s == pytest.approx(10 * w.offered_req_s)
    assert w.achieved_in_tok_s == pytest.approx(w.offered_in_tok_s, rel=0.03)
    assert not w.saturated and w.slo_attainment == 1.0
    assert w.prefill_s == 0.0 and 0 < w.decode_s <= w.duration_s
    assert 1 <= w.mean_batch <= 4
    # one token per 10 ms step, and one step of waiting between the prefill and the first
    # decode: (20 + 8 x 10) ms / 9 gaps
    assert w.tpot.p50 == pytest.approx(0.1 / 9)


def test_a_stable_rate_converges_and_an_excessive_one_is_called_overloaded():
    stable = ss.steady_state(WORK, 0.5 * CAPACITY, SERVE, n0=400, n_max=6400)
    assert stable.status == ss.STABLE
    sizes = [w.n_requests for w in stable.history]
    assert sizes == [400 * 2**i for i in range(len(sizes))] and sizes[-2] >= 800
    over = ss.steady_state(WORK, 2 * CAPACITY, SERVE, n0=400, n_max=6400)
    assert over.status == ss.OVERLOADED
    assert over.window.achieved_req_s == pytest.approx(CAPACITY, rel=0.05)
    # the signature of an overload: the tail grows with the trace
    assert over.history[-1].latency.p99 > 1.5 * over.history[-2].latency.p99


def test_a_warm_up_shortfall_that_wears_down_is_not_an_overload():
    p = Percentiles(1.0, 1.0, 1.0, 1.0)
    def window(n, offered, achieved, p99, ttft=0.1):
        return ss.Window(n, n, 1.0, 1.0, 1.0, offered, 1.0, 1.0, achieved,
                         Percentiles(ttft, ttft, ttft, ttft), p, p,
                         Percentiles(1.0, 1.0, 1.0, p99), math.nan, math.nan, 1.0, 0.0, 1.0, 0)
    c = ss.Criterion()
    ramp = (window(800, 100, 90, 2.0), window(1600, 100, 95.5, 2.5))  # shortfall 10% -> 4.5%
    assert not c.overloaded(*ramp)
    # a shortfall that shrinks by a fifth is a warm-up still wearing off, even with the tail
    # and the wait growing (the old rule, 3/4 of the shortfall kept, called it an overload)
    filling = (window(800, 100, 90, 2.0, 0.1), window(1600, 100, 92, 4.0, 0.3))
    assert not c.overloaded(*filling)
    behind = (window(800, 100, 70, 2.0, 0.1), window(1600, 100, 70, 4.0, 0.3))
    assert c.overloaded(*behind)
    # the same shortfall and tail without a growing wait for the first token: no queue
    assert not c.overloaded(window(800, 100, 70, 2.0), window(1600, 100, 70, 4.0))
    assert not c.overloaded(window(400, 100, 70, 2.0, 0.1),
                            window(800, 100, 70, 4.0, 0.3))  # too short
    same = (window(800, 100, 99, 2.0), window(1600, 120, 119, 2.1))
    assert c.agree(*same)  # the offered load moved; the server followed it
    # everything else agrees but the first token waits twice as long: a queue building up
    assert not c.agree(window(800, 100, 99, 2.0, 0.1), window(1600, 100, 99, 2.0, 0.2))



def test_a_wait_for_the_second_token_is_a_queue_only_in_a_split():
    """The gap from first to second token, less one step, may not grow in a split (a queue in
    front of the decode pool); in one engine the step that gives the second token grows with the
    batch, and a growing gap with a flat wait for the first token is no queue."""
    p = Percentiles(1.0, 1.0, 1.0, 1.0)
    def window(n, gap_s, split):
        return ss.Window(n, n, 1.0, 1.0, 1.0, 100, 1.0, 1.0, 99, Percentiles(0.1, 0.1, 0.1, 0.1),
                         Percentiles(0.010, 0.010, 0.010, 0.010),
                         Percentiles(gap_s, gap_s, gap_s, gap_s), p, math.nan, math.nan, 1.0,
                         0.0, 1.0, 0, split)
    c = ss.Criterion()
    for split in (True, False):
        steady = (window(800, 0.0102, split), window(1600, 0.0104, split))  # within 5% of it
        assert not c.queue_growing(*steady) and c.agree(*steady)
    grew = lambda split: (window(800, 0.0102, split), window(1600, 0.0175, split))  # noqa: E731
    assert c.queue_growing(*grew(True)) and not c.agree(*grew(True))
    assert not c.queue_growing(*grew(False)) and c.agree(*grew(False))
    # one split window and one colocated are not a split's pair
    assert not c.queue_growing(window(800, 0.0102, True), window(1600, 0.0175, False))

@functools.lru_cache(maxsize=None)
def usual_capacity() -> ss.SLOCapacity:
    """The search at SLO_FIXED with the usual criterion (two tests read it; it takes a while)."""
    return ss.capacity_at_slo(WORK, SERVE, SLO(ttft_s=0.5, tpot_s=0.05),
                              0.5 * ss.saturation_estimate(WORK, Fixed(), CONFIG), target=0.9,
                              n0=200, n_max=1600)


def test_capacity_under_an_slo_sits_below_saturation():
    cap = usual_capacity()
    assert 0.5 * CAPACITY < cap.rate < CAPACITY
    assert cap.verdict(cap.state) == ss.MEETS and cap.window.slo_attainment >= 0.9
    failed = [p for p in cap.probes if p.rate > cap.rate]
    assert failed and all(cap.verdict(p) != ss.MEETS for p in failed)
    assert ss.saturation_estimate(WORK, Fixed(), CONFIG) == pytest.approx(CAPACITY)


# A criterion that never lets two lengths agree (the median would have to repeat exactly): every
# probe ends unsettled, as a high-rate probe does when its median moves by sampling noise.
NEVER = ss.Criterion(p50_rtol=0.0)
SLO_FIXED = SLO(ttft_s=0.5, tpot_s=0.05)


def test_an_unsettled_rate_that_meets_the_slo_counts_as_meeting():
    state = ss.steady_state(WORK, 0.5 * CAPACITY, SERVE, SLO_FIXED, n0=400, n_max=3200,
                            criterion=NEVER)
    assert state.status == ss.UNSETTLED
    assert all(w.slo_attainment == 1.0 for w in state.history)
    assert ss.verdict(state, 0.9, NEVER) == ss.MEETS


def test_a_slowly_overloaded_rate_does_not_meet_the_slo():
    """5% above what the server can finish: it keeps up within the 5% of ``saturated`` and the
    median never settles, but the queue grows with the trace and the SLO is lost."""
    state = ss.steady_state(WORK, 1.05 * CAPACITY, SERVE, SLO_FIXED, n0=400, n_max=3200,
                            criterion=NEVER)
    assert state.status != ss.STABLE
    assert ss.verdict(state, 0.9, NEVER) == ss.MISSES
    assert ss.misled(state, 0.9, NEVER) == "over"   # 400 requests alone all met the SLO


def test_the_search_is_not_held_down_by_a_trace_that_never_settles():
    """The same answer whichever criterion: the SLO, not the settling, sets it; every rate above
    the answer that was tried misses or stayed undecided after its trace was grown."""
    start = 0.5 * CAPACITY
    usual = usual_capacity()
    strict = ss.capacity_at_slo(WORK, SERVE, SLO_FIXED, start, n0=200, n_max=1600,
                                criterion=NEVER)
    assert strict.criterion == NEVER and strict.target == 0.9
    assert strict.rate > 0.5 * CAPACITY
    assert strict.rate == pytest.approx(usual.rate, rel=0.1)
    assert strict.verdict(strict.state) == ss.MEETS
    for p in strict.probes:
        if strict.verdict(p) == ss.UNDECIDED:   # grown twice past n_max before giving up
            assert p.window.n_requests == 4 * 1600
        if p.rate > strict.rate:
            assert strict.verdict(p) != ss.MEETS


def _window(n, attainment, achieved=100.0, p99=2.0, offered=100.0, ttft=0.1):
    p = Percentiles(1.0, 1.0, 1.0, 1.0)
    return ss.Window(n, n, 1.0, 1.0, 1.0, offered, 1.0, 1.0, achieved,
                     Percentiles(ttft, ttft, ttft, ttft), p, p,
                     Percentiles(1.0, 1.0, 1.0, p99), attainment, math.nan, 1.0, 0.0, 1.0, 0)


@pytest.mark.parametrize("status, windows, expected", [
    # established: the longest window decides
    (ss.STABLE, [(400, 1.0), (800, 0.95), (1600, 0.94)], ss.MEETS),
    (ss.STABLE, [(400, 1.0), (800, 0.89), (1600, 0.88)], ss.MISSES),
    (ss.OVERLOADED, [(400, 1.0), (800, 0.95, 60), (1600, 0.93, 55, 4.0)], ss.MISSES),
    # not established: met at both longest lengths, carrying the load, tail steady
    (ss.UNSETTLED, [(400, 1.0, 85), (800, 0.96, 97), (1600, 0.955, 101, 2.1)], ss.MEETS),
    # met at both, but the attainment falling, or the first token's wait growing: a queue
    # building up that a longer trace would show (Chapter 7's short 1P3D: 0.993, 0.973, 0.905)
    (ss.UNSETTLED, [(400, 1.0), (800, 0.993), (1600, 0.973)], ss.UNDECIDED),
    (ss.UNSETTLED, [(400, 1.0), (800, 0.95), (1600, 0.95, 100, 2.0, 100, 0.2)], ss.UNDECIDED),
    # missed at both: a longer trace only adds queueing
    (ss.UNSETTLED, [(400, 1.0), (800, 0.85), (1600, 0.88)], ss.MISSES),
    # crossing the target, a growing tail, or a shortfall: cannot tell
    (ss.UNSETTLED, [(400, 1.0), (800, 0.95), (1600, 0.85)], ss.UNDECIDED),
    (ss.UNSETTLED, [(400, 1.0), (800, 0.95), (1600, 0.92, 100, 2.5)], ss.UNDECIDED),
    (ss.UNSETTLED, [(400, 1.0), (800, 0.95), (1600, 0.95, 96)], ss.UNDECIDED),
    # too short to say anything
    (ss.UNSETTLED, [(400, 1.0), (600, 1.0)], ss.UNDECIDED),
])
def test_a_verdict_reads_the_mechanism_not_the_settling(status, windows, expected):
    state = ss.SteadyState(1.0, status, tuple(_window(*w) for w in windows))
    assert ss.verdict(state, 0.9) == expected


def test_a_short_trace_misled_only_where_a_longer_one_changed_the_verdict():
    flattered = ss.SteadyState(1.0, ss.UNSETTLED, (_window(400, 1.0), _window(800, 0.85),
                                                   _window(1600, 0.8)))
    assert ss.misled(flattered, 0.9) == "over"
    unsettled_but_fine = ss.SteadyState(1.0, ss.UNSETTLED, (_window(400, 1.0), _window(800, 1.0),
                                                            _window(1600, 1.0)))
    assert ss.verdict(unsettled_but_fine, 0.9) == ss.MEETS
    assert ss.misled(unsettled_but_fine, 0.9) is None
    undecided = ss.SteadyState(1.0, ss.UNSETTLED, (_window(400, 1.0), _window(800, 0.95),
                                                   _window(1600, 0.85)))
    assert ss.misled(undecided, 0.9) is None
    warming = ss.SteadyState(1.0, ss.STABLE, (_window(400, 1.0, 90), _window(800, 0.95),
                                              _window(1600, 0.95)))
    assert ss.misled(warming, 0.9) == "under"   # the shortest trace was still filling up


def test_results_survive_json():
    state = ss.steady_state(WORK, 0.5 * CAPACITY, SERVE, SLO(1.0, 0.05), n0=400,
                            n_max=1600)
    back = records.state_from_dict(json.loads(json.dumps(records.state_to_dict(state))))
    assert back == state
    cap = ss.SLOCapacity(state.rate, state, (state,), 0.8, NEVER)
    again = records.capacity_from_dict(json.loads(json.dumps(records.capacity_to_dict(cap))))
    assert again == cap


# --- Chapter 4's stored sweep ------------------------------------------------------------------

@pytest.fixture(scope="module")
def stored():
    return sweeps.load()


def test_the_stored_sweep_was_computed_from_todays_tables(stored):
    assert stored.inputs == json.loads(json.dumps(stored.setup.inputs())), \
        "the tables changed since the sweep was stored: run python -m inferlab.sim.sweeps --write"
    assert stored.provenance["date"] and stored.provenance["command"]


def test_the_stored_sweep_used_todays_settings():
    """The setup as stored, not as loaded: loading fills a field the criterion gained since
    with its default, which would pass a sweep computed under another rule."""
    from dataclasses import asdict

    raw = json.loads(sweeps.path().read_text(encoding="utf-8"))["setup"]
    assert raw == json.loads(json.dumps(asdict(sweeps.SweepSetup()))), \
        "the sweep's settings or the steady-state criterion changed: run " \
        "python -m inferlab.sim.sweeps --write"


def test_recomputing_stored_points_gives_the_stored_numbers(stored):
    """The shortest trace of the highest rate, for each policy (the cheapest to recompute)."""
    s = stored.setup
    for policy, states in stored.states.items():
        state = states[-1]
        first = state.history[0]
        again = ss.measure(s.workload().requests(first.n_requests, state.rate, s.seed),
                           s.serve(policy), s.slo, s.warmup, s.cooldown)
        assert again == first, (f"{policy} at {state.rate} req/s no longer gives the stored "
                                "numbers: run python -m inferlab.sim.sweeps --write")


def test_the_stored_sweep_shows_both_policies_saturating(stored):
    for policy, states in stored.states.items():
        statuses = [st.status for st in states]
        assert statuses[0] == ss.STABLE and ss.OVERLOADED in statuses, (policy, statuses)
        # once overloaded, every higher rate is overloaded too, and achieves about the same
        first = statuses.index(ss.OVERLOADED)
        assert all(st == ss.OVERLOADED for st in statuses[first:]), (policy, statuses)
        stable = [st for st in states if st.stable]
        assert all(st.window.achieved_out_tok_s > 0.95 * st.window.offered_out_tok_s
                   for st in stable)
    static = max(st.window.achieved_out_tok_s for st in stored.states["static"])
    continuous = max(st.window.achieved_out_tok_s for st in stored.states["continuous"])
    assert continuous > 2 * static
    assert stored.capacities["continuous"].rate > stored.capacities["static"].rate


def test_the_steady_state_figure_has_no_problems():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from inferlab.analysis.figures import figure_problems
    from inferlab.sim.plots import plot_steady_state

    states = {"continuous": ss.sweep(WORK, [0.25 * CAPACITY, 0.5 * CAPACITY, 2 * CAPACITY],
                                     SERVE, n0=400, n_max=3200)}
    axes = plot_steady_state(states, title="t")
    assert figure_problems(axes[0].figure) == []
    labels = [t.get_text() for t in axes[1].get_legend().get_texts()]
    assert any("saturates at" in label for label in labels)
    plt.close("all")


@pytest.mark.parametrize("config", [CONFIG, ServingConfig(num_blocks=6, max_batch=4),
                                    CONFIG.replace(policy="static")],
                         ids=["roomy", "preempting", "static"])
@pytest.mark.parametrize("load", [0.5, 2.0], ids=["light", "overloaded"])
def test_a_longer_trace_resumed_from_a_shorter_one_is_served_as_from_the_start(config, load):
    # simulated() continues a trace that extends one it served from a copy of the engine as
    # that trace's last arrival found it: results, iteration log and preemptions must be
    # those of a simulation from the start. Up to 48 tokens a sequence: three blocks, so four
    # sequences overflow six blocks and the tight engine preempts when it is overloaded
    work = ss.Workload("mixed", ((8, 40), (8, 12), (8, 25)))  # a static batch's members
                                                                # finish apart and are held
    serve, rate, preempted = ss.simulated(Fixed(), config), load * 4 / (40 * 0.01), 0
    for n in (50, 100, 100, 200):
        reqs = work.requests(n, rate, seed=1)
        resumed, fresh = serve(reqs), simulate(reqs, Fixed(), config)
        assert resumed.results == fresh.results and resumed.iterations == fresh.iterations
        assert resumed.num_preemptions == fresh.num_preemptions
        preempted = fresh.num_preemptions
    assert preempted > 0 if config.num_blocks == 6 and load > 1 else True  # the path is taken
    assert preempted == 0 if config.num_blocks == CONFIG.num_blocks else True
