"""The simulated cluster (prefill, decode and colocated instances), the steady-state goodput
search, Chapter 7's workloads, and the study and benchmark that use them, at toy sizes."""

import math
from dataclasses import replace

import pytest

from inferlab.analysis import formulas
from inferlab.analysis.hardware import get_device_spec
from inferlab.analysis.step_time import StepModel
from inferlab.model.config import ModelConfig
from inferlab.serving.config import ServingConfig
from inferlab.serving.metrics import SLO, RequestTiming
from inferlab.serving.request import Request
from inferlab.sim import workloads
from inferlab.sim.disaggregation import Cluster, Failure, clustered, designs, simulate_cluster
from inferlab.sim.goodput import attainment_curve, cluster_goodput
from inferlab.sim.records import capacity_from_dict
from inferlab.sim.steady_state import MEETS, Criterion, capacity_at_slo, measure, simulated
from inferlab.sim.workloads import Workload
from inferlab.sim.simulator import FittedCosts

LLAMA13 = ModelConfig.from_name("llama-2-13b")
A100 = get_device_spec("A100 80GB SXM")
COSTS = StepModel.for_device(LLAMA13, A100)
KV = formulas.kv_bytes_per_token(LLAMA13)
BASE = ServingConfig(num_blocks=4000, max_batch=64)
PREFILL = BASE.replace(policy="chunked", token_budget=4096)
DECODE = BASE.replace(policy="chunked", token_budget=128)


def split(p, d, bw=300e9, router="least_loaded"):
    return Cluster(COSTS, prefill=p, decode=d, prefill_config=PREFILL, decode_config=DECODE,
                   kv_bytes_per_token=KV, link_bandwidth=bw, router=router)


def requests(n=40, rate=20.0, seed=0):
    return workloads.poisson_requests(workloads.chat_like(n, seed=seed, scale=0.5), rate, seed)


@pytest.mark.parametrize("cluster", [Cluster(COSTS, colocated=2, colocated_config=BASE),
                                     split(1, 1), split(2, 1, router="round_robin")],
                         ids=["colocated", "1P1D", "2P1D round robin"])
def test_every_request_completes_with_its_tokens_and_moves_its_cache_once(cluster):
    reqs = requests()
    out = simulate_cluster(reqs, cluster)
    for r, result in zip(reqs, out.run.results):
        assert result.ok and len(result.tokens) == r.max_new_tokens
        assert result.timing.n_tokens == r.max_new_tokens
        assert result.timing.token_times_s[0] >= r.arrival_s
    handed_on = [r for r in reqs if r.max_new_tokens > 1]
    if cluster.decode:
        assert out.transfers == len(handed_on)
        assert out.transfer_bytes == pytest.approx(KV * sum(len(r.prompt) for r in handed_on))
    else:
        assert out.transfers == 0 and out.transfer_bytes == 0


def test_prompts_that_arrive_while_a_prefill_runs_are_batched_in_the_next_step():
    """Twenty short prompts arriving 1 ms apart, each prefill step at least one weight read
    (about 12.6 ms): after the first step, the prompts that came while it ran share a step,
    so the prefill instance runs far fewer forwards than prompts (it once ran one each,
    stepping at the first arrival it had missed and letting the others wait)."""
    reqs = [Request((0,) * 19, 4, 0.001 * i) for i in range(20)]
    out = simulate_cluster(reqs, split(1, 1))
    prefill = out.work("prefill")[0]
    assert prefill.prompt_tokens == 20 * 19
    assert prefill.forwards <= 3
    assert COSTS.prefill_s(19) > 0.01   # the premise: a step outlasts ten arrivals


def test_the_transfer_sits_between_the_first_and_second_token_and_queues_on_the_link():
    reqs = [Request((0,) * 1000, 5, 0.0, "a"), Request((0,) * 1000, 5, 0.0, "b")]
    bw = 1e9  # slow: 1000 tokens of Llama-2-13B cache take about 0.8 s
    out = simulate_cluster(reqs, split(1, 1, bw=bw))
    move = KV * 1000 / bw
    a, b = (r.timing.token_times_s for r in out.run.results)
    assert a[1] - a[0] >= move and b[1] - b[0] >= move
    assert max(a[1], b[1]) - min(a[0], b[0]) >= 2 * move  # one link: the second waits
    assert out.link_wait_s > 0


def test_a_colocated_cluster_of_one_behaves_like_the_simulator():
    from inferlab.sim.simulator import simulate

    reqs = requests(30)
    alone = simulate(reqs, COSTS, BASE)
    cluster = simulate_cluster(reqs, Cluster(COSTS, colocated=1, colocated_config=BASE)).run
    for x, y in zip(alone.results, cluster.results):
        assert x.timing.token_times_s == pytest.approx(y.timing.token_times_s)


