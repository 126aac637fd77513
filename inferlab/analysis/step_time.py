"""One model of time: what a forward pass (a serving step) costs, kernel by kernel.

Every modelled time in the course (the simulator, token costs, request times, the explorer and
calculators, speculation at batch, the disaggregated cluster) comes from ``StepModel.seconds``.
A step's kernels run one after another, so a step costs the **sum** of each kernel's own
roofline, max(FLOPs / peak, bytes / bandwidth) (Williams, Waterman and Patterson 2009), not one
roofline for the whole pass (which would let attention's cache reads hide under the linear
layers' arithmetic). Four kernel classes:

- ``linear``: the projections and the MLP of every layer. 2 FLOPs per weight per new token;
  the weights are read once per step, whatever the batch.
- ``attention``: the new tokens' queries against the cache. 4 H D FLOPs per layer per
  (query, key) pair; bytes: each row reads its whole held cache (the K/V it just wrote included,
  as a paged kernel does) and writes its new tokens' K/V. Sliding windows cap the keys, GQA/MQA
  shrink the cache (``formulas.kv_bytes_per_token``), MLA's latent cache is an ``Attention``
  built by ``inferlab.analysis.mla.attention_cost``.
- ``lm_head``: the output projection, for one position per row (engines compute logits only
  where a token is sampled): 2 V d FLOPs per row, its V x d weights read once. The input
  embedding is a lookup of one row per token and is not priced.
- ``collective``: split over N devices by tensor parallelism, every kernel does 1/N of the
  work (except that the KV cache splits only over its KV heads, ``Attention.kv_split``: beyond
  them each device reads whole copies, and MLA's single latent is read in full by every
  device), and each layer ends its attention and its MLP with an all-reduce of the step's
  activations; the vocab-parallel input embedding adds one all-reduce and the vocab-split LM
  head one gather of the logits (vLLM's ``VocabParallelEmbedding`` and ``LogitsProcessor``):
  Llama-3-70B at N = 8 makes 161 all-reduces and a gather a step. Each call costs a latency plus
  its bytes over the link (``inferlab.analysis.collectives``: vLLM's NVLink kernels where they
  run, else NCCL's best algorithm and protocol); the kernel keeps the two apart (``latency_s``
  and ``memory_s``) and counts the bytes through one device's link.
- ``dispatch`` and ``combine``: expert parallelism's all-to-alls when a step is given an
  ``ExpertAllToAll``, one of each per MoE layer, in the precisions they travel in.

Communication can hide under computation only when a step is cut into micro-batches
(``overlapped_s``, DeepSeek's two-batch overlap): each micro-batch reads the weights and pays
every call's latency again, and the step costs the larger of the two sums, never their sum
minus both.

A fixed ``overhead_s`` per pass (launches, Python) can be added. Precision is set separately
for the weights, the KV cache and the arithmetic (``Precision``); the arithmetic's peak is the
device's dense figure for that format in ``data/hardware.csv``. Attention may run its
arithmetic in a format of its own (``Attention.compute``: DeepSeek's service runs core MLA in
BF16 beside FP8 matmuls), priced at that format's peak (``attention_peak_flops``).

Which numbers count as "weight bytes": ``formulas.weight_bytes`` is what the weights *occupy*
(the input embedding included: it sits in memory); what a step *reads* is the sum of the linear
and LM-head kernels' bytes, which leave the untied input embedding out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

import numpy as np

from inferlab.analysis import formulas
from inferlab.analysis.collectives import ExpertAllToAll, Link, all_reduce, nccl_gather
from inferlab.analysis.hardware import DeviceSpec, get_device_spec
from inferlab.model.config import ModelConfig

ACTIVATION_BYTES = 2  # the all-reduced activations travel in 16-bit
COMMUNICATION = ("collective", "dispatch", "combine")   # the kernels that use the link


@dataclass(frozen=True)
class Precision:
    """Bytes per weight, bytes per cached K/V number, and the format the arithmetic runs in."""

    name: str
    bytes_per_weight: float
    bytes_per_kv: float
    compute: str = "bfloat16"  # "bfloat16", "float16", "fp8" or "fp4": which peak to use
    note: str = ""


PRECISIONS = {p.name: p for p in (
    Precision("bf16", 2, 2, "bfloat16", "weights, KV cache and arithmetic in bfloat16"),
    Precision("fp16", 2, 2, "float16", "weights, KV cache and arithmetic in float16"),
    Precision("int8 weights", 1, 2, "bfloat16", "weight-only int8 (W8A16); KV cache in bfloat16"),
    Precision("int4 weights", 0.5, 2, "bfloat16",
              "weight-only int4 (W4A16); KV cache in bfloat16"),  # the codes alone, no scales
    # The same format as served (GPTQ, AWQ, Marlin): a 16-bit scale per group of 128 weights,
    # 4.125 bits a weight, as Chapter 5 prices its decode floors (formulas.quantized_bytes_per_weight).
    Precision("int4 weights g128", formulas.quantized_bytes_per_weight(4, 128), 2, "bfloat16",
              "weight-only int4 (W4A16) with a 16-bit scale per 128 weights; KV cache in bfloat16"),
    Precision("fp8 weights and KV", 1, 1, "bfloat16",
              "8-bit weights and an 8-bit KV cache, arithmetic in bfloat16"),
    Precision("fp8", 1, 1, "fp8", "FP8 weights, activations and KV cache (W8A8 on FP8 tensor cores)"),
)}
_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}


def precision(p: "Precision | str") -> Precision:
    """A ``Precision`` from itself, a name of ``PRECISIONS``, or a torch dtype name (weights,
    cache and arithmetic all in that dtype; float32 has no table peak)."""
    if isinstance(p, Precision):
        return p
    name = str(p).removeprefix("torch.")
    if name in PRECISIONS:
        return PRECISIONS[name]
    if name in _DTYPES:
        return PRECISIONS[_DTYPES[name]]
    if name == "float32":
        return Precision("fp32", 4, 4, "float32", "float32 throughout")
    raise ValueError(f"unknown precision {p!r}; choose one of {', '.join(PRECISIONS)} "
                     f"or {', '.join(_DTYPES)}")


# Beyond ``PRECISIONS``, the formats Chapter 8 prices (``inferlab.sim.token_cost``) and the
# chips of 2026 compute (``inferlab.analysis.chip_costs``), with the sizes read at a precision.
# 4-bit floats with their block scales (E2M1 elements; one scale per block). NVFP4 is NVIDIA's
# production format on Blackwell (16-element blocks, an E4M3 scale, and one FP32 scale per
# tensor, negligible per weight): 4.5 bits a weight. MXFP4 is the OCP MX format AMD's MI355X
# computes (32-element blocks, an E8M0 scale): 4.25 bits. Both run at the chip's FP4 peak with
# 4-bit activations (W4A4); the K/V cache stays in FP8 (our choice, stated where priced).
E2M1_BITS, SCALE_BITS = 4, 8
NVFP4_BLOCK, MX_BLOCK = 16, 32
NVFP4 = Precision("nvfp4", (E2M1_BITS + SCALE_BITS / NVFP4_BLOCK) / 8, 1, "fp4",
                  "NVFP4 weights and activations on FP4 tensor cores (E2M1 in blocks of 16 with an "
                  "E4M3 scale: 4.5 bits a weight); FP8 KV cache")
MXFP4 = Precision("mxfp4", (E2M1_BITS + SCALE_BITS / MX_BLOCK) / 8, 1, "fp4",
                  "MXFP4 weights and activations on FP4 tensor cores (E2M1 in blocks of 32 with an "
                  "E8M0 scale: 4.25 bits a weight); FP8 KV cache")
FOUR_BIT = {p.name: p for p in (NVFP4, MXFP4)}


def cost_precision(prec: Precision | str) -> Precision:
    """A precision by name: one of ``FOUR_BIT``, else ``precision``."""
    if isinstance(prec, str) and prec in FOUR_BIT:
        return FOUR_BIT[prec]
    return precision(prec)


def weight_bytes(config: ModelConfig, prec: Precision | str) -> float:
    """Bytes the weights occupy at ``prec`` (``formulas.weight_bytes``: input embedding included)."""
    return formulas.weight_bytes(config, cost_precision(prec).bytes_per_weight)


def kv_bytes_per_token(config: ModelConfig, prec: Precision | str) -> float:
    """KV-cache bytes per token at ``prec`` (``formulas.kv_bytes_per_token``)."""
    return formulas.kv_bytes_per_token(config, cost_precision(prec).bytes_per_kv)


def link_bandwidth(name: str) -> float:
    """One direction of a link of ``data/links.csv``, in bytes/s (its line rate)."""
    return Link.named(name).bandwidth


def as_link(link: "Link | str | float") -> Link:
    """A ``Link`` from itself, a name of ``data/links.csv``, or a bare bandwidth in bytes/s (a
    link with no latency)."""
    if isinstance(link, Link):
        return link
    return Link.named(link) if isinstance(link, str) else Link.ideal(float(link))


@dataclass(frozen=True)
class Attention:
    """What attention costs per cached token and per (query, key) pair, over the whole model."""

    kv_bytes_per_token: float  # cached bytes per token, all layers
    flops_per_pair: float      # FLOPs per (query, key) pair, all layers
    window: int | None = None  # keys each query sees at most (sliding window)
    compute: str | None = None  # the format its arithmetic runs in; None: the model's
    kv_heads: int | None = None  # cached heads tensor parallelism can split; None: any split

    def kv_split(self, devices: int) -> int:
        """Over how many devices the cache is split: the devices, up to the cached heads. A
        head cannot be split, so beyond them every device holds (and reads) whole copies:
        MLA's one latent is read in full by every device of a tensor-parallel group."""
        return devices if self.kv_heads is None else max(1, min(devices, self.kv_heads))

    @classmethod
    def of(cls, config, prec: Precision) -> "Attention":
        """Grouped-query (MHA, GQA, MQA) attention of a Llama-shaped ``config``."""
        return cls(formulas.kv_bytes_per_token(config, prec.bytes_per_kv),
                   4 * config.n_layers * config.n_heads * config.head_dim,
                   getattr(config, "sliding_window", None), kv_heads=config.n_kv_heads)


