"""What a token costs on the chips of 2026, at the precisions production runs, and owning them.

Three questions Chapter 8 asks of the newest chips, each answered from dated, sourced rows:

- **Cost per token at bf16, FP8 and FP4.** ``data/chips_2026.csv`` holds the GB300 NVL72 (one
  of its 72 GPUs), the HGX B300, the MI355X and the TPU7x (Ironwood): memory, bandwidth and a
  dense peak per format. ``decode_point`` times one decode step with the course's one step-time
  model (``inferlab.analysis.step_time.StepModel``: each kernel on its own roofline, the peak
  that of the precision's format), and ``best_point`` takes the largest batch whose step stays
  within a TPOT bound. FP8 halves the bytes of the weights and of the cache and runs at the FP8
  peak; FP4 halves the weights again and runs at the FP4 peak, in each vendor's production
  format (``inferlab.analysis.step_time``: NVFP4 on NVIDIA's chips, 16-element blocks with an
  E4M3 scale, 4.5 bits a weight; MXFP4 on AMD's, 32-element blocks with an E8M0 scale, 4.25
  bits), with the cache kept in FP8. A chip whose table row has no peak for a format cannot run
  it here (the TPU7x's page lists no FP4; the HBM4 chips announced for 2026 have no dense peak
  in any source read, so only their memory and bandwidth are used). A ``DecodePoint`` keeps
  its step's kernels, so each kernel class says for itself whether it is bound by its
  arithmetic or by its bytes (a sum over the kernels would hide a compute-bound matmul behind
  memory-bound attention). ``BYTES_ONLY`` is FP8's bytes without FP8's peak (1-byte weights and
  cache, 16-bit arithmetic: ``step_time``'s "fp8 weights and KV"), to tell the two apart.
- **Reasoning output as a cost driver.** ``api_request_usd`` prices one request from a row of
  ``data/api_prices_2026.csv`` (input, cached input, output, batch discount); a reasoning model
  bills its hidden chain of thought as output, so the output count, not the question, sets the
  bill. ``self_hosted_request_usd`` does the same on a chip: the cache grows with every
  thought token, so long outputs also make each token dearer (fewer sequences fit, each step
  reads more).
- **Owning against renting.** ``own_vs_rent`` compares a fleet sized for the daily peak and
  powered around the clock with renting chips hour by hour as a daily load cycle needs them.
  The power counted is the chip's published TDP, plus (when given) its share of the rest of the
  server's draw (CPUs, memory, NICs, switches, fans: from a vendor's maximum system power) and
  the data centre's overhead (its PUE, total facility power over IT power). What it returns is the break-even: the most an owned chip may
  cost a year (its price spread over its life, plus hosting, network and staff) for owning to
  be cheaper. The load cycle (``daily_load``) is a scenario the reader sets, not a measurement.

Every number comes from a row that names its source and date (``cost_input`` for single
numbers: electricity prices, rents, output lengths); a row without either is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferlab.analysis.hardware import DeviceSpec
from inferlab.analysis.prices import TokenPrice, checked_row, token_prices, usd_per_million
from inferlab.analysis.step_time import (MXFP4, NVFP4, PRECISIONS, Kernel, Precision, Shape,
    StepModel, kv_bytes_per_token, weight_bytes)
from inferlab.data import read_table
from inferlab.model.config import ModelConfig

CHIP_PRECISIONS = ("bf16", "fp8", "fp4")
BYTES_ONLY = "fp8 weights and KV"     # FP8's bytes at the 16-bit peak: not a format to serve
# The 4-bit format each vendor's FP4 peak is quoted for: NVFP4 is NVIDIA's production format on
# Blackwell (its developer blog "Introducing NVFP4", 2025-06-24); the MI355X computes MXFP4
# (the OCP MX format; the notes of its row in data/chips_2026.csv).
FP4_FORMAT = {"NVIDIA": NVFP4, "AMD": MXFP4}
FP4 = MXFP4   # the OCP MX format by its old name here (``moe_deployments``: gpt-oss's experts)
UNITS = {"GB": 1e9, "GiB": 2**30}


def _num(text: str, scale: float = 1.0) -> float | None:
    """A table cell: empty stays None (a number no source gave), never a guess."""
    return float(text) * scale if text.strip() else None


# --- the chips --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Chip:
    """One row of ``data/chips_2026.csv``: the roofline's numbers and the published power."""

    spec: DeviceSpec
    vendor: str
    tdp_w: float | None
    date: str
    status: str          # of the source: "secondary", ...
    availability: str    # "shipping", or what was announced and when it ships

    @property
    def shipping(self) -> bool:
        return self.availability == "shipping"

    @property
    def name(self) -> str:
        return self.spec.name


