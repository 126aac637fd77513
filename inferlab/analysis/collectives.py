"""Collectives between devices: what one all-reduce, send or all-to-all costs, from sourced figures.

A call costs a fixed time plus its bytes over the link (nccl-tests' ``doc/PERFORMANCE.md``:
"overhead + size / bw"). The step-time model (``inferlab.analysis.step_time``) charges every
collective a step makes through this module. Each ``Cost`` also carries the bytes the algorithm
moves through one rank's link, so a step's traffic can be counted.

**All-reduce algorithms**, for S bytes on N ranks (bytes through each rank's link):

- ring: 2 (N - 1) steps, 2 (N - 1) / N x S, the least any point-to-point algorithm moves;
- tree (NCCL): a reduction up a tree and a broadcast down it, 2 S, in 2 log2(servers) network
  hops plus 2 (ranks a server - 1) hops inside each server: fewer steps than a ring across servers;
- one-shot (engines' kernels): every rank reads its N - 1 peers' whole buffers, (N - 1) x S, in
  one synchronisation; two-shot: a reduce-scatter then an all-gather, the ring's bytes.

**Prices**, each from its own source:

- **NCCL** on any link, by NCCL's own cost model (NCCL 2.30.7 ``src/graph/tuning.cc``, in
  ``data/collectives.csv``): ring and tree, each with the LL, LL128 and Simple protocols; a
  latency of a base plus one hop per step (the hop's class: NVLink, PCIe, or the network), and
  the bytes over the bus bandwidth times the protocol's share, LL capped at ``llMaxBw``; NCCL
  runs the fastest. Left out: NVLS and CollNet (switch reductions), per-channel bandwidth caps
  and the multi-node ring plateau factor (they need NCCL's channel count). The bus bandwidth is
  the link's measured nccl-tests figure where one is published (``data/links.csv``), else its
  line rate. A network link says how many of the group's GPUs share a server (joined by NVLink).
- **vLLM's NVLink all-reduce** (custom one-shot kernel below its cap, torch symmetric-memory
  multimem above, NCCL beyond 64 MiB; caps at vLLM commit b250ac3): one line, latency + S /
  bandwidth, fitted to vLLM's own CUDA-graph timings on H100 (6 and 8 GPUs,
  ``data/allreduce_timings.csv``), used for every group of 2 to 8 GPUs on that link.

**Expert all-to-all**, DeepEP's two kernel families, each for its phase. ``PrefillAllToAll``:
the normal (high-throughput) kernels DeepEP gives for training and prefill, from their published
bottleneck bandwidths at 4,096 tokens a GPU; a token is sent once per destination node and
forwarded over NVLink. ``ExpertAllToAll``: the low-latency kernels for decode, from their
published times at 128 tokens a GPU (``data/deepep.csv``). The Feb-2025 kernel sent every row
but a rank's own through its NIC, so its table gives the NIC's achieved bandwidth at each EP
width; one batch size per width cannot separate a fixed per-call cost from that bandwidth, so
the price comes in two bounds: every microsecond is bytes at the achieved bandwidth (default),
or the line rate plus a fixed remainder per call (``fixed_latency``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from inferlab.data import read_table

LINK_CLASSES = ("nvlink", "pcie", "network")
PROTOCOLS = ("LL", "LL128", "Simple")
MiB = 2**20
# vLLM on Hopper at commit b250ac3 (engine fact vllm-allreduce-caps-hopper, all_reduce_utils.py):
# the custom kernel's cap (torch symmetric memory on) and symmetric memory's; NCCL above. The
# custom kernel's cap is the smaller of the table's and CustomAllreduce's max_size, 8 MiB by
# default (custom_all_reduce.py at 00d618a, engine fact vllm-custom-allreduce-scope): 8 MiB on 2
# and 4 GPUs, where the table says 64 and 32.
CUSTOM_DEFAULT_MAX_BYTES = 8 * MiB
CUSTOM_MAX_BYTES = {n: min(cap, CUSTOM_DEFAULT_MAX_BYTES)
                    for n, cap in {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4}.items()}
SYMM_MEM_MAX_BYTES = {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB}
ONE_STAGE_MAX_BYTES = {2: math.inf, 4: MiB // 2, 6: MiB // 4, 8: MiB // 4}  # custom_all_reduce.cuh
CUSTOM_SIZES = tuple(CUSTOM_MAX_BYTES)   # CustomAllreduce._SUPPORTED_WORLD_SIZES


@dataclass(frozen=True)
class Cost:
    """One call: a fixed latency, the time its bytes take, and the bytes through one rank's link."""

    latency_s: float
    transfer_s: float
    how: str
    bytes: float = 0.0

    @property
    def seconds(self) -> float:
        return self.latency_s + self.transfer_s