@dataclass(frozen=True)
class Kernel:
    """One kernel class's share of a step: its FLOPs and bytes, and the time each would take
    alone on one device's share of the work; the kernel takes the larger. A communication
    kernel's time is its calls' latencies plus its bytes' time on the link."""

    name: str
    flops: float
    bytes: float
    compute_s: float
    memory_s: float        # for communication: the bytes' time on the link
    latency_s: float = 0.0  # fixed time per call, summed over the step's calls

    @property
    def seconds(self) -> float:
        t = np.maximum(self.compute_s, self.memory_s) + self.latency_s  # numbers or arrays
        return float(t) if np.ndim(t) == 0 else t

    @property
    def bound(self) -> str:
        if self.name in COMMUNICATION:
            return "latency" if np.all(self.latency_s > self.memory_s) else "link"
        return "compute" if self.compute_s > self.memory_s else "memory"


@dataclass(frozen=True)
class Shape:
    """A step's shape in the numbers its kernels are priced on (sums over rows)."""

    tokens: float        # new tokens through every matmul
    rows: float          # LM-head positions: one per sequence (k + 1 in a verification)
    pairs: float         # (query, key) pairs attention scores
    kv_read: float       # cached tokens attention reads (each row's held cache)
    kv_written: float    # tokens whose K/V the step writes

    @classmethod
    def of_rows(cls, rows: Iterable[tuple[float, float]], window: int | None = None) -> "Shape":
        """Rows of (new tokens n, cached tokens c): a decode is (1, c), a prefill (P, 0), a
        chunk (n, c). The i-th new token attends to min(c + i, window) keys."""
        tokens = n_rows = pairs = read = 0.0
        for n, c in rows:
            if n <= 0:
                continue
            tokens, n_rows = tokens + n, n_rows + 1
            if window is None or c + n <= window:
                pairs += n * c + n * (n + 1) / 2
            else:
                full = max(0.0, min(n, window - c))  # queries that still see every key
                pairs += full * c + full * (full + 1) / 2 + (n - full) * window
            read += c + n if window is None else min(c + n, window)
        return cls(tokens, n_rows, pairs, read, tokens)

    def times(self, count: float) -> "Shape":
        """``count`` copies of this shape in one step (identical rows)."""
        return Shape(self.tokens * count, self.rows * count, self.pairs * count,
                     self.kv_read * count, self.kv_written * count)

    def __add__(self, other: "Shape") -> "Shape":
        return Shape(self.tokens + other.tokens, self.rows + other.rows, self.pairs + other.pairs,
                     self.kv_read + other.kv_read, self.kv_written + other.kv_written)

    @classmethod
    def decode_rows(cls, cached, window: int | None = None) -> "Shape":
        """One decode row per element of ``cached`` (a number or a numpy array, priced
        element-wise: one shape per element)."""
        held = np.asarray(cached) + 1 if window is None else np.minimum(np.asarray(cached) + 1, window)
        return cls(1, 1, held, held, 1)

    @classmethod
    def decode(cls, batch: int, context_tokens: float) -> "Shape":
        """``batch`` decode rows that together hold ``context_tokens`` tokens (new ones
        included), each attending to all of its own."""
        return cls(batch, batch, context_tokens, context_tokens, batch)


