"""Chapter 7's stored cluster study (inferlab.sim.cluster_study): still computed from today's
tables and code, and internally consistent. Rerun ``python -m inferlab.sim.cluster_study
--write`` when a test here says so."""

import json

import pytest

from inferlab.sim import cluster_study as cs
from inferlab.sim.disaggregation import clustered
from inferlab.sim.steady_state import measure

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
    for row in stored["goodput"] + stored["links"]:
        cap = row["capacity"]
        assert row["per_gpu"] == pytest.approx(row["rate"] / row["gpus"])
        assert cap.rate > 0 and cap.state.stable, row["design"]
        assert cap.window.slo_attainment >= target
        above = [p for p in cap.probes if p.rate > cap.rate]
        assert above and all(not (p.stable and p.window.slo_attainment >= target) for p in above)
    designs = {(r["kind"], r["design"]) for r in stored["goodput"]}
    assert designs == {(k, n) for k in cs.KINDS for n in cs.setup()}
    f = stored["failure"]
    assert f["lost"] > 0 and f["recompute"]["recomputed_tokens"] > f["retransfer"]["recomputed_tokens"]
