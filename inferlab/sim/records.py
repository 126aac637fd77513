"""Steady-state results (``inferlab.sim.steady_state``) to JSON and back, for the stored
simulations of ``data/simulations/`` (Chapters 4, 7 and 8)."""

from __future__ import annotations

from dataclasses import asdict

from inferlab.serving.metrics import Percentiles
from inferlab.sim.steady_state import Criterion, SLOCapacity, SteadyState, Window


def window_to_dict(w: Window) -> dict:
    return asdict(w)


def window_from_dict(d: dict) -> Window:
    return Window(**{k: Percentiles(**v) if k in ("ttft", "tpot", "gap", "latency") else v
                     for k, v in d.items()})


def state_to_dict(s: SteadyState) -> dict:
    return {"rate": s.rate, "status": s.status, "history": [asdict(w) for w in s.history]}


def state_from_dict(d: dict) -> SteadyState:
    return SteadyState(d["rate"], d["status"], tuple(window_from_dict(w) for w in d["history"]))


def capacity_to_dict(c: SLOCapacity) -> dict:
    return {"rate": c.rate, "state": None if c.state is None else state_to_dict(c.state),
            "probes": [state_to_dict(p) for p in c.probes], "target": c.target,
            "criterion": asdict(c.criterion)}


def capacity_from_dict(d: dict) -> SLOCapacity:
    """A stored search; one stored before its target and criterion were kept (before
    2026-12-03) reads back with the defaults."""
    return SLOCapacity(d["rate"], None if d["state"] is None else state_from_dict(d["state"]),
                       tuple(state_from_dict(p) for p in d["probes"]), d.get("target", 0.9),
                       Criterion(**d.get("criterion", {})))
