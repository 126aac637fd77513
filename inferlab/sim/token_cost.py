"""What a token costs: the price of a device's time divided by the tokens it serves within an SLO.

    dollars per million tokens = price per second / tokens per second x 10^6

Two ways to get the tokens per second, which the cost calculator puts side by side:

- ``floor``: the step-time model's bound at a chosen batch (``inferlab.analysis.step_time``:
  each kernel on its own roofline, summed). A decode step of B sequences yields B output
  tokens; a prefill of a P-token prompt serves P input tokens.
- ``CostCase.simulate``: the steady-state simulator (``inferlab.sim.steady_state``): the
  highest Poisson arrival rate at which ``target`` of the requests meet the SLO, with every
  step timed by the same model. The simulated engine schedules as current engines do by
  default: chunked prefill under a token budget, decodes first (vLLM V1 always does;
  SGLang unless its chunked-prefill size is -1), the budget ``token_budget`` OUR choice. The
  hour's price is split between input and output tokens in proportion to the busy time each
  phase took. A chunked step carries both, and how its time is split is a CONVENTION
  (``inferlab.analysis.cost_split``): ``tokens`` (each forward by the tokens each phase put
  through it, the window's own record) or ``kernels`` (each kernel class by what the prompt
  rows and the decode rows would cost alone on its roofline). The blended cost of a token, and
  the cost of a request, do not depend on the convention.

A precision sets the bytes per weight, per cached K/V number and the format, so the peak, of
the arithmetic: ``inferlab.analysis.step_time.PRECISIONS`` (16-bit, weight-only int8 and int4
in 16-bit arithmetic, W8A8 FP8 at the FP8 peak) and the two 4-bit block formats
(``FOUR_BIT``: NVFP4 on NVIDIA's FP4 tensor cores, MXFP4 on AMD's), each with an FP8 cache. A
model too large for one device runs on ``group_size`` devices split by tensor parallelism:
each does 1/N of every kernel, the group holds N times the memory and costs N times the price,
and each layer's all-reduces cross the device's GPU link (the step-time model's collective
kernel).

The dollar formulas (``usd_per_million``, ``bandwidth_floor_usd_per_m``, ``break_even_price``)
live in ``inferlab.analysis.prices``, and the 4-bit formats and the sizes at a precision
(``NVFP4``, ``MXFP4``, ``cost_precision``, ``weight_bytes``, ``kv_bytes_per_token``) in
``inferlab.analysis.step_time``, below the chip studies that use them too; this module offers
them by name to Chapter 8 and Lab 8.

``python -m inferlab.sim.token_cost`` prints Chapter 8's cost table from the stored
simulations (``data/simulations/ch08_costs.json``) and today's prices (``data/prices.csv``);
``--write`` recomputes the simulations (several minutes) and stores them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from inferlab.analysis.cost_split import PhaseSplit, split_run
from inferlab.analysis.hardware import DeviceSpec, get_device_spec
from inferlab.analysis.prices import DevicePrice, device_price
# offered here by name too (Chapter 8, Lab 8): the dollar formulas and the sizes at a precision
from inferlab.analysis.prices import (bandwidth_floor_usd_per_m, break_even_price,  # noqa: F401
    usd_per_million)
from inferlab.analysis.step_time import (FOUR_BIT, MXFP4, NVFP4, PRECISIONS as _ALL,  # noqa: F401
    StepModel, cost_precision, kv_bytes_per_token, precision, weight_bytes)
from inferlab.data import data_path
from inferlab.model.config import ModelConfig
from inferlab.serving.config import BLOCK_SIZE, ServingConfig, engine_max_batch
from inferlab.serving.metrics import SLO
from inferlab.sim.cost_limits import BatchLimit, batch_limit
from inferlab.sim.records import capacity_from_dict, capacity_to_dict
from inferlab.sim.simulator import simulate
from inferlab.sim.steady_state import (Criterion, SLOCapacity, Window, capacity_at_slo,
    saturation_estimate, simulated, window)
from inferlab.sim.workloads import Workload

# The search the stored cases use. Capacity is decided by SLO attainment, which converges well
# before a p99 latency does near saturation, so the p99 may move by 20% between lengths.
SEARCH = dict(n0=400, n_max=3200, criterion=Criterion(p99_rtol=0.2, wait_p99_rtol=0.2),
              rtol=0.05)


def compare_rates(a: float, b: float, rtol: float = SEARCH["rtol"]) -> str:
    """``a`` against ``b``, two capacities the search found: "indistinguishable" when they lie
    within the search's resolution of each other (each is the highest rate that met, within a
    factor 1 + ``rtol`` of the lowest that missed), else "higher" or "lower"."""
    if max(a, b) <= (1 + rtol) * min(a, b):
        return "indistinguishable"
    return "higher" if a > b else "lower"


def window_costs(window: Window, usd_per_hour: float,
                 prefill_share: float | None = None) -> tuple[float, float]:
    """Dollars per million (input, output) tokens of a steady-state window: the hour's price
    split between prompts and decodes in proportion to the busy time each took (idle time is
    paid for too), each part divided by the tokens it served. ``prefill_share``: the share of
    the busy time charged to prompts; by default the window's own (the split by tokens)."""
    if prefill_share is None:
        prefill_share = window.prefill_s / (window.prefill_s + window.decode_s)
    return (usd_per_million(usd_per_hour * prefill_share, window.achieved_in_tok_s),
            usd_per_million(usd_per_hour * (1 - prefill_share), window.achieved_out_tok_s))