@dataclass(frozen=True)
class Link:
    """A link between devices: its line rate, its class (which latencies apply), the bus
    bandwidth collectives reach on it and, for a network, how many GPUs share a server."""

    name: str
    bandwidth: float              # line rate, bytes/s in one direction
    link_class: str = "ideal"     # nvlink, pcie, network; ideal: no latency, the line rate
    bus_bandwidth: float | None = None   # measured all-reduce bus bandwidth, bytes/s
    gpus_per_node: int = 1        # network links: the group's GPUs in one server, on NVLink

    def __post_init__(self):
        if self.link_class not in LINK_CLASSES + ("ideal",):
            raise ValueError(f"link_class must be one of {LINK_CLASSES} or 'ideal'")
        if not self.bandwidth > 0:
            raise ValueError(f"a link's bandwidth must be positive, got {self.bandwidth}")

    @classmethod
    def named(cls, name: str) -> "Link":
        """A row of ``data/links.csv``."""
        for row in read_table("links.csv"):
            if row["name"] == name:
                bus = row.get("bus_bandwidth_gbs", "").strip()
                per_node = row.get("gpus_per_node", "").strip()
                return cls(name, float(row["bandwidth_gbs_per_direction"]) * 1e9,
                           row["link_class"], float(bus) * 1e9 if bus else None,
                           int(per_node) if per_node else 1)
        raise ValueError(f"no link {name!r} in data/links.csv")

    @classmethod
    def ideal(cls, bandwidth: float) -> "Link":
        """A link given by its bandwidth alone: no latency (``math.inf`` for a free link)."""
        return cls(f"{bandwidth / 1e9:g} GB/s", bandwidth)

    @property
    def bus(self) -> float:
        """What an all-reduce's bus bytes move at: the measured figure, else the line rate."""
        return self.bus_bandwidth or self.bandwidth


def ring_bytes(nbytes, devices: int):
    """Bytes each rank sends (and receives) in a ring or two-shot all-reduce of ``nbytes``."""
    return 2 * (devices - 1) / devices * nbytes


def one_shot_bytes(nbytes, devices: int):
    """Bytes each rank reads from its peers in a one-shot all-reduce of ``nbytes``."""
    return (devices - 1) * nbytes


# --- NCCL's cost model ----------------------------------------------------------------

@functools.cache
def nccl_model() -> dict[tuple[str, str], dict]:
    """``data/collectives.csv`` by (algorithm, protocol): latencies in seconds, bus shares,
    the LL caps in bytes/s and the tree's correction factors."""
    def num(v, scale=1.0):
        return float(v) * scale if v.strip() else None
    return {(r["algorithm"], r["protocol"]): {
        "base": num(r["base_latency_us"], 1e-6),
        "step": {"nvlink": num(r["nvlink_step_us"], 1e-6), "pcie": num(r["pci_step_us"], 1e-6),
                 "network": num(r["net_step_us"], 1e-6)},
        "overhead": num(r["net_overhead_us"], 1e-6) or 0.0,
        "share": (num(r["bus_share_one_node"]), num(r["bus_share_nodes"])),
        "cap": tuple(num(r[f"ll_cap_{k}_gbs"], 1e9) for k in ("one_node", "two_nodes", "more_nodes")),
        "correction": [float(x) for x in r["tree_correction"].split()]}
        for r in read_table("collectives.csv")}