@dataclass(frozen=True)
class StepModel:
    """The step-time model of one model on one device (or a tensor-parallel group of them)."""

    linear_params: float      # weights of the projections and MLPs (and norms)
    head_params: float        # the LM head's V x d
    d_model: int
    n_layers: int
    attention: Attention
    precision: Precision
    peak_flops: float | None  # FLOP/s of one device in the precision's format (None: no figure)
    bandwidth: float          # bytes/s of one device
    devices: int = 1
    link: Link | None = None   # between the devices (needed when devices > 1)
    overhead_s: float = 0.0
    efficiency: float = 1.0   # derates peak, bandwidth and link alike
    attention_peak_flops: float | None = None  # attention's own format's peak; None: peak_flops
    head_bytes_per_weight: float | None = None  # the LM head's own format; None: the precision's
    head_peak_flops: float | None = None        # and its peak; None: peak_flops

    @classmethod
    def for_device(cls, config, device: "DeviceSpec | str", prec: "Precision | str" = "bf16",
                   devices: int = 1, link: "Link | str | float | None" = None, overhead_s: float = 0.0,
                   efficiency: float = 1.0, attention: Attention | None = None,
                   require_peak: bool = True) -> "StepModel":
        """``config`` on ``device`` (a row of ``data/hardware.csv``) at ``prec``; ``devices``
        > 1 splits it by tensor parallelism over ``link`` (a ``Link``, a name of
        ``data/links.csv``, or bytes/s for a link with no latency; by default the device's
        ``gpu_link``)."""
        spec = get_device_spec(device) if isinstance(device, str) else device
        p = precision(prec)
        peak = spec.peak_flops(p.compute)
        if peak is None and require_peak:
            raise ValueError(f"{spec.name} has no {p.compute} peak in the hardware table")
        if devices < 1:
            raise ValueError(f"devices must be at least 1, got {devices}")
        link = link if link is not None or devices == 1 else (spec.gpu_link or None)
        if devices > 1 and link is None:
            raise ValueError(f"{spec.name} has no GPU link in the hardware table: name one of "
                             "data/links.csv to split a model over several devices")
        if not 0 < efficiency <= 1:
            raise ValueError(f"efficiency must lie in (0, 1], got {efficiency}")
        link = None if link is None else as_link(link)
        head = config.vocab_size * config.d_model
        attention = attention or Attention.of(config, p)
        attention_peak = None if attention.compute is None else spec.peak_flops(attention.compute)
        return cls(formulas.param_count(config, include_embeddings=False), head, config.d_model,
                   config.n_layers, attention, p, peak, spec.bandwidth, devices, link, overhead_s,
                   efficiency, attention_peak)

    @classmethod
    def for_roof(cls, config, peak_flops: float | None, bandwidth: float,
                 prec: "Precision | str" = "bf16", **kw) -> "StepModel":
        """``config`` on a device given by its two numbers (FLOP/s in the precision's format,
        bytes/s) rather than a table row."""
        spec = DeviceSpec("roof", "gpu", bandwidth, None, None, None, "given numbers")
        p = precision(prec)
        return replace(cls.for_device(config, spec, p, require_peak=False, **kw),
                       peak_flops=peak_flops)

    # --- the kernels --------------------------------------------------------------------
    def _roof(self, name: str, flops: float, nbytes: float, peak: float | None = None) -> Kernel:
        n, peak = self.devices, peak or self.peak_flops
        compute = 0.0 if peak is None else flops / (n * peak * self.efficiency)
        memory = nbytes / (n * self.bandwidth * self.efficiency)
        return Kernel(name, flops, nbytes, compute, memory)

    def kernels(self, shape: Shape, linear_bytes: float | None = None,
                experts: ExpertAllToAll | None = None) -> list[Kernel]:
        """Each kernel class's FLOPs, bytes and seconds for a step of ``shape`` (the whole
        group's FLOPs and bytes; the seconds are each device's share).

        ``linear_bytes``: what the linear kernels read this step when it is not every linear
        weight once. A mixture of experts computes with its active parameters but reads the
        experts its batch touches, which depends on the batch
        (``inferlab.analysis.moe_deployments``). ``experts``: this device's expert-parallel
        dispatch and combine, for the ``shape.tokens`` tokens it holds."""
        wb, a = self.precision.bytes_per_weight, self.attention
        if linear_bytes is None:
            linear_bytes = self.linear_params * wb
        out = [
            self._roof("linear", 2 * self.linear_params * shape.tokens, linear_bytes),
            self._roof("attention", a.flops_per_pair * shape.pairs,   # heads split; the cache
                       (shape.kv_read + shape.kv_written) * a.kv_bytes_per_token   # only over
                       * self.devices / a.kv_split(self.devices),        # its KV heads
                       self.attention_peak_flops),
            self._roof("lm_head", 2 * self.head_params * shape.rows, self.head_params
                       * (wb if self.head_bytes_per_weight is None else self.head_bytes_per_weight),
                       self.head_peak_flops),
        ]
        if self.devices > 1:
            out.append(self._collectives(shape.tokens, shape.rows))
        if experts is not None:
            for phase in ("dispatch", "combine"):
                cost = experts.cost(phase, shape.tokens)
                out.append(Kernel(phase, 0.0,
                                  experts.layers * shape.tokens * experts.nic_bytes_per_token(phase),
                                  0.0, experts.layers * cost.transfer_s / self.efficiency,
                                  experts.layers * cost.latency_s))
        return out

    def all_reduce_calls(self) -> int:
        """All-reduces a tensor-parallel step makes: one after attention and one after the MLP
        in every layer, and one for the vocab-parallel input embedding."""
        return 2 * self.n_layers + 1 if self.devices > 1 else 0

    def gather_calls(self) -> int:
        """Gathers a tensor-parallel step makes: the vocab-split logits, once."""
        return 1 if self.devices > 1 else 0

    def _collectives(self, tokens, rows) -> Kernel:
        """The step's collectives: ``all_reduce_calls`` all-reduces of ``tokens`` x d_model
        16-bit activations and one gather of ``rows`` x vocabulary 16-bit logits; their
        latencies, their bytes' time on the link, and the bytes through one device's link
        (each algorithm's own count)."""
        n, link = self.devices, self.link
        vocab = self.head_params / self.d_model
        act = np.asarray(tokens, dtype=float) * self.d_model * ACTIVATION_BYTES
        logits = np.broadcast_to(np.asarray(rows, dtype=float) * vocab * ACTIVATION_BYTES,
                                 act.shape)
        calls, gathers = self.all_reduce_calls(), self.gather_calls()
        costs = [(all_reduce(link, float(a), n), nccl_gather(link, float(g), n))
                 for a, g in zip(np.ravel(act), np.ravel(logits))]

        def total(field):
            v = np.reshape([calls * getattr(c, field) + gathers * getattr(g, field)
                            for c, g in costs], act.shape)
            return float(v) if np.ndim(v) == 0 else v
        return Kernel("collective", 0.0, total("bytes"), 0.0,
                      total("transfer_s") / self.efficiency, total("latency_s"))

    def seconds(self, shape: Shape, linear_bytes: float | None = None,
                experts: ExpertAllToAll | None = None) -> float:
        """THE step time: the sum of the kernels' rooflines and latencies, plus the fixed
        overhead."""
        if np.all(np.asarray(shape.tokens) <= 0):
            return 0.0
        total = sum(k.seconds for k in self.kernels(shape, linear_bytes, experts)) + self.overhead_s
        return float(total) if np.ndim(total) == 0 else total  # a number stays a Python float

    def overlap_sides(self, shape: Shape, linear_bytes: float | None = None,
                      experts: ExpertAllToAll | None = None,
                      micro_batches: int = 2) -> tuple[float, float]:
        """The two sides of ``overlapped_s``: (computation, communication), each summed over
        the ``micro_batches``. Each micro-batch reads the weights (``linear_bytes``: one
        micro-batch's) and pays every call's latency again, so either side may exceed its
        share of the step run in sequence."""
        if micro_batches < 1:
            raise ValueError(f"micro_batches must be at least 1, got {micro_batches}")
        ks = self.kernels(shape.times(1 / micro_batches), linear_bytes, experts)
        compute = micro_batches * sum(k.seconds for k in ks if k.name not in COMMUNICATION)
        talk = micro_batches * sum(k.seconds for k in ks if k.name in COMMUNICATION)
        return float(compute), float(talk)

    def overlapped_s(self, shape: Shape, linear_bytes: float | None = None,
                     experts: ExpertAllToAll | None = None, micro_batches: int = 2) -> float:
        """The step cut into ``micro_batches`` whose communication runs under one another's
        computation (DeepSeek's two-batch overlap). Overlap hides only the smaller of
        computation and communication (``overlap_sides``), so the step costs the larger."""
        return max(self.overlap_sides(shape, linear_bytes, experts, micro_batches)) \
            + self.overhead_s

    # --- the shapes callers ask about ---------------------------------------------------
    def rows_s(self, rows: Iterable[tuple[float, float]]) -> float:
        """One forward over rows of (new tokens, cached tokens)."""
        return self.seconds(Shape.of_rows(rows, self.attention.window))

    def prefill_s(self, n_tokens: int) -> float:
        """A whole prompt of ``n_tokens`` in one forward."""
        return self.rows_s([(n_tokens, 0)])

    def decode_s(self, batch: int, context_tokens: float) -> float:
        """``batch`` decodes whose caches hold ``context_tokens`` tokens in all (new included).
        Under a sliding window, pass the tokens held (``formulas.kv_tokens_held`` per row)."""
        return self.seconds(Shape.decode(batch, context_tokens))

    def step_s(self, chunks, batch: int, context_tokens: float) -> float:
        """A chunked step: prefill ``chunks`` of (new, cached) tokens beside ``batch`` decodes
        over ``context_tokens`` (the simulator's ``CostModel`` protocol)."""
        return self.seconds(Shape.of_rows(chunks, self.attention.window)
                            + Shape.decode(batch, context_tokens))

    def scaled(self, c: float) -> "StepModel":
        """A model ``c`` times this one in every weight and every cached number (a draft)."""
        a = self.attention
        return replace(self, linear_params=c * self.linear_params, head_params=c * self.head_params,
                       attention=replace(a, kv_bytes_per_token=c * a.kv_bytes_per_token,
                                         flops_per_pair=c * a.flops_per_pair))

    def weight_bytes_read(self) -> float:
        """Bytes of weights one step reads: the linear layers and the LM head, once."""
        return (self.linear_params + self.head_params) * self.precision.bytes_per_weight


def step_time(rows: Iterable[tuple[float, float]], config, device: "DeviceSpec | str",
              prec: "Precision | str" = "bf16", devices: int = 1,
              link: "Link | str | float | None" = None, overhead_s: float = 0.0) -> float:
    """Seconds of one forward over rows of (new tokens, cached tokens) of ``config`` on
    ``device``: ``StepModel.for_device(...).rows_s(rows)``."""
    return StepModel.for_device(config, device, prec, devices, link, overhead_s).rows_s(rows)


def old_single_max(model: StepModel, shape: Shape) -> float:
    """The model the course used before: the whole step as ONE roofline, max(all FLOPs / peak,
    all bytes / bandwidth). Kept only to print what changed (Chapter 7's table); no caller
    uses it to time anything."""
    ks = model.kernels(shape)
    flops, nbytes = sum(k.flops for k in ks), sum(k.bytes for k in ks if k.name not in COMMUNICATION)
    n = model.devices
    return max(flops / (n * model.peak_flops), nbytes / (n * model.bandwidth))
