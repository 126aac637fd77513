"""Collectives between devices: what one all-reduce or all-to-all costs, from sourced figures.

A collective costs a fixed time per call plus its bytes over the link: nccl-tests'
``doc/PERFORMANCE.md`` puts a call's time at "overhead + size / bw", and defines the *bus
bandwidth* against which a collective's bytes are counted. The step-time model
(``inferlab.analysis.step_time``) charges each collective a step makes through this module.

**All-reduce.** For a message of S bytes on N ranks, the algorithms move per rank:

- ring (NCCL; its tree and NVLink SHARP algorithms are not modelled): 2 (N - 1) steps, each rank
  sends and receives 2 (N - 1) / N x S bytes, the least an algorithm built from point-to-point
  transfers can move (nccl-tests PERFORMANCE.md); bandwidth-optimal, its latency grows with N;
- one-shot (engines' custom kernels): every rank reads all N - 1 peers' whole buffers and adds
  them, (N - 1) x S bytes in per rank, but a single synchronisation: latency-optimal;
- two-shot: a reduce-scatter then an all-gather, 2 (N - 1) / N x S bytes like the ring, in two
  synchronisations.

Prices, each from its own source:

- **NCCL**, on any link: NCCL's own cost model (``data/collectives.csv``, read in NCCL 2.30.7's
  ``src/graph/tuning.cc``): a ring all-reduce costs a base latency plus one hop latency per step
  plus its bus bytes over the bus bandwidth, for two protocols, LL (low latency, half the
  bandwidth) and Simple (the whole bandwidth, a larger latency); NCCL picks the faster. The bus
  bandwidth is the link's measured nccl-tests figure where one is published
  (``data/links.csv`` ``bus_bandwidth_gbs``), else its line rate (an upper bound).
- **Custom all-reduce** on NVLink: engines replace NCCL for small messages (vLLM, below 8 MiB on
  2, 4, 6 or 8 fully connected GPUs, one-shot under 256 KiB on 8 and two-shot above). Its price
  is a least-squares line, latency + S / bandwidth, through SGLang's published H100 timings of
  its custom all-reduce at 2, 4 and 8 GPUs (``data/allreduce_timings.csv``); only the link it
  was measured on has one.

**All-to-all** (expert parallelism's dispatch and combine): ``ExpertAllToAll`` prices DeepEP's
low-latency kernels from their published timings (``data/deepep.csv``): each token sends k rows
(FP8 with one scale per 128 channels at the dispatch, a scale counted as 4 bytes; bf16 at the
combine), the rows bound for other nodes cross the GPU's NIC at its line rate, and what the
published time leaves over is a per-call latency.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from inferlab.data import read_table

LINK_CLASSES = ("nvlink", "pcie", "network")
CUSTOM_MAX_BYTES = 8 * 2**20      # vLLM's CustomAllreduce max_size: larger messages go to NCCL
CUSTOM_SIZES = (2, 4, 6, 8)       # vLLM's CustomAllreduce._SUPPORTED_WORLD_SIZES


@dataclass(frozen=True)
class Cost:
    """One collective call: a fixed latency and the time its bytes take over the link."""

    latency_s: float
    transfer_s: float
    how: str

    @property
    def seconds(self) -> float:
        return self.latency_s + self.transfer_s


@dataclass(frozen=True)
class Link:
    """A link between devices: its line rate, its class (which latencies apply) and the bus
    bandwidth collectives reach on it."""

    name: str
    bandwidth: float              # line rate, bytes/s in one direction
    link_class: str = "ideal"     # nvlink, pcie, network; ideal: no latency, the line rate
    bus_bandwidth: float | None = None   # measured all-reduce bus bandwidth, bytes/s

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
                return cls(name, float(row["bandwidth_gbs_per_direction"]) * 1e9,
                           row["link_class"], float(bus) * 1e9 if bus else None)
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


# --- NCCL ------------------------------------------------------------------------------

@functools.cache
def nccl_model() -> dict[str, list[dict]]:
    """``data/collectives.csv`` by link class: NCCL's base and per-step latencies (seconds) and
    its protocols' share of the bus bandwidth."""
    out: dict[str, list[dict]] = {c: [] for c in LINK_CLASSES}
    for row in read_table("collectives.csv"):
        out[row["link_class"]].append({"protocol": row["protocol"],
                                       "base_s": float(row["base_latency_us"]) * 1e-6,
                                       "step_s": float(row["step_latency_us"]) * 1e-6,
                                       "share": float(row["bandwidth_share"])})
    return out


