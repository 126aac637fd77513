"""Prefill and decode on separate instances: a simulated cluster, its router, the KV transfer
between them, and what a failed decode instance costs.

DistServe (Zhong et al., OSDI 2024) and Splitwise (Patel et al., ISCA 2024) run each request's
prefill on one GPU and its decode on another, so that the two phases stop interfering and each
pool can be sized for its own latency target; Mooncake (Qin et al., 2024) builds Kimi's service
around the same split and a store of KV caches. The price is moving every request's KV cache
between the two. This module simulates such a cluster with the course's own parts: each
instance is a ``StepLoop`` (``inferlab.serving.loop``) with the real scheduler and a ``SimRunner``
(``inferlab.sim.simulator``) that charges modelled step times to the instance's own virtual
clock, and one loop steps them on a common timeline, always the instance that can act first.

- Roles. ``colocated`` instances prefill and decode (Chapter 4's engine, or chunked prefill);
  ``prefill`` instances run each request's prompt and produce its first token; ``decode``
  instances receive the request with its KV cache and generate the rest (chunked steps, so that
  an arriving request simply joins the batch).
- Router. A new request goes to the colocated or prefill instance that would start on it
  soonest (its step in flight, then the prompt tokens it has queued, priced by the cost model);
  a prefilled one to the decode instance holding the fewest KV tokens
  (``router="round_robin"`` ignores the load).
- KV transfer. ``kv_bytes_per_token`` (``inferlab.analysis.formulas.kv_bytes_per_token``) times
  the tokens computed, over the prefill instance's link at ``link_bandwidth`` bytes/s (a row of
  ``data/links.csv``), one transfer after another, the whole cache once the prefill is done (as
  vLLM's NIXL connector does by default: the decode instance reads the blocks after the prefill
  returns; Splitwise instead streams each layer's share while the next layer computes). The
  request joins the decode instance's queue when its transfer ends, with ``num_computed`` set to
  the tokens it brings, and waits there for memory like any arrival; admission keeps them
  (``inferlab.serving.scheduler.Scheduler.admit``), so the decode instance computes only the
  output rows.
- Failure. ``Failure`` kills a decode instance at its first step boundary at or after ``at_s``,
  with everything on it. Each of its requests keeps the tokens already streamed and resumes by
  ``recompute`` (a prefill instance recomputes prompt and generated tokens, then the cache is
  sent again) or ``retransfer`` (the prefill side kept the prompt's cache, as Mooncake's store
  does: it is sent again, and the decode instance recomputes only the generated tokens).

- Counts. Every instance counts what its runner computed and what crossed its link
  (``inferlab.sim.work``); ``ClusterRun.instances`` holds them, failed instances included, and
  ``recomputed_tokens`` is what the runners computed beyond each token once, never a number
  added by hand.

``clustered`` hands a cluster to the steady-state machinery (``inferlab.sim.steady_state``), and
``inferlab.sim.goodput`` finds the highest arrival rate it serves within an SLO (DistServe's
goodput); divided by the cluster's GPUs it compares designs at equal cost.
Simplifications: one GPU per instance, no tensor or pipeline parallelism; a prefill instance
frees a request's blocks when it finishes, not when its transfer ends (vLLM's prefill instance
holds them until the decode instance has read them); a transfer costs its bytes over the link
and nothing more: no fixed per-transfer latency (no published figure for NIXL's or Mooncake's
transfer engines was found to put here) and no hop through a router.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from inferlab.serving.config import ServingConfig
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.metrics import SLO, RequestTiming
from inferlab.serving.request import Request, Sequence
from inferlab.serving.run import Result, Run
from inferlab.sim.simulator import CostModel, SimRunner, resume_point
from inferlab.sim.work import CountingScheduler, Ledger, Work


@dataclass(frozen=True)
class Cluster:
    """Instances (one GPU each) of each role, their configs, the KV bytes and the link."""

    costs: CostModel
    colocated: int = 0
    prefill: int = 0
    decode: int = 0
    colocated_config: ServingConfig | None = None
    prefill_config: ServingConfig | None = None
    decode_config: ServingConfig | None = None
    kv_bytes_per_token: float = 0.0
    link_bandwidth: float = math.inf  # bytes/s out of each prefill instance
    router: str = "least_loaded"

    def __post_init__(self) -> None:
        if self.colocated and (self.prefill or self.decode):
            raise ValueError("a cluster is colocated or disaggregated, not both")
        if not self.colocated and not (self.prefill and self.decode):
            raise ValueError("give colocated instances, or prefill and decode instances")
        need = [("colocated_config", self.colocated), ("prefill_config", self.prefill),
                ("decode_config", self.decode)]
        for name, count in need:
            if count and getattr(self, name) is None:
                raise ValueError(f"{name} is needed for {count} instances")
        if self.decode and self.decode_config.token_budget is None:
            raise ValueError("decode instances run chunked steps (a token_budget), so that a "
                             "request arriving with its cache joins the batch as one token")
        if self.router not in ("least_loaded", "round_robin"):
            raise ValueError(f"unknown router {self.router!r}")
        if not self.link_bandwidth > 0:
            raise ValueError("link_bandwidth must be positive bytes/s")

    @property
    def gpus(self) -> int:
        return self.colocated + self.prefill + self.decode

    @property
    def name(self) -> str:
        return f"{self.colocated} colocated" if self.colocated else \
            f"{self.prefill}P{self.decode}D"


@dataclass(frozen=True)
class Failure:
    """Decode instance ``instance`` dies at ``at_s``; its requests resume by ``mode``
    ("recompute" or "retransfer"); it comes back, empty, ``down_s`` later (inf: never)."""

    instance: int
    at_s: float
    mode: str = "recompute"
    down_s: float = math.inf

    def __post_init__(self) -> None:
        if self.mode not in ("recompute", "retransfer"):
            raise ValueError(f"mode is 'recompute' or 'retransfer', got {self.mode!r}")


@dataclass
class ClusterRun:
    """A cluster's run: the requests' ``Run``, what each instance computed and moved
    (``instances``, one ``inferlab.sim.work.Work`` each, a failed one included), and the
    failure's toll.

    ``recomputed_tokens`` is what the runners computed beyond each token once (counted row by
    row); ``forced_recompute`` is what the mechanism says they must recompute: the K/V that
    preemptions dropped, plus the K/V the failed instance held, less what the failure's resume
    brought back (the prompt's cache, for a retransfer). The two are equal in a correct run.
    """

    run: Run
    cluster: Cluster
    instances: list[Work] = field(default_factory=list)
    transfer_s: float = 0.0        # summed over transfers, queueing on the link excluded
    link_wait_s: float = 0.0       # summed time transfers waited for a busy link
    lost: tuple = ()               # request indices that were on the failed instance
    lost_tokens: int = 0           # K/V tokens the failed instance held for them
    kept_tokens: int = 0           # of theirs, K/V their resume brought back (retransfer)

    @property
    def transfers(self) -> int:
        return sum(w.transfers_out for w in self.instances)

    @property
    def transfer_bytes(self) -> float:
        return sum(w.bytes_out for w in self.instances)

    @property
    def tokens_moved(self) -> int:
        return sum(w.tokens_out for w in self.instances)

    @property
    def recomputed_tokens(self) -> int:
        return sum(w.recomputed_tokens for w in self.instances)

    @property
    def forced_recompute(self) -> int:
        return sum(w.dropped_tokens for w in self.instances) + self.lost_tokens - \
            self.kept_tokens

    def work(self, role: str) -> list[Work]:
        """The instances of ``role`` ("prefill", "decode" or "colocated"), failed ones too."""
        return [w for w in self.instances if w.name.split()[0] == role]

    def slo_attainment(self, slo: SLO) -> float:
        return self.run.summary(slo).slo_attainment


class _Node:
    """One instance: its role, its ``StepLoop`` on its own clock, its outgoing link, and the
    counts of what it computed and moved (``work``, on the cluster's one ``ledger``)."""

    def __init__(self, role: str, index: int, config: ServingConfig, costs: CostModel,
                 ledger: Ledger, start_s: float = 0.0, on_token=None):
        self.role, self.index, self.config, self.costs = role, index, config, costs
        self.clock = VirtualClock()
        self.clock.skip_to(start_s)
        self.work = Work(f"{role} {index}", ledger=ledger)
        self.scheduler = CountingScheduler(config, self.work)
        runner = SimRunner(costs, self.clock, chunked=config.token_budget is not None,
                           work=self.work)
        self.server = StepLoop(self.scheduler, runner, self.clock, on_token=on_token)
        self.alive, self.link_free_s = True, 0.0

    def load(self, now: float) -> tuple:
        """What the router compares: for a decode instance the KV tokens it holds (or will);
        for the others, seconds until it could start on a new prompt, then its batch."""
        sched = self.scheduler
        seqs = sched.waiting + sched.running + self.server.pending
        if self.role == "decode":
            return (sum(s.num_tokens for s in seqs),)
        queued = sum(s.num_uncomputed for s in seqs if s.num_uncomputed > 1)
        busy = max(0.0, self.clock.now() - now) + (self.costs.prefill_s(queued) if queued else 0)
        return busy, len(sched.running)


class _Sim:
    def __init__(self, requests: list[Request], cluster: Cluster, failure: Failure | None):
        c = cluster
        self.requests, self.cluster, self.failure = requests, c, failure
        self.times: dict[int, list[float]] = {}  # every token's time, on whichever instance
        self.ledger = Ledger()
        make = lambda role, n, cfg: [_Node(role, i, cfg, c.costs, self.ledger,  # noqa: E731
                                           on_token=self.stamp)
                                     for i in range(n)]
        self.front = make("colocated", c.colocated, c.colocated_config) or \
            make("prefill", c.prefill, c.prefill_config)
        self.back = make("decode", c.decode, c.decode_config)
        self.retired: list[_Node] = []  # failed instances (their stamps and work count)
        self.served_by: dict[int, _Node] = {}
        self.final: dict[int, Sequence] = {}
        self.turn = 0
        self.out = ClusterRun(Run([]), c)
        self.revive_at: float | None = None
        self.parked: list[tuple] = []  # transfers waiting for a decode instance to come back
        self.next_arrival, self.pending_failure = 0, failure  # of the requests by arrival
        if failure is not None and not 0 <= failure.instance < len(self.back):
            raise ValueError(f"no decode instance {failure.instance} in {c.name}")
        if failure is not None and failure.down_s == math.inf and len(self.back) < 2:
            raise ValueError("a decode instance that never comes back needs another one")

    def pick(self, nodes: list[_Node], now: float) -> _Node:
        live = [n for n in nodes if n.alive]
        if self.cluster.router == "round_robin":
            self.turn += 1
            return live[self.turn % len(live)]
        return min(live, key=lambda n: (*n.load(now), n.index))

    def submit_front(self, i: int, output: list[int], at_s: float) -> None:
        r = self.requests[i]
        node = self.pick(self.front, at_s)
        n_new = r.max_new_tokens if node.role == "colocated" else len(output) + 1
        node.server.submit(Sequence(i, Request(r.prompt, n_new, r.arrival_s),
                                    output=list(output)), at_s)

    def transfer(self, src: _Node, i: int, tokens: int, ready_s: float, output: list[int],
                 computed: int) -> None:
        """Send ``tokens`` tokens of request i's cache from ``src`` to a decode instance (once
        one is up: while the only one is down, the cache waits on the prefill side)."""
        if not any(n.alive for n in self.back):
            self.parked.append((src, i, tokens, ready_s, output, computed))
            return
        c, r = self.cluster, self.requests[i]
        nbytes = c.kv_bytes_per_token * tokens
        start = max(ready_s, src.link_free_s)
        end = start + nbytes / c.link_bandwidth
        src.link_free_s = end
        o = self.out
        o.transfer_s, o.link_wait_s = o.transfer_s + end - start, o.link_wait_s + start - ready_s
        seq = Sequence(i, Request(r.prompt, r.max_new_tokens, r.arrival_s), output=list(output),
                       num_computed=computed)
        dest = self.pick(self.back, ready_s)
        src.work.send(dest.work, tokens, nbytes)
        dest.server.submit(seq, end)
        self.served_by[i] = src

    def finished(self, node: _Node, seq: Sequence) -> None:
        i = seq.seq_id
        if node.role == "prefill" and len(seq.output) < self.requests[i].max_new_tokens:
            self.transfer(node, i, seq.num_computed, node.clock.now(), seq.output,
                          seq.num_computed)
        else:
            self.final[i] = seq

    def fail(self, f: Failure) -> None:
        node = self.back[f.instance]
        t = max(f.at_s, node.clock.now())
        lost = node.scheduler.running + node.scheduler.waiting + node.server.pending
        node.alive = False
        node.work.name += " (failed)"
        self.retired.append(node)
        o = self.out
        o.lost = tuple(sorted(s.seq_id for s in lost))
        for seq in lost:
            i, r = seq.seq_id, self.requests[seq.seq_id]
            o.lost_tokens += seq.num_computed  # the K/V it held there (0 if it was preempted)
            if f.mode == "recompute":  # a prefill instance computes it all again
                self.submit_front(i, seq.output, t)
            else:  # the prompt's cache, kept on the prefill side, is sent again
                o.kept_tokens += len(r.prompt)
                self.transfer(self.served_by[i], i, len(r.prompt), t, seq.output,
                              len(r.prompt))
        self.revive_at = t + f.down_s

    def revive(self) -> None:
        f, t = self.failure, self.revive_at
        self.back[f.instance] = _Node("decode", f.instance, self.cluster.decode_config,
                                      self.cluster.costs, self.ledger, t, on_token=self.stamp)
        self.revive_at = None
        parked, self.parked = self.parked, []
        for src, i, tokens, ready_s, output, computed in parked:
            self.transfer(src, i, tokens, max(ready_s, t), output, computed)

    def run(self, keep=None) -> ClusterRun:
        """Every event in time order to the end. ``keep``, if given, is called once, before the
        first event at or after the last arrival (where ``_Clustered`` copies the simulation: a
        longer trace's extra requests change nothing before it)."""
        order = sorted(range(len(self.requests)), key=lambda i: (self.requests[i].arrival_s, i))
        last = max(r.arrival_s for r in self.requests)
        while True:
            node = min((n for n in self.front + self.back if n.alive),
                       key=lambda n: n.server.ready_s())  # the first of equals: front first
            t_step = node.server.ready_s()
            t_arrive = self.requests[order[self.next_arrival]].arrival_s \
                if self.next_arrival < len(order) else math.inf
            t_next = min(t_step, t_arrive)
            if keep is not None and t_next >= last:
                keep()
                keep = None
            if self.pending_failure is not None and t_next >= self.pending_failure.at_s \
                    and t_next < math.inf:
                self.fail(self.pending_failure)
                self.pending_failure = None
                continue
            if self.revive_at is not None and t_next >= self.revive_at:
                self.revive()
                continue
            if t_next == math.inf:
                break
            if t_arrive <= t_step:
                i = order[self.next_arrival]
                self.next_arrival += 1
                self.submit_front(i, [], self.requests[i].arrival_s)
                continue
            for seq in node.server.step():
                self.finished(node, seq)
        return self.collect()

    def stamp(self, seq: Sequence, token: int, time_s: float) -> None:
        """Every instance's ``on_token``: when each token of request ``seq.seq_id`` came out."""
        self.times.setdefault(seq.seq_id, []).append(time_s)

    def collect(self) -> ClusterRun:
        self.out.instances = [n.work for n in self.front + self.back + self.retired]
        results = []
        for i, r in enumerate(self.requests):
            seq = self.final[i]
            rid = i if r.request_id is None else r.request_id
            results.append(Result(rid, r.prompt, tuple(seq.output),
                                  RequestTiming(r.arrival_s, tuple(sorted(self.times[i]))),
                                  seq.num_preemptions, finish_reason=seq.finish_reason))
        self.out.run = Run(results, split=bool(self.cluster.decode))
        return self.out


def simulate_cluster(requests: list[Request], cluster: Cluster,
                     failure: Failure | None = None) -> ClusterRun:
    """Serve ``requests`` on the simulated ``cluster`` (optionally with a decode instance's
    ``failure``); every request completes, with the tokens and stamps a user would have seen."""
    return _Sim(list(requests), cluster, failure).run()


def clustered(cluster: Cluster, keep: int = 3):
    """``cluster`` as a ``Serve`` of ``inferlab.sim.steady_state`` (a trace in, its ``Run``
    out), so that the one steady-state window and search measure clusters too. Like one
    engine's (``inferlab.sim.simulator.Resumable``), it serves a trace that extends one it
    served before from a copy of the cluster as that trace's last arrival found it (the last
    ``keep`` such copies are kept)."""
    return _Clustered(cluster, keep)


class _Clustered:
    def __init__(self, cluster: Cluster, keep: int = 3):
        self.cluster, self.keep = cluster, keep
        self._kept: list[tuple[list[Request], _Sim]] = []

    def __call__(self, requests: list[Request]) -> Run:
        return self.cluster_run(requests).run

    def cluster_run(self, requests: list[Request]) -> ClusterRun:
        """``simulate_cluster(requests, cluster)``, resumed where it can be."""
        requests = list(requests)
        n, sim = resume_point(self._kept, requests)
        sim = _Sim(requests, self.cluster, None) if sim is None else self._copy(sim)
        sim.requests = requests  # the extra requests arrive after every event so far

        def keep():
            self._kept = [*self._kept, (requests, self._copy(sim))][-self.keep:]

        return sim.run(None if n == len(requests) else keep)

    def _copy(self, sim: _Sim) -> _Sim:
        """A copy that shares what no later event changes: the cluster, the requests, the
        finished sequences that have left their batch and their token times."""
        c = self.cluster
        held = {id(s) for n in sim.front + sim.back for s in n.scheduler.running}
        done = [i for i, s in sim.final.items() if id(s) not in held]  # left their batch
        shared = [c, c.costs, *sim.requests, *(sim.final[i] for i in done),
                  *(sim.times[i] for i in done if i in sim.times)]
        return copy.deepcopy(sim, {id(x): x for x in shared})


def designs(model_config, spec, gpus: int, link_bandwidth: float, max_batch: int = 128,
            token_budget: int = 512, prefill_budget: int = 8192, decode_budget: int = 256,
            dtype: str = "bfloat16", efficiency: float = 1.0,
            more_budgets: tuple[int, ...] = ()) -> dict[str, Cluster]:
    """The designs Chapter 7 compares on ``gpus`` GPUs of ``spec`` (a ``DeviceSpec``) serving
    ``model_config``, at the roofline (``inferlab.analysis.step_time.StepModel``) derated by
    ``efficiency``: "colocated" (Chapter 4's engine), "chunked" (a token budget of
    ``token_budget``), "chunked B" for each budget B of ``more_budgets``, and every split
    "xPyD" with x + y = ``gpus`` over links of ``link_bandwidth`` bytes/s.

    Every instance holds the KV blocks that fit beside the weights
    (``inferlab.analysis.capacity.kv_blocks_for_device``) and batches up to ``max_batch``
    sequences; prefill instances batch prompts up to ``prefill_budget`` tokens a step.
    """
    from inferlab.analysis import formulas
    from inferlab.analysis.capacity import kv_blocks_for_device
    from inferlab.analysis.step_time import StepModel

    costs = StepModel.for_device(model_config, spec, dtype, efficiency=efficiency)
    base = ServingConfig(num_blocks=kv_blocks_for_device(model_config, spec, dtype=dtype),
                         max_batch=max_batch)
    out = {"colocated": Cluster(costs, colocated=gpus, colocated_config=base),
           "chunked": Cluster(costs, colocated=gpus, colocated_config=base.replace(
               policy="chunked", token_budget=token_budget))}
    for b in more_budgets:
        out[f"chunked {b}"] = Cluster(costs, colocated=gpus, colocated_config=base.replace(
            policy="chunked", token_budget=b))
    for p in range(1, gpus):
        out[f"{p}P{gpus - p}D"] = Cluster(
            costs, prefill=p, decode=gpus - p,
            prefill_config=base.replace(policy="chunked", token_budget=prefill_budget),
            decode_config=base.replace(policy="chunked", token_budget=decode_budget),
            kv_bytes_per_token=formulas.kv_bytes_per_token(model_config, dtype),
            link_bandwidth=link_bandwidth)
    return out