@pytest.mark.parametrize("mode", ["recompute", "retransfer"])
def test_a_failed_decode_instance_loses_no_request_and_costs_what_its_mode_says(mode):
    reqs = requests(60, rate=30.0)
    cluster = split(1, 2)
    base = simulate_cluster(reqs, cluster)
    failed = simulate_cluster(reqs, cluster, Failure(0, 1.0, mode, down_s=0.5))
    assert failed.lost
    for r, result in zip(reqs, failed.run.results):
        assert len(result.tokens) == r.max_new_tokens == result.timing.n_tokens
    assert failed.recomputed_tokens > 0 and failed.transfer_bytes > base.transfer_bytes
    lost = [reqs[i] for i in failed.lost]
    if mode == "retransfer":  # the prompt's cache is sent again; only the streamed tokens redone
        assert failed.recomputed_tokens < sum(len(r.prompt) + r.max_new_tokens for r in lost)
        assert failed.transfers == base.transfers + len(lost)
    # the lost requests' streams have a hole where their instance died
    gap = lambda run, i: max(b - a for a, b in zip(run.results[i].timing.token_times_s,  # noqa
                                                    run.results[i].timing.token_times_s[1:]))
    assert max(gap(failed.run, i) for i in failed.lost) > max(gap(base.run, i)
                                                               for i in failed.lost)


def test_clusters_refuse_impossible_shapes():
    with pytest.raises(ValueError, match="colocated or disaggregated"):
        Cluster(COSTS, colocated=1, prefill=1, decode=1, colocated_config=BASE,
                prefill_config=PREFILL, decode_config=DECODE)
    with pytest.raises(ValueError, match="chunked steps"):
        Cluster(COSTS, prefill=1, decode=1, prefill_config=PREFILL, decode_config=BASE)
    with pytest.raises(ValueError, match="needed"):
        Cluster(COSTS, colocated=2)
    with pytest.raises(ValueError, match="another one"):
        simulate_cluster(requests(4), split(1, 1), Failure(0, 1.0))
    with pytest.raises(ValueError, match="recompute"):
        Failure(0, 1.0, "reboot")


def test_designs_cover_every_split_at_equal_gpus():
    d = designs(LLAMA13, A100, 4, 300e9)
    assert list(d) == ["colocated", "chunked", "1P3D", "2P2D", "3P1D"]
    assert {c.gpus for c in d.values()} == {4}
    assert d["chunked"].colocated_config.token_budget == 512


# -- goodput: the one steady-state machinery on a cluster ----------------------------------------
SHORT = Workload.fixed(20, 30)
SMALL_SEARCH = dict(n0=50, n_max=400, criterion=Criterion(min_requests=100, p99_rtol=0.2))


def test_a_cluster_is_measured_by_the_same_window_as_one_engine():
    """One colocated instance serves a trace exactly as the simulator does, so the one window
    gives the same numbers, except what only an engine's step log holds."""
    reqs = SHORT.requests(300, 20.0)
    slo = SLO(ttft_s=0.2, tpot_s=0.05)
    alone = measure(reqs, simulated(COSTS, BASE), slo)
    cluster = measure(reqs, clustered(Cluster(COSTS, colocated=1, colocated_config=BASE)), slo)
    assert cluster == replace(alone, mean_batch=0.0, prefill_s=0.0, decode_s=0.0)
    assert alone.decode_s > 0


def test_cluster_goodput_is_the_one_search_divided_by_the_gpus():
    slo = SLO(ttft_s=0.2, tpot_s=0.03)
    one = Cluster(COSTS, colocated=1, colocated_config=BASE)
    g = cluster_goodput(SHORT, one, slo, 50.0, **SMALL_SEARCH)
    cap = capacity_at_slo(SHORT, simulated(COSTS, BASE), slo, 50.0, **SMALL_SEARCH)
    assert g.rate == cap.rate > 0 and g.per_gpu == g.rate
    assert [p.rate for p in g.capacity.probes] == [p.rate for p in cap.probes]
    two = cluster_goodput(SHORT, Cluster(COSTS, colocated=2, colocated_config=BASE), slo,
                          2 * g.rate, **SMALL_SEARCH)
    assert two.gpus == 2 and two.per_gpu == pytest.approx(two.rate / 2)
    assert two.capacity.window.slo_attainment >= 0.9


def test_attainment_curve_counts_one_token_answers_by_their_ttft():
    timings = [RequestTiming(0.0, (0.1,)), RequestTiming(0.0, (0.1, 0.2, 0.3)),
               RequestTiming(0.0, (2.0, 2.01))]
    assert attainment_curve(timings, 1.0, [0.05, 0.1, 0.5]) == [1 / 3, 2 / 3, 2 / 3]