def load_chips() -> dict[str, Chip]:
    """Every row of ``data/chips_2026.csv``, checked, in table order."""
    out = {}
    for row in (checked_row(r, "chips_2026.csv") for r in read_table("chips_2026.csv")):
        spec = DeviceSpec(row["name"], row["kind"], _num(row["bandwidth_gbs"], 1e9),
                          _num(row["peak_bf16_tflops"], 1e12), None,
                          _num(row["memory"], UNITS[row["memory_unit"]]), row["source"],
                          row["notes"], memory_kind="HBM",
                          peak_fp8=_num(row["peak_fp8_tflops"], 1e12),
                          peak_fp4=_num(row["peak_fp4_tflops"], 1e12), gpu_link=row["gpu_link"])
        out[spec.name] = Chip(spec, row["vendor"], _num(row["tdp_w"]), row["date"], row["status"],
                              row["availability"])
    return out


def chip(name: str) -> Chip:
    chips = load_chips()
    if name not in chips:
        raise ValueError(f"{name!r} is not in data/chips_2026.csv; it has: {', '.join(chips)}")
    return chips[name]


# --- cost per token at a precision ------------------------------------------------------------
@dataclass(frozen=True)
class DecodePoint:
    """One chip decoding ``batch`` sequences of ``context`` tokens at ``precision``."""

    chip: str
    precision: str
    batch: int
    context: int
    step_s: float
    kernels: tuple[Kernel, ...]     # the step's kernel classes, each on its own roofline

    @property
    def memory_bound(self) -> bool:
        """Every kernel class of the step is bound by its bytes, none by its arithmetic."""
        return all(k.bound == "memory" for k in self.kernels)

    def kernel(self, name: str) -> Kernel:
        """The step's kernel class ``name`` ("linear", "attention", "head")."""
        return next(k for k in self.kernels if k.name == name)

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_s

    def usd_per_m_output(self, usd_per_hour: float) -> float:
        """Dollars per million output tokens with the chip rented at ``usd_per_hour``."""
        return usd_per_million(usd_per_hour, self.tokens_per_s)


def chip_precision(chip_: Chip, prec: str) -> Precision:
    """``prec`` ("bf16", "fp8" or "fp4", or ``BYTES_ONLY``) as ``chip_`` computes it: FP4 in
    its vendor's format."""
    if prec not in CHIP_PRECISIONS + (BYTES_ONLY,):
        raise ValueError(f"prec must be one of {CHIP_PRECISIONS} or {BYTES_ONLY!r}, got {prec!r}")
    if prec == "fp4":
        if chip_.vendor not in FP4_FORMAT:
            raise ValueError(f"no 4-bit format known for {chip_.vendor}'s {chip_.name}")
        return FP4_FORMAT[chip_.vendor]
    return PRECISIONS[prec]


def _precision(chip_: Chip, prec: str) -> Precision:
    compute = {"bf16": "bfloat16", BYTES_ONLY: "bfloat16"}.get(prec, prec)
    p = chip_precision(chip_, prec) if chip_.spec.peak_flops(compute) is not None else None
    if p is None:
        raise ValueError(f"data/chips_2026.csv gives {chip_.name} no {prec} peak, so it cannot "
                         f"be priced at {prec}")
    return p


