"""Goodput per GPU: the highest arrival rate at which a cluster keeps its SLO, per GPU.

DistServe (Zhong et al., OSDI 2024) scores a serving system by its *goodput*: the highest
request rate at which a share (90% in its evaluation) of the requests meet both a TTFT and a
TPOT bound, divided by the GPUs used, so that designs of different sizes compare at equal cost.

There is no second search here: ``cluster_goodput`` runs the course's one highest-rate-within-
an-SLO search (``inferlab.sim.steady_state.capacity_at_slo``: each rate's trace grown until its
window between warm-up and drain stops changing) on a simulated cluster
(``inferlab.sim.disaggregation.clustered``) and divides by the cluster's GPUs.
``attainment_curve`` reads, from one run, the share of requests within a TTFT bound and each of
a list of TPOT bounds (Lab 7).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.serving.metrics import SLO, RequestTiming
from inferlab.sim.disaggregation import Cluster, clustered
from inferlab.sim.steady_state import SLOCapacity, Workload, capacity_at_slo


@dataclass(frozen=True)
class Goodput:
    """A cluster's capacity within an SLO (``capacity_at_slo``'s result) and its GPUs."""

    name: str
    gpus: int
    capacity: SLOCapacity

    @property
    def rate(self) -> float:
        """Requests per second, the whole cluster (0.0: not even the lowest rate met the SLO)."""
        return self.capacity.rate

    @property
    def per_gpu(self) -> float:
        return self.rate / self.gpus


def cluster_goodput(workload: Workload, cluster: Cluster, slo: SLO, start: float,
                    name: str = "", serve=None, **kw) -> Goodput:
    """``capacity_at_slo`` of ``cluster`` serving ``workload`` from ``start`` requests/s;
    keyword arguments (target, rtol, n0, n_max, criterion, ...) go to the search. ``serve``:
    the cluster's ``clustered`` serve, where the caller wants to serve more traces with it."""
    serve = clustered(cluster) if serve is None else serve
    cap = capacity_at_slo(workload, serve, slo, start, **kw)
    return Goodput(name or cluster.name, cluster.gpus, cap)


def attainment_curve(timings: list[RequestTiming], ttft_s: float,
                     tpot_bounds: list[float]) -> list[float]:
    """For each TPOT bound, the share of ``timings`` that meet it and the TTFT bound ``ttft_s``
    (``SLO.met_by``; a one-token answer has no TPOT to miss). One run gives the whole curve."""
    return [sum(SLO(ttft_s, b).met_by(t) for t in timings) / len(timings) for b in tpot_bounds]