# -- workloads --------------------------------------------------------------------------------
def test_workloads_have_their_stated_shapes():
    rows = workloads.long_document(3000)
    mean_in = sum(r.prompt_len for r in rows) / len(rows)
    mean_out = sum(r.output_len for r in rows) / len(rows)
    assert mean_in == pytest.approx(workloads.LONG_DOCUMENT["mean_in"], rel=0.02)
    assert mean_out == pytest.approx(workloads.LONG_DOCUMENT["mean_out"], rel=0.02)
    reqs = workloads.stream("chat", 5.0, 20.0)
    assert len(reqs) == 100 and reqs[-1].arrival_s > 10
    mixed = workloads.mixed_requests(3, 8, 20, 2, [100, 200], 4, 0.5, vocab_size=50, seed=1)
    assert [len(r.prompt) for r in mixed] == [8, 8, 8, 100, 200]
    assert [r.arrival_s for r in mixed[3:]] == [0.5, 1.0]
    assert all(0 <= t < 50 for r in mixed for t in r.prompt)
    with pytest.raises(ValueError, match="unknown kind"):
        workloads.stream("poetry", 1.0, 1.0)


# -- the study and the benchmark, at toy sizes --------------------------------------------------
def test_the_study_runs_its_parts_at_toy_sizes(monkeypatch):
    from inferlab.sim import cluster_study as study

    monkeypatch.setattr(study, "GPUS", 2)
    monkeypatch.setattr(study, "SEARCH", {k: dict(SMALL_SEARCH, rtol=0.2) for k in study.KINDS})
    monkeypatch.setattr(study, "workload", lambda kind: Workload.fixed(200, 20))
    row = study._goodput(("document", "1P1D", study.LINK, 4.0))
    assert row["gpus"] == 2 and row["rate"] > 0
    cap = capacity_from_dict(row["capacity"])
    assert cap.verdict(cap.state) == MEETS
    work = row["work"]  # the run at the answer, counted: each stored token computed once
    assert work["requests"] == row["capacity"]["state"]["history"][-1]["n_requests"]
    assert sum(w["prompt_tokens"] + w["decode_rows"] - w["recomputed_tokens"]
               for w in work["instances"]) == work["baseline_tokens"] == work["requests"] * 219
    assert work["tokens_moved"] == work["requests"] * 200 and work["recomputed_tokens"] == 0
    f = study._failure(("1P1D", 0.5 * row["rate"]))
    assert f["lost"] >= 0 and set(f) >= {"no failure", "recompute", "retransfer", "cpu_s"}
    link = study._link(("1P1D", row["rate"], study.LINK))  # the search's own steady state,
    answer = row["capacity"]["state"]["history"]               # grown to the longest trace
    common = min(len(answer), len(link["state"]["history"]))   # (the search may have grown an
    assert common >= 2 and link["state"]["history"][:common] == answer[:common]  # undecided one)
    assert link["state"]["history"][-1]["n_requests"] == SMALL_SEARCH["n_max"]
    if len(link["state"]["history"]) == len(answer):
        assert link["work"] == row["work"]
    low = study._low(("1P1D", 0.5 * row["rate"]))
    assert low["gpus"] == 2 and low["work"]["recomputed_tokens"] == 0


def test_the_benchmark_measures_the_engine_and_checks_its_bars(tmp_path, monkeypatch, capsys):
    import json

    from inferlab.benchmarks import prefill_decode

    tiny = dict(model="tiny", trace=(3, 8, 12, 2, 96, 3, 0.05), max_batch=4, budgets=(8, 32))
    monkeypatch.setitem(prefill_decode.SIZES, "cpu", tiny)
    out = tmp_path / "pd.json"
    assert prefill_decode.main(["--profile", "cpu", "--repeats", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "budget 8" in text and "simulator, whole prompts" in text and "bars:" in text
    record = json.loads(out.read_text())
    assert record["benchmark"] == "prefill_decode" and record["model"] == "tiny"
    engine = record["engine"]
    assert [r["label"] for r in engine["results"]] == ["whole prompts", "budget 8", "budget 32"]
    assert {"stall_cut", "simulator_worst_error"} <= set(engine["bars"])
    assert all(r["stall_s"] > 0 for r in engine["results"])


@pytest.mark.parametrize("cluster", [Cluster(COSTS, colocated=2, colocated_config=BASE),
                                     split(1, 1), split(2, 1, router="round_robin")],
                         ids=["colocated", "1P1D", "2P1D round robin"])
def test_a_longer_trace_resumed_from_a_shorter_one_is_served_as_from_the_start(cluster):
    # the search's serve keeps the cluster as each trace's last arrival found it and goes on
    # from there for a trace that extends it: every result, instance count and transfer must
    # be those of a simulation from the start (at a load that queues, so the state is busy)
    serve = clustered(cluster)
    for n in (30, 60, 60, 120):
        reqs = requests(n, rate=30.0)
        resumed, fresh = serve.cluster_run(reqs), simulate_cluster(reqs, cluster)
        assert resumed.run.results == fresh.run.results
        assert [w.as_dict() for w in resumed.instances] == [w.as_dict() for w in fresh.instances]
        assert (resumed.transfer_s, resumed.link_wait_s) == (fresh.transfer_s, fresh.link_wait_s)
    assert len(serve._kept) == 3  # 30, 60 and 120 (the second 60 resumed its own state)