def _nccl(link: Link, traffic: float, steps: int, protocol: str | None, what: str) -> Cost:
    """NCCL's model for ``steps`` ring steps moving ``traffic`` bytes per rank: the faster
    protocol, or ``protocol``."""
    if link.link_class == "ideal":
        return Cost(0.0, traffic / link.bandwidth, f"{what} at the line rate")
    costs = [Cost(p["base_s"] + steps * p["step_s"], traffic / (p["share"] * link.bus),
                  f"NCCL {what}, {p['protocol']}")
             for p in nccl_model()[link.link_class] if protocol in (None, p["protocol"])]
    if not costs:
        raise ValueError(f"no NCCL protocol {protocol!r} for {link.link_class} links")
    return min(costs, key=lambda c: c.seconds)


def nccl_all_reduce(link: Link, nbytes: float, devices: int, protocol: str | None = None) -> Cost:
    """A ring all-reduce by NCCL's own cost model: 2 (N - 1) steps, the ring's bytes; the faster
    protocol, or ``protocol``."""
    if devices < 2:
        return Cost(0.0, 0.0, "none")
    return _nccl(link, ring_bytes(nbytes, devices), 2 * (devices - 1), protocol, "ring")


def send(link: Link, nbytes: float) -> Cost:
    """One transfer of ``nbytes`` to the next device (a pipeline's hop), priced as a single step
    of NCCL's model on this link: its base latency, one hop, the bytes at a protocol's share
    of the bus bandwidth. (NCCL's table is for collectives; the course applies it to one step.)"""
    return _nccl(link, nbytes, 1, None, "send")


# --- the engines' custom all-reduce ----------------------------------------------------

@functools.cache
def custom_fits() -> dict[tuple[str, int], tuple[float, float]]:
    """(link, devices) -> (latency s, bandwidth bytes/s of the message): a least-squares line
    t = latency + S / bandwidth through each group size's published timings."""
    points: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for row in read_table("allreduce_timings.csv"):
        points.setdefault((row["link"], int(row["devices"])), []).append(
            (float(row["bytes"]), float(row["time_us"]) * 1e-6))
    fits = {}
    for key, pts in points.items():
        s, t = np.array(pts).T
        slope, intercept = np.polyfit(s, t, 1)
        fits[key] = (float(intercept), float(1 / slope))
    return fits


def custom_all_reduce(link: Link, nbytes: float, devices: int) -> Cost | None:
    """The engines' custom all-reduce, where it runs and has published timings: 2, 4, 6 or 8
    GPUs on one NVLink link, below 8 MiB (6 GPUs: between the fits for 4 and 8)."""
    fits = custom_fits()
    if devices not in CUSTOM_SIZES or nbytes >= CUSTOM_MAX_BYTES or link.link_class != "nvlink":
        return None
    if (link.name, devices) in fits:
        latency, bw = fits[(link.name, devices)]
    elif devices == 6 and {(link.name, 4), (link.name, 8)} <= fits.keys():
        (l4, b4), (l8, b8) = fits[(link.name, 4)], fits[(link.name, 8)]
        latency, bw = (l4 + l8) / 2, 2 / (1 / b4 + 1 / b8)
    else:
        return None
    return Cost(latency, nbytes / bw, "custom all-reduce (fit to published timings)")


