"""Splitting a mixed step's time between input and output tokens (inferlab.analysis.cost_split):
two conventions over the same steps, and the counts behind them."""

import pytest

from inferlab.sim import token_cost as tc
from inferlab.analysis.cost_split import CONVENTIONS, PhaseSplit, split_run
from inferlab.analysis.step_time import Shape
from inferlab.serving.config import ServingConfig
from inferlab.sim.simulator import simulate
from inferlab.sim.steady_state import Workload, window


@pytest.fixture(scope="module")
def chunked():
    """A short chunked run of Llama-3-8B on an H100: its requests, run, costs and window."""
    case = tc.CostCase(prompt=600, output=60)
    costs = case.costs()
    config = ServingConfig(num_blocks=case.serving().num_blocks, max_batch=64, policy="chunked",
                           token_budget=512)
    requests = Workload.fixed(600, 60).requests(150, 12.0)
    run = simulate(requests, costs, config)
    end = max(r.arrival_s for r in requests)
    return requests, run, costs, window(requests, run), (0.2 * end, 0.9 * end)


def test_the_kernels_add_up_to_the_seconds_the_simulator_charged(chunked):
    requests, run, costs, w, (t0, t1) = chunked
    split = split_run(run, costs, t0, t1)
    assert split.mixed_steps > 0 and split.prompt_tokens > 0 and split.decode_rows > 0
    priced = sum(k.seconds for k in split.kernels.values())
    assert priced == pytest.approx(split.busy_s, rel=1e-9)
    # the split by tokens is the window's own record, to the last second
    assert split.prefill_s_by_tokens == pytest.approx(w.prefill_s, rel=1e-9)
    assert split.busy_s == pytest.approx(w.prefill_s + w.decode_s, rel=1e-9)
    # what each convention charges to prompts and decodes adds up to the busy time
    for c in CONVENTIONS:
        assert 0 < split.prefill_share(c) < 1
    assert split.decode_s_by_kernel + split.prefill_s_by_kernel == pytest.approx(split.busy_s)
    # counts: every decode row in the window, and the prompt tokens its forwards computed
    rows = sum(1 for it in run.iterations if t0 <= it.start_s < t1 for f in it.forwards
               for r in f.rows if not r.prefill)
    assert split.decode_rows == rows
    with pytest.raises(ValueError):
        split.prefill_share("by vibes")


def test_the_conventions_differ_only_on_mixed_steps(chunked):
    """A pure prefill goes wholly to prompts and a pure decode step wholly to decodes under both
    conventions; a mixed step's attention over long caches goes mostly to the decode rows by
    kernel time, whatever their token count."""
    _, _, costs, _, _ = chunked
    prompt, decode = Shape.of_rows([(480, 0)]), Shape.of_rows([(1, 900)] * 32)

    class Row:  # the log's Row, as split_run reads it
        def __init__(self, new, cached, prefill):
            self.new, self.cached, self.prefill = new, cached, prefill

    class Fwd:
        def __init__(self, rows, seconds):
            self.rows, self.seconds = rows, seconds
            p = sum(r.new for r in rows if r.prefill)
            self.prefill_share = p / (p + sum(not r.prefill for r in rows))

    class It:
        def __init__(self, fwd):
            self.start_s, self.forwards = 0.0, (fwd,)

    class Run:
        def __init__(self, fwds):
            self.iterations = [It(f) for f in fwds]

    pure_p = Fwd([Row(480, 0, True)], costs.seconds(prompt))
    pure_d = Fwd([Row(1, 900, False)] * 32, costs.seconds(decode))
    mixed = Fwd([Row(480, 0, True)] + [Row(1, 900, False)] * 32, costs.seconds(prompt + decode))
    for fwd, share in ((pure_p, 1.0), (pure_d, 0.0)):
        s = split_run(Run([fwd]), costs, 0, 1)
        assert s.prefill_share("tokens") == share == pytest.approx(s.prefill_share("kernels"))
    s = split_run(Run([mixed]), costs, 0, 1)
    assert s.steps == s.mixed_steps == 1
    assert s.prefill_share("tokens") == pytest.approx(480 / 512)
    # by kernel time the decode rows pay more than their 32 tokens' share: they need a weight
    # read and long cache reads that the prompt alone would not have
    assert s.prefill_share("kernels") < s.prefill_share("tokens")
    att = s.kernels["attention"]
    alone_p = next(k for k in costs.kernels(prompt) if k.name == "attention").seconds
    alone_d = next(k for k in costs.kernels(decode) if k.name == "attention").seconds
    assert att.prefill_s_by_kernel / att.seconds == pytest.approx(alone_p / (alone_p + alone_d))


def test_a_split_survives_the_round_trip_through_json(chunked):
    _, run, costs, _, (t0, t1) = chunked
    split = split_run(run, costs, t0, t1)
    import json
    again = PhaseSplit.from_dict(json.loads(json.dumps(split.to_dict())))
    assert again == split


def test_every_stored_case_carries_its_split_and_it_matches_its_window():
    for key, s in tc.stored().items():
        assert s.split is not None, s.case
        w = s.capacity.window
        assert s.split.busy_s == pytest.approx(w.prefill_s + w.decode_s, rel=1e-9), s.case
        assert s.split.prefill_s_by_tokens == pytest.approx(w.prefill_s, rel=1e-9), s.case
        cost = tc.stored_cost(s.case, 1.0)
        # the blended price is the same under both conventions: it rests on neither
        for c in CONVENTIONS:
            i, o = cost.usd_per_m(c)
            spent = (i * w.achieved_in_tok_s + o * w.achieved_out_tok_s) / 1e6
            assert spent == pytest.approx(1.0 * s.case.devices / 3600, rel=1e-9)