# The precisions the calculator and Chapter 8 price. None computes at a peak other than its own
# format's: the weight-only formats dequantise into 16-bit arithmetic (their real mechanism),
# FP8 is W8A8 at the FP8 peak, the 4-bit formats W4A4 at the FP4 peak.
PRECISIONS = {**{name: _ALL[name] for name in ("bf16", "int8 weights", "int4 weights", "fp8")},
              **FOUR_BIT}


KV_SHARE = 0.4  # the least share of a device group's memory left for the KV cache


def group_size(config: ModelConfig, device: str | DeviceSpec, prec="bf16",
               kv_share: float = KV_SHARE) -> int:
    """The fewest devices (a power of two, as tensor parallelism wants) whose memory leaves at
    least ``kv_share`` of it for the KV cache beside the weights."""
    spec = get_device_spec(device) if isinstance(device, str) else device
    total = weight_bytes(config, prec)
    count = 1
    while total > (1 - kv_share) * count * spec.memory:
        count *= 2
    return count


@dataclass(frozen=True)
class Floor:
    """Dollars per million tokens at the roofline bound, at ``batch`` sequences per step."""

    batch: int
    prefill_s: float          # one prompt's prefill
    decode_step_s: float      # one step of ``batch`` sequences at the mean context
    usd_per_hour: float       # for the whole group
    prompt: int

    @property
    def usd_per_m_input(self) -> float:
        return usd_per_million(self.usd_per_hour, self.prompt / self.prefill_s)

    @property
    def usd_per_m_output(self) -> float:
        return usd_per_million(self.usd_per_hour, self.batch / self.decode_step_s)

    def usd_per_request(self, output: int) -> float:
        """A request at the roofline with no step shared between phases: its whole-prompt
        prefill, and ``output`` decode tokens at this batch's cost per token."""
        seconds = self.prefill_s + output * self.decode_step_s / self.batch
        return self.usd_per_hour / 3600 * seconds