def _layout(link: Link, devices: int) -> tuple[int, int, str]:
    """(servers, ranks a server, the class of a hop inside a server) for a group on ``link``."""
    if link.link_class == "network":
        per_node = min(devices, link.gpus_per_node)
        return math.ceil(devices / per_node), per_node, "nvlink"
    return 1, devices, link.link_class


def _nccl_price(link: Link, nbytes: float, devices: int, algorithm: str, protocol: str) -> Cost | None:
    """NCCL's time for one all-reduce by ``algorithm`` and ``protocol`` (tuning.cc's
    ncclTopoTuneModel and ncclTopoGetAlgoTime), or None where NCCL would not run it."""
    m = nccl_model()[(algorithm, protocol)]
    nodes, ppn, intra = _layout(link, devices)
    if protocol == "LL128" and intra == "pcie":
        return None                      # LL128 is on by default only between NVLink-joined GPUs
    bus = link.bus * m["share"][0 if nodes == 1 else 1]
    if protocol == "LL":
        bus = min(bus, m["cap"][min(nodes, 3) - 1])
    net = nccl_model()[("tree", protocol)]["step"]["network"] if ppn == 1 else m["step"]["network"]
    if algorithm == "ring":
        steps, inter = 2 * (devices - 1), 2 * (nodes - 1)
        hop = m["step"][intra] if nodes == 1 else max(m["step"][intra], m["overhead"])
        latency = m["base"] + (steps - inter) * hop + inter * net
        transfer, moved = ring_bytes(nbytes, devices) / bus, ring_bytes(nbytes, devices)
    else:                                # tree all-reduce: algorithm bandwidth = bus x 0.5
        latency = m["base"] + 2 * ((ppn - 1) * m["step"][intra]
                                   + int(math.log2(nodes)) * m["step"]["network"])
        log_size = int(math.log2(nbytes // 64)) if nbytes >= 64 else -1
        correction = m["correction"][log_size] if 0 <= log_size < 23 else 1.0
        transfer, moved = 2 * nbytes / (bus * correction), 2 * nbytes
    return Cost(latency, transfer, f"NCCL {algorithm}, {protocol}", moved)


def nccl_all_reduce(link: Link, nbytes: float, devices: int, protocol: str | None = None,
                    algorithm: str | None = None) -> Cost:
    """An all-reduce by NCCL's own model: the fastest (algorithm, protocol), or the one asked."""
    if devices < 2:
        return Cost(0.0, 0.0, "none")
    if link.link_class == "ideal":
        return Cost(0.0, ring_bytes(nbytes, devices) / link.bandwidth, "ring at the line rate",
                    ring_bytes(nbytes, devices))
    costs = [c for a in ("ring", "tree") for p in PROTOCOLS
             if algorithm in (None, a) and protocol in (None, p)
             and (c := _nccl_price(link, nbytes, devices, a, p)) is not None]
    if not costs:
        raise ValueError(f"NCCL runs no {algorithm or ''} {protocol or ''} all-reduce on "
                         f"{link.link_class} links")
    return min(costs, key=lambda c: c.seconds)


def nccl_gather(link: Link, nbytes: float, devices: int) -> Cost:
    """Gathering ``devices`` shards that total ``nbytes`` (vLLM's logits gather), priced as
    NCCL's ring all-gather: N - 1 steps, (N - 1) / N of the total through a rank's link."""
    if devices < 2:
        return Cost(0.0, 0.0, "none")
    moved = (devices - 1) / devices * nbytes
    if link.link_class == "ideal":
        return Cost(0.0, moved / link.bandwidth, "gather at the line rate", moved)
    nodes, ppn, intra = _layout(link, devices)
    best = None
    for p in PROTOCOLS:
        m = nccl_model()[("ring", p)]
        if p == "LL128" and intra == "pcie":
            continue
        bus = link.bus * m["share"][0 if nodes == 1 else 1]
        if p == "LL":
            bus = min(bus, m["cap"][min(nodes, 3) - 1])
        net = nccl_model()[("tree", p)]["step"]["network"] if ppn == 1 else m["step"]["network"]
        inter = nodes - 1
        hop = m["step"][intra] if nodes == 1 else max(m["step"][intra], m["overhead"])
        cost = Cost(m["base"] + (devices - 1 - inter) * hop + inter * net, moved / bus,
                    f"NCCL ring gather, {p}", moved)
        best = cost if best is None or cost.seconds < best.seconds else best
    return best


def send(link: Link, nbytes: float) -> Cost:
    """One transfer of ``nbytes`` to the next stage (a pipeline's hop). NCCL's table has no
    point-to-point entry: the course charges one ring step's hardware latency on this link
    (no collective base latency) and the bytes at a protocol's share of the bus bandwidth,
    the faster protocol."""
    if link.link_class == "ideal":
        return Cost(0.0, nbytes / link.bandwidth, "send at the line rate", nbytes)
    nodes, ppn, intra = _layout(link, 2)
    hop_class = "network" if nodes > 1 else intra
    costs = []
    for p in PROTOCOLS:
        m = nccl_model()[("ring", p)]
        if p == "LL128" and hop_class == "pcie":
            continue
        step = (nccl_model()[("tree", p)]["step"]["network"] if hop_class == "network" and ppn == 1
                else m["step"][hop_class])
        bus = link.bus * m["share"][0 if nodes == 1 else 1]
        if p == "LL":
            bus = min(bus, m["cap"][min(nodes, 3) - 1])
        costs.append(Cost(step, nbytes / bus, f"one NCCL ring step, {p}", nbytes))
    return min(costs, key=lambda c: c.seconds)


# --- vLLM's NVLink all-reduce ----------------------------------------------------------

@functools.cache
def custom_fits() -> dict[str, tuple[float, float]]:
    """link -> (latency s, bandwidth bytes/s of the message): one least-squares line
    t = latency + S / bandwidth through every published timing on that link."""
    points: dict[str, list[tuple[float, float]]] = {}
    for row in read_table("allreduce_timings.csv"):
        points.setdefault(row["link"], []).append((float(row["bytes"]), float(row["time_us"]) * 1e-6))
    fits = {}
    for link, pts in points.items():
        s, t = np.array(pts).T
        slope, intercept = np.polyfit(s, t, 1)
        fits[link] = (float(intercept), float(1 / slope))
    return fits


def custom_all_reduce(link: Link, nbytes: float, devices: int) -> Cost | None:
    """vLLM's own NVLink all-reduce where it runs and has published timings: 2, 4, 6 or 8 GPUs
    of one NVLink link, below its symmetric-memory cap. The bytes are the one-shot kernel's
    below its one-stage cap, else the two-shot (ring) count."""
    if link.link_class != "nvlink" or devices not in CUSTOM_SIZES or link.name not in custom_fits():
        return None
    if nbytes >= SYMM_MEM_MAX_BYTES[devices]:
        return None
    latency, bw = custom_fits()[link.name]
    one_shot = nbytes < min(CUSTOM_MAX_BYTES[devices], ONE_STAGE_MAX_BYTES[devices])
    moved = one_shot_bytes(nbytes, devices) if one_shot else ring_bytes(nbytes, devices)
    kind = "one-shot" if one_shot else ("two-shot" if nbytes < CUSTOM_MAX_BYTES[devices]
                                        else "symmetric-memory multimem")
    return Cost(latency, nbytes / bw, f"vLLM {kind} (fit to H100 timings)", moved)


def all_reduce(link: Link, nbytes: float, devices: int) -> Cost:
    """What an engine's all-reduce of ``nbytes`` over ``devices`` costs: vLLM's own kernels
    where it has them, else NCCL's best algorithm and protocol."""
    return custom_all_reduce(link, nbytes, devices) or nccl_all_reduce(link, nbytes, devices)


# --- expert parallelism's all-to-all ----------------------------------------------------

DEEPEP_KERNELS = ("rdma", "nvlink")   # low-latency: Feb 2025 (every peer over the NIC); June 2025 (PR 173)
SCALE_BYTES, HEADER_BYTES = 4, 16     # DeepEP dispatch message: FP8 codes, a float scale per
                                      # 128 channels, a 16-byte source-index header


@functools.cache
def deepep_rows(kernel: str | None = None) -> list[dict]:
    """``data/deepep.csv`` (one kernel version's rows, or all)."""
    text = ("kernel", "commit", "date", "source", "where", "notes")
    rows = [{k: (v if k in text else float(v) if v.strip() else math.nan) for k, v in row.items()}
            for row in read_table("deepep.csv")]
    return [r for r in rows if kernel in (None, r["kernel"])]


@dataclass(frozen=True)
class ExpertAllToAll:
    """Dispatch and combine of expert parallelism over ``ep`` GPUs, ``gpus_per_node`` to a node,
    each GPU with its own NIC (``link``), by DeepEP's low-latency kernels.

    Each token sends ``experts_per_token`` rows at the dispatch and gets as many back at the
    combine. ``kernel`` is DeepEP's version: "rdma" sends every row not bound for the GPU itself
    through its NIC, (ep - 1) / ep of them under even routing; "nvlink" sends same-node rows over
    NVLink, (ep - gpus_per_node) / ep through the NIC. The NIC's rows move at the bandwidth
    DeepEP achieved through it in its pure-RDMA table (interpolated in the EP width), with no
    fixed cost; or, with ``fixed_latency``, at the line rate plus the remainder of DeepEP's time
    as a per-call latency. The two agree at DeepEP's 128 tokens; they bound the price away from it."""

    ep: int
    experts_per_token: int
    hidden: int
    link: Link
    gpus_per_node: int = 8
    layers: int = 1                                   # MoE layers: calls per step, each phase
    kernel: str = "rdma"
    fixed_latency: bool = False

    def __post_init__(self):
        if self.kernel not in DEEPEP_KERNELS:
            raise ValueError(f"kernel must be one of {DEEPEP_KERNELS}, got {self.kernel!r}")

    def row_bytes(self, phase: str) -> float:
        """Bytes of one routed row: DeepEP's dispatch message, or a bf16 row at the combine."""
        if phase == "dispatch":
            return self.hidden + SCALE_BYTES * self.hidden / 128 + HEADER_BYTES
        if phase == "combine":
            return 2 * self.hidden
        raise ValueError(f"phase must be 'dispatch' or 'combine', got {phase!r}")

    def bytes_per_token(self, phase: str) -> float:
        """Bytes a token's rows make in one layer's ``phase`` (every routed copy)."""
        return self.experts_per_token * self.row_bytes(phase)

    @property
    def remote_share(self) -> float:
        """Share of the rows that cross the NIC under even routing."""
        near = 1 if self.kernel == "rdma" else self.gpus_per_node
        return max(0.0, (self.ep - near) / self.ep)

    def nic_bytes_per_token(self, phase: str) -> float:
        """Bytes of one token's rows that cross its GPU's NIC in one layer's ``phase``."""
        return self.remote_share * self.bytes_per_token(phase)

    def _published(self, phase: str) -> tuple[list[float], list[float], list[float]]:
        """DeepEP's pure-RDMA rows: EP widths, times (s) and NIC bytes at its own batch."""
        rows = sorted(deepep_rows("rdma"), key=lambda r: r["ep"])
        eps = [r["ep"] for r in rows]
        if not eps[0] <= self.ep <= eps[-1]:
            raise ValueError(f"DeepEP publishes EP {eps[0]:.0f} to {eps[-1]:.0f}, not {self.ep}")
        at = [ExpertAllToAll(int(r["ep"]), int(r["topk"]), int(r["hidden"]), self.link,
                             kernel="rdma") for r in rows]
        nic = [r["tokens"] * a.nic_bytes_per_token(phase) for r, a in zip(rows, at)]
        return eps, [r[f"{phase}_us"] * 1e-6 for r in rows], nic

    def nic_bandwidth(self, phase: str) -> float:
        """Bytes/s through the NIC that DeepEP's pure-RDMA kernel achieved at this EP width."""
        eps, times, nic = self._published(phase)
        return float(np.interp(self.ep, eps, [b / t for b, t in zip(nic, times)]))

    def latency_s(self, phase: str) -> float:
        """The fixed cost per call: none, or (``fixed_latency``) DeepEP's time less its NIC
        bytes at the line rate."""
        if not self.fixed_latency:
            return 0.0
        eps, times, nic = self._published(phase)
        return float(np.interp(self.ep, eps, [t - b / self.link.bandwidth
                                              for b, t in zip(nic, times)]))

    def cost(self, phase: str, tokens: float) -> Cost:
        """One layer's ``phase`` for ``tokens`` tokens on this GPU."""
        rate = self.link.bandwidth if self.fixed_latency else self.nic_bandwidth(phase)
        moved = tokens * self.nic_bytes_per_token(phase)
        bound = "line rate + fixed latency" if self.fixed_latency else "achieved NIC bandwidth"
        return Cost(self.latency_s(phase), moved / rate, f"DeepEP {phase}, {bound}", moved)


# --- DeepEP's normal (high-throughput) kernels: training and prefill -----------------------

def distinct_destinations(destinations: int, picks: int) -> float:
    """Expected distinct destinations among ``picks`` independent uniform picks of ``destinations``."""
    return destinations * (1 - (1 - 1 / destinations) ** picks)


@dataclass(frozen=True)
class PrefillAllToAll:
    """Dispatch and combine by DeepEP's normal kernels, the ones for training and prefill: large
    batches (its table: 4,096 tokens a GPU), no per-call figure published. Within a node (EP up
    to ``gpus_per_node``) a token's row goes once to each GPU among its experts' over NVLink; across
    nodes once to each node it routes to (DeepSeek-V3's node-limited routing: at most
    ``max_nodes``), through the NIC, and NVLink forwards it there. The bytes are DeepEP's logical
    count (its tests: an FP8 row of hidden x (1 + 4/128) bytes at the dispatch, a BF16 row at the
    combine, per destination), moved at the bottleneck bandwidth DeepEP published at the nearest
    EP widths (interpolated)."""

    ep: int
    experts_per_token: int
    hidden: int
    gpus_per_node: int = 8
    max_nodes: int = 4
    layers: int = 1

    def row_bytes(self, phase: str) -> float:
        if phase == "dispatch":
            return self.hidden * (1 + SCALE_BYTES / 128)
        if phase == "combine":
            return 2 * self.hidden
        raise ValueError(f"phase must be 'dispatch' or 'combine', got {phase!r}")

    @property
    def intranode(self) -> bool:
        return self.ep <= self.gpus_per_node

    def destinations_per_token(self) -> float:
        """GPUs (within a node) or nodes (across nodes) one token's rows go to, on average."""
        if self.intranode:
            return distinct_destinations(self.ep, self.experts_per_token)
        nodes = min(math.ceil(self.ep / self.gpus_per_node), self.max_nodes)
        return distinct_destinations(nodes, self.experts_per_token)

    def bytes_per_token(self, phase: str) -> float:
        """Logical bytes of one token in one layer's ``phase`` (NVLink within a node, RDMA across)."""
        return self.destinations_per_token() * self.row_bytes(phase)

    def bandwidth(self, phase: str) -> float:
        """DeepEP's published bottleneck bandwidth at this width (bytes/s): NVLink at EP 8, RDMA
        across nodes, interpolated between the published widths."""
        rows = sorted(deepep_rows("normal"), key=lambda r: r["ep"])
        if self.intranode:
            return rows[0][f"{phase}_gbs"] * 1e9
        across = [r for r in rows if r["ep"] > self.gpus_per_node]
        eps = [r["ep"] for r in across]
        if not eps[0] <= self.ep <= eps[-1]:
            raise ValueError(f"DeepEP publishes its normal kernels at EP {eps[0]:.0f} to "
                             f"{eps[-1]:.0f} across nodes, not {self.ep}")
        return float(np.interp(self.ep, eps, [r[f"{phase}_gbs"] * 1e9 for r in across]))

    def cost(self, phase: str, tokens: float) -> Cost:
        """One layer's ``phase`` for ``tokens`` tokens on this GPU: bytes at the bandwidth, no
        fixed cost (none is published; at thousands of tokens a call it is small)."""
        moved = tokens * self.bytes_per_token(phase)
        domain = "NVLink" if self.intranode else "RDMA"
        return Cost(0.0, moved / self.bandwidth(phase), f"DeepEP normal {phase}, {domain}", moved)