def max_batch(config: ModelConfig, chip_: Chip, prec: str, context: int) -> int:
    """Sequences of ``context`` tokens whose cache fits beside the weights on one chip."""
    p = _precision(chip_, prec)
    room = chip_.spec.memory - weight_bytes(config, p)
    return max(0, int(room // (context * kv_bytes_per_token(config, p))))


def decode_point(config: ModelConfig, chip_: Chip, prec: str, batch: int,
                 context: int) -> DecodePoint:
    """One decode step on one chip, timed by the step-time model at the precision's peak."""
    if not 1 <= batch <= max_batch(config, chip_, prec, context):
        raise ValueError(f"{batch} sequences of {context} tokens do not fit on one {chip_.name} "
                         f"beside {config.name}'s weights at {prec}")
    model = StepModel.for_device(config, chip_.spec, _precision(chip_, prec))
    kernels = tuple(model.kernels(Shape.decode(batch, batch * (context + 1))))
    return DecodePoint(chip_.name, prec, batch, context, sum(k.seconds for k in kernels),
                       kernels)


def best_point(config: ModelConfig, chip_: Chip, prec: str, context: int,
               tpot_s: float) -> DecodePoint:
    """The largest batch that fits and whose step takes at most ``tpot_s`` (the step time
    grows with the batch, so a bisection finds it)."""
    lo, hi = 1, max_batch(config, chip_, prec, context)
    if hi < 1 or decode_point(config, chip_, prec, 1, context).step_s > tpot_s:
        raise ValueError(f"{config.name} at {prec} on one {chip_.name} cannot decode even one "
                         f"sequence of {context} tokens within {tpot_s * 1e3:g} ms")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if decode_point(config, chip_, prec, mid, context).step_s <= tpot_s:
            lo = mid
        else:
            hi = mid - 1
    return decode_point(config, chip_, prec, lo, context)


def precision_table(model: str, context: int, tpot_s: float) -> dict[tuple[str, str], DecodePoint
                                                                  | None]:
    """``best_point`` for every chip and precision; None where the chip has no such peak."""
    config = ModelConfig.from_name(model)
    out = {}
    for name, c in load_chips().items():
        for prec in CHIP_PRECISIONS:
            try:
                out[name, prec] = best_point(config, c, prec, context, tpot_s)
            except ValueError:
                out[name, prec] = None
    return out


# --- single sourced numbers -------------------------------------------------------------------
@dataclass(frozen=True)
class CostInput:
    key: str
    value: float
    unit: str
    date: str
    source: str
    status: str


def cost_input(key: str) -> CostInput:
    """The row ``key`` of ``data/cost_inputs_2026.csv``, checked."""
    for row in read_table("cost_inputs_2026.csv"):
        if row["key"] == key:
            checked_row(row, "cost_inputs_2026.csv")
            return CostInput(key, float(row["value"]), row["unit"], row["date"], row["source"],
                             row["status"])
    raise ValueError(f"{key!r} is not in data/cost_inputs_2026.csv")


# --- reasoning output as a cost driver --------------------------------------------------------
def api_prices_2026() -> list[TokenPrice]:
    """The current API prices (``inferlab.analysis.prices.token_prices``)."""
    return token_prices()


def api_request_usd(price: TokenPrice, input_tokens: int, output_tokens: int,
                    cached_share: float = 0.0, batch: bool = False) -> float:
    """Dollars for one request: ``cached_share`` of the input read from the provider's cache,
    the rest at the input price, every output token (a reasoning model's thoughts included) at
    the output price; the batch API's discount on the whole when ``batch``."""
    if not 0 <= cached_share <= 1:
        raise ValueError(f"cached_share must lie in [0, 1], got {cached_share}")
    if cached_share and price.usd_per_m_cached_input is None:
        raise ValueError(f"no cached-input price for {price.model} in data/api_prices_2026.csv")
    if batch and price.batch_discount is None:
        raise ValueError(f"no batch discount for {price.model} in data/api_prices_2026.csv")
    cached = input_tokens * cached_share
    usd = ((input_tokens - cached) * price.usd_per_m_input + output_tokens * price.usd_per_m_output
           + (cached * price.usd_per_m_cached_input if cached else 0.0)) / 1e6
    return usd * (1 - price.batch_discount) if batch else usd


def self_hosted_request_usd(config: ModelConfig, chip_: Chip, prec: str, prompt: int,
                            output: int, tpot_s: float, usd_per_hour: float) -> float:
    """The decode cost of one request's ``output`` tokens on a rented chip, at the batch that
    meets ``tpot_s`` when every sequence holds the request's mean context (the cache grows from
    ``prompt`` to ``prompt + output`` tokens). Prefill is left out: it is the same for any
    output length."""
    point = best_point(config, chip_, prec, prompt + output // 2, tpot_s)
    return output * usd_per_hour / 3600 / point.tokens_per_s


# --- owning against renting -------------------------------------------------------------------
def daily_load(peak: float, trough: float, peak_hour: int = 14) -> list[float]:
    """A scenario, not a measurement: chips busy in each hour of a day, a cosine from
    ``trough`` (12 hours from the peak) to ``peak`` (at ``peak_hour``)."""
    if not 0 <= trough <= peak:
        raise ValueError("need 0 <= trough <= peak")
    return [trough + (peak - trough) * (1 + math.cos(2 * math.pi * (h - peak_hour) / 24)) / 2
            for h in range(24)]


@dataclass(frozen=True)
class OwnVsRent:
    owned_chips: int
    utilisation: float            # busy chip-hours over owned chip-hours
    rent_usd_per_day: float       # whole chips rented each hour as the load needs them
    power_usd_per_day: float      # every owned chip, its server share and the facility, all day
    break_even_usd_per_chip_year: float
    watts_per_chip: float         # at the wall: (TDP + the server's other draw) x PUE

    @property
    def rent_usd_per_chip_year(self) -> float:
        return self.rent_usd_per_day * 365 / self.owned_chips


def server_other_w(system_w: float, chips: int, tdp_w: float) -> float:
    """A server's draw beyond its chips, per chip: (system power - chips x TDP) / chips."""
    if chips < 1 or system_w < chips * tdp_w:
        raise ValueError("need at least one chip and a system power of at least chips x TDP")
    return (system_w - chips * tdp_w) / chips


def own_vs_rent(load: list[float], rent_usd_per_hour: float, tdp_w: float,
                usd_per_kwh: float, other_w: float = 0.0, pue: float = 1.0) -> OwnVsRent:
    """Owning ``ceil(max(load))`` chips, powered all day, against renting ``ceil(load[h])``
    chips in hour h. Each owned chip draws ``tdp_w`` plus ``other_w`` (its share of the rest
    of the server), times ``pue`` (the facility's overhead: cooling, power conversion). The
    break-even is the yearly sum an owned chip may cost, beyond that power, for owning to be the
    cheaper. The maximum power, not a measured draw: an upper bound on the electricity."""
    if len(load) != 24 or min(load) < 0 or max(load) <= 0:
        raise ValueError("load must give the chips busy in each of 24 hours, some above zero")
    if other_w < 0 or pue < 1:
        raise ValueError("need other_w >= 0 and a PUE of at least 1")
    owned = math.ceil(max(load))
    rent = sum(math.ceil(x) for x in load) * rent_usd_per_hour
    watts = (tdp_w + other_w) * pue
    power = owned * 24 * watts / 1000 * usd_per_kwh
    return OwnVsRent(owned, sum(load) / (owned * 24), rent, power,
                     (rent - power) * 365 / owned, watts)