@dataclass(frozen=True)
class SimulatedCost:
    """The simulator's steady state at the highest rate within the SLO, priced.

    ``usd_per_m_input`` and ``usd_per_m_output`` split the hour by tokens (the window's own
    record); ``usd_per_m(convention)`` by either convention of ``inferlab.analysis.cost_split``
    (``split`` holds the window's steps counted both ways). ``usd_per_m_blended`` and
    ``usd_per_request`` depend on no convention."""

    rate: float               # requests/s within the SLO
    window: Window | None     # None when not even a low rate met the SLO
    usd_per_hour: float       # for the whole group
    split: PhaseSplit | None = None

    def usd_per_m(self, convention: str = "tokens") -> tuple[float, float]:
        """Dollars per million (input, output) tokens with the hour split by ``convention``."""
        if not self.ok:
            return float("inf"), float("inf")
        if convention == "tokens":
            return window_costs(self.window, self.usd_per_hour)
        if self.split is None:
            raise ValueError("this cost has no kernel-time split: it is stored by "
                             "python -m inferlab.sim.token_cost --write")
        return window_costs(self.window, self.usd_per_hour, self.split.prefill_share(convention))

    @property
    def usd_per_m_blended(self) -> float:
        """Any token, input or output: the hour over every token served."""
        w = self.window
        return usd_per_million(self.usd_per_hour, w.achieved_in_tok_s + w.achieved_out_tok_s)

    @property
    def usd_per_request(self) -> float:
        """The hour over the requests finished in it."""
        return self.usd_per_hour / 3600 / self.window.achieved_req_s

    @property
    def ok(self) -> bool:
        return self.window is not None and self.window.achieved_out_tok_s > 0

    @property
    def batch(self) -> float:
        """The batch the cost assumes: mean sequences per decode step in steady state."""
        return self.window.mean_batch if self.ok else float("nan")

    @property
    def usd_per_m_input(self) -> float:
        return window_costs(self.window, self.usd_per_hour)[0] if self.ok else float("inf")

    @property
    def usd_per_m_output(self) -> float:
        return window_costs(self.window, self.usd_per_hour)[1] if self.ok else float("inf")


class StaleWindow(ValueError):
    """A stored window that today's simulator and step-time model no longer reproduce."""


