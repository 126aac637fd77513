"""Chapter 7's stored cluster study (inferlab.sim.cluster_study): still computed from today's
tables and code, and internally consistent. Rerun ``python -m inferlab.sim.cluster_study
--write`` when a test here says so."""

import json

import pytest

from inferlab.sim import cluster_study as cs
from inferlab.sim.disaggregation import clustered
from inferlab.sim.steady_state import MEETS, UNDECIDED, measure

RERUN = "run python -m inferlab.sim.cluster_study --write"


@pytest.fixture(scope="module")
def stored():
    return cs.load()


def test_the_stored_study_was_computed_from_todays_tables(stored):
    assert stored["inputs"] == json.loads(json.dumps(cs.inputs())), \
        f"the tables or the study's settings changed: {RERUN}"
    assert stored["provenance"]["date"] and stored["provenance"]["git_commit"]


def test_recomputing_a_stored_window_gives_the_stored_numbers(stored):
    """The first window of the first rate tried, for one design of each stream (the cheapest
    to recompute)."""
    for kind, design in (("document", "chunked"), ("short", "2P2D"), ("chat", "1P3D")):
        row = next(r for r in stored["goodput"] if r["kind"] == kind and r["design"] == design)
        probe = row["capacity"].probes[0]
        first = probe.history[0]
        requests = cs.workload(kind).requests(first.n_requests, probe.rate)
        again = measure(requests, clustered(cs.setup(row["link"])[design]), cs.SLOS[kind])
        assert again == first, f"{kind}, {design}: {RERUN}"


def test_every_stored_search_brackets_its_answer(stored):
    target = 0.9
    for row in stored["goodput"]:
        cap = row["capacity"]
        assert row["per_gpu"] == pytest.approx(row["rate"] / row["gpus"])
        assert cap.target == target
        assert cap.rate > 0 and cap.verdict(cap.state) == MEETS, row["design"]
        assert cap.window.slo_attainment >= target
        above = [p for p in cap.probes if p.rate > cap.rate]
        assert above and all(cap.verdict(p) != MEETS for p in above)
        # a rate the windows could not tell was grown before it counted as a miss
        for p in cap.probes:
            if cap.verdict(p) == UNDECIDED:
                assert p.window.n_requests > cs.SEARCH[row["kind"]]["n_max"]
    designs = {(r["kind"], r["design"]) for r in stored["goodput"]}
    assert designs == {(k, n) for k in cs.KINDS for n in cs.setup()}
    f = stored["failure"]
    assert f["lost"] > 0 and f["recompute"]["recomputed_tokens"] > f["retransfer"]["recomputed_tokens"]


def test_the_link_study_runs_the_best_document_split_at_its_goodput_rate(stored):
    splits = [r for r in stored["goodput"] if r["kind"] == "document" and "P" in r["design"]]
    best = max(splits, key=lambda r: r["rate"])
    links = {r["link"]: r for r in stored["links"]}
    assert set(links) == {cs.LINK, *cs.LINKS}
    for r in links.values():
        assert (r["design"], r["rate"]) == (best["design"], best["rate"])
    # over NVLink it is the search's own steady state at its answer, recomputed, and every
    # link's ends at the same trace length (the same requests)
    nvlink = links[cs.LINK]["state"].history
    assert nvlink[:len(best["capacity"].state.history)] == best["capacity"].state.history
    longest = {r["state"].window.n_requests for r in links.values()}
    assert longest == {cs.SEARCH["document"]["n_max"]}


def conserved(work: dict) -> None:
    """A stored run's counts: each stored token computed once across the cluster, every recompute
    forced and counted, nothing read that was not computed, bytes moved only by transfers."""
    instances = work["instances"]
    first = sum(w["prompt_tokens"] + w["decode_rows"] - w["recomputed_tokens"] for w in instances)
    assert first == work["baseline_tokens"]
    assert sum(w["recomputed_tokens"] for w in instances) == work["recomputed_tokens"]
    assert work["recomputed_tokens"] == work["forced_recompute"]
    assert all(w["skipped_tokens"] == 0 for w in instances)
    assert sum(w["tokens_out"] for w in instances) == sum(w["tokens_in"] for w in instances) \
        == work["tokens_moved"]


def test_every_stored_run_conserves_work(stored):
    rows = [r for r in stored["goodput"] + stored["links"] if r["work"] is not None]
    assert len(rows) == len(stored["goodput"] + stored["links"])
    for row in rows:
        conserved(row["work"])
        for w in row["work"]["instances"]:  # no failure here: an instance recomputes only
            assert w["recomputed_tokens"] == w["dropped_tokens"], w  # what it preempted
            if w["name"].startswith("decode"):  # and runs prompt work only to do so
                assert 0 <= w["prompt_tokens"] - w["recomputed_tokens"] <= w["preemptions"], w
    for entry in stored["low_load"].values():
        conserved(entry["work"])
    f = stored["failure"]
    for mode in ("no failure", "recompute", "retransfer"):
        conserved(f[mode]["work"])
    assert f["no failure"]["recomputed_tokens"] == 0 < f["retransfer"]["recomputed_tokens"]
    # a retransfer brings the prompts back; recomputing them is what the other mode costs
    assert f["recompute"]["recomputed_tokens"] - f["retransfer"]["recomputed_tokens"] \
        == f["retransfer"]["kept_tokens"]


def test_the_stored_counts_are_those_of_the_stored_run(stored):
    """The cheapest stored count, recounted: the low-load pair's run at its reported window."""
    entry = stored["low_load"]["1P1D"]
    w = entry["state"].window
    requests = cs.workload("chat").requests(w.n_requests, entry["state"].rate)
    from inferlab.sim.disaggregation import simulate_cluster

    again = cs.counts(simulate_cluster(requests, cs.setup(gpus=2)["1P1D"]), requests)
    assert again == entry["work"], RERUN


def test_every_answer_was_measured_again_on_the_long_trace(stored):
    """The check outside the search (``CONFIRM``): one window per answer, at the stored
    length and rate, longer than any trace its search decided on."""
    n = stored["inputs"]["confirm"]
    for row in stored["goodput"]:
        state, again = row["capacity"].state, row["confirm"]
        assert again.n_requests == n > state.window.n_requests, (row["kind"], row["design"])
        assert again.offered_req_s == pytest.approx(state.rate, rel=0.1)