def all_reduce(link: Link, nbytes: float, devices: int) -> Cost:
    """What an engine's all-reduce of ``nbytes`` over ``devices`` costs: its custom kernel where
    it has one (vLLM's rule), else NCCL."""
    return custom_all_reduce(link, nbytes, devices) or nccl_all_reduce(link, nbytes, devices)


# --- expert parallelism's all-to-all ----------------------------------------------------

FP8_DISPATCH_BYTES = 1 + 4 / 128   # FP8 codes plus one 4-byte scale per 128 channels (DeepEP)
BF16_COMBINE_BYTES = 2


@functools.cache
def deepep_rows() -> list[dict]:
    return [{k: (float(v) if k not in ("kernels", "source", "where", "notes") else v)
             for k, v in row.items()} for row in read_table("deepep.csv")]


@dataclass(frozen=True)
class ExpertAllToAll:
    """Dispatch and combine of expert parallelism over ``ep`` GPUs, ``gpus_per_node`` to a node
    joined by NVLink, each GPU with its own NIC (``link``).

    Each token sends ``experts_per_token`` rows of ``hidden`` elements at the dispatch and gets
    as many back at the combine (DeepEP counts every routed copy). The rows bound for other
    nodes, a share (ep - gpus_per_node) / ep under even routing, cross the NIC at its line rate;
    the rest stays on NVLink, which the model does not charge. The per-call latency is what
    DeepEP's published time at its own batch leaves over after those bytes
    (``data/deepep.csv``, interpolated in the EP width)."""

    ep: int
    experts_per_token: int
    hidden: int
    link: Link
    gpus_per_node: int = 8
    layers: int = 1                                   # MoE layers: calls per step, each phase
    dispatch_bytes_per_element: float = FP8_DISPATCH_BYTES
    combine_bytes_per_element: float = BF16_COMBINE_BYTES

    def row_bytes(self, phase: str) -> float:
        per = {"dispatch": self.dispatch_bytes_per_element,
               "combine": self.combine_bytes_per_element}[phase]
        return self.hidden * per

    def bytes_per_token(self, phase: str) -> float:
        """Bytes a token's rows make in one layer's ``phase`` (every routed copy)."""
        return self.experts_per_token * self.row_bytes(phase)

    @property
    def remote_share(self) -> float:
        return max(0.0, (self.ep - self.gpus_per_node) / self.ep)

    def nic_bytes_per_token(self, phase: str) -> float:
        """Bytes of one token's rows that cross its GPU's NIC in one layer's ``phase``."""
        return self.remote_share * self.bytes_per_token(phase)

    def latency_s(self, phase: str) -> float:
        """The published time at DeepEP's batch less its NIC bytes at the line rate."""
        rows = sorted(deepep_rows(), key=lambda r: r["ep"])
        residual = []
        for r in rows:
            share = max(0.0, (r["ep"] - self.gpus_per_node) / r["ep"])
            nic = share * r["tokens"] * r["topk"] * r["hidden"] * {
                "dispatch": self.dispatch_bytes_per_element,
                "combine": self.combine_bytes_per_element}[phase]
            residual.append(r[f"{phase}_us"] * 1e-6 - nic / self.link.bandwidth)
        eps = [r["ep"] for r in rows]
        if not eps[0] <= self.ep <= eps[-1]:
            raise ValueError(f"DeepEP publishes EP {eps[0]:.0f} to {eps[-1]:.0f}, not {self.ep}")
        return float(np.interp(self.ep, eps, residual))

    def cost(self, phase: str, tokens: float) -> Cost:
        """One layer's ``phase`` for ``tokens`` tokens on this GPU."""
        return Cost(self.latency_s(phase),
                    tokens * self.nic_bytes_per_token(phase) / self.link.bandwidth,
                    f"DeepEP low-latency {phase}")