@dataclass(frozen=True)
class CostCase:
    """One calculator setting: model, device (and how many), precision, lengths, SLO."""

    model: str = "llama-3-8b"
    device: str = "H100 SXM"
    count: int | None = None       # devices; None: ``group_size``
    precision: str = "bf16"
    prompt: int = 1000
    output: int = 250
    ttft_s: float = 2.0
    tpot_s: float = 0.05
    target: float = 0.9            # share of requests within the SLO
    max_batch: int | None = None   # running sequences at most; None: vLLM's default for the
                                   # device (``engine_max_batch``: 1,024 on an H100, 256 on an A100)
    token_budget: int = 2048       # tokens per chunked step (vLLM's max_num_batched_tokens)

    def __post_init__(self) -> None:
        if self.max_batch is None:
            spec = get_device_spec(self.device)
            object.__setattr__(self, "max_batch", engine_max_batch(spec.name, spec.memory))

    def config(self) -> ModelConfig:
        return ModelConfig.from_name(self.model)

    @property
    def devices(self) -> int:
        return self.count or group_size(self.config(), self.device, self.precision)

    def spec(self) -> DeviceSpec:
        """One device of the group (a row of the hardware table)."""
        return get_device_spec(self.device)

    @property
    def group_name(self) -> str:
        return self.device if self.devices == 1 else f"{self.devices}x {self.device}"

    def costs(self) -> StepModel:
        """The step-time model: the group's devices split the model by tensor parallelism over
        the device's GPU link (``data/hardware.csv`` ``gpu_link``)."""
        return StepModel.for_device(self.config(), self.spec(), cost_precision(self.precision),
                                    self.devices)

    def serving(self) -> ServingConfig:
        """The pool: the group's memory less the weights, in blocks of the precision's K/V."""
        config = self.config()
        budget = self.devices * self.spec().memory - weight_bytes(config, self.precision)
        blocks = int(budget // kv_bytes_per_token(config, self.precision)) // BLOCK_SIZE
        if blocks * BLOCK_SIZE < self.prompt + self.output:
            raise ValueError(f"{config.name} at {self.precision} leaves no room for one request "
                             f"on {self.group_name}")
        return ServingConfig(num_blocks=blocks, max_batch=self.max_batch, policy="chunked",
                             token_budget=self.token_budget)

    def fits(self) -> int:
        """Requests of this case's lengths that the KV blocks hold at once."""
        config = self.serving()
        return config.num_blocks * config.block_size // (self.prompt + self.output)

    def limit(self, capacity: SLOCapacity, looser=None) -> BatchLimit:
        """What held the batch down in ``capacity`` (``inferlab.sim.cost_limits``). ``looser``:
        the searches of this server under looser TPOT bounds (default: those of ``TPOT_BOUNDS``
        the stored record holds), whose answers say whether the next rate meets once the bound
        is looser."""
        if looser is None:
            looser = []
            for t in TPOT_BOUNDS:
                if t > self.tpot_s and case_key(replace(self, tpot_s=t)) in stored():
                    looser.append(stored_capacity(replace(self, tpot_s=t)))
        return batch_limit(capacity, self.max_batch, self.fits(), self.ttft_s, self.tpot_s,
                           looser)

    @property
    def slo(self) -> SLO:
        return SLO(self.ttft_s, self.tpot_s)

    def price(self, provider: str | None = None) -> DevicePrice:
        return device_price(self.device, provider)

    def floor(self, batch: int, usd_per_device_hour: float) -> Floor:
        """The roofline cost at ``batch``: each sequence at the mean decode context."""
        costs = self.costs()
        context = self.prompt + self.output / 2
        return Floor(batch, costs.prefill_s(self.prompt),
                     costs.decode_s(batch, int(round(batch * context))),
                     usd_per_device_hour * self.devices, self.prompt)

    def capacity(self, **kw) -> SLOCapacity:
        """The simulator's search (``capacity_at_slo``, settings ``SEARCH``, which keyword
        arguments override)."""
        kw = {**SEARCH, **kw}
        workload, costs, config = self.workload(), self.costs(), self.serving()
        start = kw.pop("start", None) or 0.5 * saturation_estimate(workload, costs, config)
        return capacity_at_slo(workload, simulated(costs, config), self.slo, start,
                               self.target, **kw)

    def workload(self) -> Workload:
        return Workload.fixed(self.prompt, self.output)

    def priced(self, capacity: SLOCapacity, usd_per_device_hour: float,
               split: PhaseSplit | None = None) -> SimulatedCost:
        return SimulatedCost(capacity.rate, capacity.window, usd_per_device_hour * self.devices,
                             split)

    def split(self, capacity: SLOCapacity, warmup: float = 0.2,
              cooldown: float = 0.1) -> PhaseSplit:
        """The steps of ``capacity``'s window counted and split both ways
        (``inferlab.analysis.cost_split``): the window's trace is served again (the simulator
        is deterministic) and each forward's kernels priced from its rows. Raises if the run
        does not reproduce the stored window, or the kernels do not add up to its seconds."""
        w = capacity.window
        requests = self.workload().requests(w.n_requests, capacity.rate)
        costs = self.costs()
        run = simulate(requests, costs, self.serving())
        if window(requests, run, self.slo, warmup, cooldown) != w:
            raise StaleWindow(f"{self}: serving the window's trace again gave another window")
        end = max(r.arrival_s for r in requests)
        split = split_run(run, costs, warmup * end, (1 - cooldown) * end)
        priced = sum(k.seconds for k in split.kernels.values()) + split.steps * costs.overhead_s
        if abs(priced - split.busy_s) > 1e-6 * split.busy_s or \
                abs(split.prefill_s_by_tokens - w.prefill_s) > 1e-6 * split.busy_s:
            raise ValueError(f"{self}: the kernels price {priced} s, the window logged "
                             f"{split.busy_s} s")
        return split

    def simulate(self, usd_per_device_hour: float, **kw) -> SimulatedCost:
        return self.priced(self.capacity(**kw), usd_per_device_hour)


# --- Chapter 8's cases, simulated once and stored --------------------------------------------

TABLE_MODELS = ("llama-3-8b", "llama-3-70b")
TABLE_DEVICES = ("A100 80GB SXM", "H100 SXM", "H200 SXM", "B200")
TPOT_BOUNDS = (0.015, 0.02, 0.03, 0.05, 0.1)


# Fewer bytes per weight, each on a device that computes the format: weight-only int8 and int4
# and W8A8 FP8 on the H100, FP8 and NVFP4 on the B200 (Hopper has no FP4 tensor cores). On the
# H100 also FP8's bytes at the 16-bit peak ("fp8 weights and KV"), not a format to serve but the
# control that tells FP8's bytes from its peak.
PRECISION_CASES = {"H100 SXM": ("int8 weights", "int4 weights", "fp8 weights and KV", "fp8"),
                   "B200": ("fp8", "nvfp4")}


def chapter_cases() -> list[CostCase]:
    """The settings Chapter 8 prices: the table, precisions, and a sweep of TPOT bounds."""
    cases = [CostCase(model=m, device=d) for m in TABLE_MODELS for d in TABLE_DEVICES]
    cases += [CostCase(model=m, device=d, precision=p) for m in TABLE_MODELS
              for d, precs in PRECISION_CASES.items() for p in precs]
    cases += [CostCase(device=d, tpot_s=t) for d in ("A100 80GB SXM", "H100 SXM")
              for t in TPOT_BOUNDS if t != CostCase().tpot_s]
    return cases


NAME = "ch08_costs.json"


def case_key(case: CostCase) -> str:
    return json.dumps(asdict(case), sort_keys=True)


def _search(job: tuple[CostCase, SLOCapacity | None]) -> tuple[SLOCapacity, PhaseSplit | None,
                                                                str]:
    case, cap = job
    if cap is not None and cap.state is not None:
        try:
            return cap, case.split(cap), "reused: its window reproduces exactly"
        except StaleWindow:
            pass
    cap = case.capacity()
    return cap, (case.split(cap) if cap.state is not None else None), "searched"


def _entry(case: CostCase, cap: SLOCapacity, split: PhaseSplit | None, how: str) -> dict:
    """One case as the record stores it."""
    return {"case": asdict(case), "inputs": inputs(case), "search": how,
            "capacity": capacity_to_dict(cap), "split": split.to_dict() if split else None}


def _cache_file(cache: str, case: CostCase) -> Path:
    """Where ``--cache`` keeps one case's entry: keyed by the case, today's table numbers
    (``inputs``) and the search's settings, so a changed input is searched again."""
    import hashlib

    key = json.dumps([asdict(case), inputs(case), repr(SEARCH)], sort_keys=True, default=str)
    return Path(cache) / f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.json"


def _search_cached(job: tuple[CostCase, SLOCapacity | None, str | None]) -> dict:
    """``_search`` as a stored entry, or the entry an interrupted run of the same inputs left
    under ``cache``."""
    case, cap, cache = job
    if cache is not None and _cache_file(cache, case).exists():
        return json.loads(_cache_file(cache, case).read_text(encoding="utf-8"))
    entry = _entry(case, *_search((case, cap)))
    if cache is not None:
        f = _cache_file(cache, case)
        f.parent.mkdir(parents=True, exist_ok=True)
        part = f.with_suffix(f".{os.getpid()}.part")   # renamed whole: a reader sees all or none
        part.write_text(json.dumps(entry), encoding="utf-8")
        part.replace(f)
    return entry


def write(cases=None, progress=print, jobs: int = 1, reuse: bool = False,
          cache: str | None = None) -> dict:
    """Simulate ``cases`` (default ``chapter_cases()``, in ``jobs`` processes) and store them;
    returns the record. ``reuse``: keep the stored search of a case when today's simulator and
    step-time model, serving its window's trace again, reproduce that window exactly (every
    step's time and every request's tokens); otherwise search again. Each case records which.
    ``cache``: a folder where each case's entry is kept as it finishes, so an interrupted run
    resumes where it stopped (an entry is used only for the same case, table numbers and search
    settings)."""
    from concurrent.futures import ProcessPoolExecutor

    from inferlab.measurements import git_commit

    command = ("python -m inferlab.sim.token_cost --write" + (" --reuse" if reuse else "")
               + (" --cache DIR" if cache else ""))
    record = {"provenance": {"command": command, "date": _dt.date.today().isoformat(),
                             "git_commit": git_commit()},
              "cases": []}
    cases = list(cases or chapter_cases())
    old = stored() if reuse and data_path("simulations", NAME).exists() else {}
    jobs_ = [(c, old[case_key(c)].capacity if case_key(c) in old else None, cache)
             for c in cases]
    pool = ProcessPoolExecutor(jobs) if jobs > 1 else None
    found = pool.map(_search_cached, jobs_) if pool else map(_search_cached, jobs_)
    for case, entry in zip(cases, found):
        cap = capacity_from_dict(entry["capacity"])
        progress(f"{case.model} on {case.group_name}, {case.precision}, TPOT <= "
                 f"{case.tpot_s * 1e3:g} ms: {cap.rate:.2f} req/s ({len(cap.probes)} probes, "
                 f"{entry['search']}), batch held by {case.limit(cap) if cap.state else '-'}",
                 flush=True)
        record["cases"].append(entry)
    if pool:
        pool.shutdown()
    out = data_path("hardware.csv").parent / "simulations" / NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return record


def inputs(case: CostCase) -> dict:
    """The table numbers a case's simulation used (to tell when a stored one is stale)."""
    costs = case.costs()
    return {"devices": case.devices, **asdict(costs), "num_blocks": case.serving().num_blocks}


@dataclass(frozen=True)
class Stored:
    """One stored case: its search, the table numbers it used, and its window's split."""

    case: CostCase
    capacity: SLOCapacity
    inputs: dict
    split: PhaseSplit | None


@functools.lru_cache(maxsize=2)
def _stored(path: str, mtime: float) -> dict[str, Stored]:
    record = json.loads(Path(path).read_text(encoding="utf-8"))
    out = {}
    for entry in record["cases"]:
        case = CostCase(**entry["case"])
        split = entry.get("split")
        out[case_key(case)] = Stored(case, capacity_from_dict(entry["capacity"]), entry["inputs"],
                                     PhaseSplit.from_dict(split) if split else None)
    return out


def stored() -> dict[str, Stored]:
    """The stored simulations, keyed by ``case_key`` (read once per version of the file)."""
    path = data_path("simulations", NAME)
    return _stored(str(path), path.stat().st_mtime)


def stored_case(case: CostCase) -> Stored:
    """The stored search for ``case``; a case not stored says how to add it."""
    table = stored()
    if case_key(case) not in table:
        raise KeyError(f"{case} is not in data/simulations/{NAME}: add it to chapter_cases() "
                       "and run python -m inferlab.sim.token_cost --write")
    return table[case_key(case)]


def stored_capacity(case: CostCase) -> SLOCapacity:
    """The stored search for ``case``."""
    return stored_case(case).capacity


def stored_cost(case: CostCase, usd_per_device_hour: float) -> SimulatedCost:
    """The stored search for ``case`` priced, with its window's split."""
    s = stored_case(case)
    return case.priced(s.capacity, usd_per_device_hour, s.split)


def cost_table(provider: str | None = "CoreWeave") -> str:
    """Chapter 8's table: each model on each device, floor and simulated, at today's prices."""
    lines = [f"{'model':12s} {'devices':>18s} {'$/h':>7s} {'req/s':>6s} {'batch':>6s} "
             f"{'$/M in':>7s} {'$/M out':>8s} {'floor out':>9s}  {'batch held by':15s}  price"]
    for model in TABLE_MODELS:
        for device in TABLE_DEVICES:
            case = CostCase(model=model, device=device)
            price = case.price(provider)
            capacity = stored_capacity(case)
            sim = case.priced(capacity, price.usd_per_hour)
            floor = case.floor(max(1, round(sim.batch)), price.usd_per_hour)
            lines.append(f"{model:12s} {case.group_name:>18s} {sim.usd_per_hour:7.2f} "
                         f"{sim.rate:6.2f} {sim.batch:6.1f} {sim.usd_per_m_input:7.3f} "
                         f"{sim.usd_per_m_output:8.3f} {floor.usd_per_m_output:9.3f}  "
                         f"{str(case.limit(capacity)):15s}  {price.label()}")
    c = CostCase()
    lines.append(f"(prompt {c.prompt}, output {c.output} tokens; SLO TTFT <= {c.ttft_s:g} s, "
                 f"TPOT <= {c.tpot_s * 1e3:g} ms for {c.target:.0%}; bf16; chunked prefill, "
                 f"{c.token_budget} tokens a step; 'floor out' is the roofline cost of output "
                 "at the simulated batch)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Chapter 8's cost table.")
    parser.add_argument("--write", action="store_true",
                        help=f"recompute every case (minutes) into data/simulations/{NAME}")
    parser.add_argument("--jobs", type=int, default=1, help="processes for --write")
    parser.add_argument("--reuse", action="store_true",
                        help="with --write: keep stored searches whose inputs are unchanged")
    parser.add_argument("--cache", default=None,
                        help="with --write: keep each case's entry in this folder as it "
                             "finishes, so an interrupted run resumes")
    parser.add_argument("--provider", default="CoreWeave",
                        help="whose prices (data/prices.csv) to use (default CoreWeave)")
    args = parser.parse_args(argv)
    if args.write:
        write(jobs=args.jobs, reuse=args.reuse, cache=args.cache)
    print(cost_table(args.provider))


if __name__ == "__main__":
    main()
