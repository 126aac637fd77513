"""The hardware table, detection of the device in use, and the two probes.

The table (``data/hardware.csv``) holds datasheet numbers: dense BF16/FP16 peak FLOP/s, memory
bandwidth and capacity, and the kind of memory the weights live in (HBM, GDDR6, DDR, or the
on-chip SRAM of the SRAM-first designs, whose bandwidth and capacity are then the SRAM's), each
row with its source.

Memory sizes are the one place a datasheet misleads a capacity count. GPU memory is sold by a
nominal size ("80GB") that is really binary: an H100 80GB's driver reports 81,559 MiB in all and
keeps 454 MiB of it for itself, so a program can allocate 81,105 MiB, about 85.0 GB in decimal
units, not 80. Where the table has what ``nvidia-smi -a`` reported on a real card (the ``FB
Memory Usage`` total and the driver's ``Reserved``, with their source), ``DeviceSpec.memory`` is
the difference, the bytes a program can have; elsewhere it is the datasheet's size read as
decimal GB, a slight underestimate. ``memory_nominal`` keeps the datasheet's figure for labels. ``load_hardware()`` returns the GPUs and CPUs the first chapters compare;
``load_hardware(kinds=None)`` every row, TPUs and SRAM-first chips (Chapter 8) included, and
``get_device_spec`` finds any row by name. ``detect_device()`` names the device torch
is using and finds its row when there is one (CPUs vary too much to have rows; a learner on a
CPU compares against what they measure). The probes measure the two numbers a roofline needs:

- ``measure_bandwidth()`` streams a large buffer twice, a copy (bytes read plus bytes written)
  and a read (a sum), and keeps the faster;
- ``measure_peak_flops(dtype)`` times a large square matmul, which does 2 n^3 FLOPs.

Each returns a ``ProbeResult`` that says what it ran on, so a figure never loses its provenance.
A probe measures a ceiling, so its rate comes from the fastest block of runs (``Timing.min_s``):
other programs can only slow a run down, never speed it up.
"""

from __future__ import annotations

import datetime as _dt
import platform
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inferlab.data import read_table
from inferlab.device import check_dtype, choose_profile
from inferlab.timing import Timing, time_fn


@dataclass(frozen=True)
class DeviceSpec:
    """One row of the hardware table, in SI units (FLOP/s, bytes/s, bytes)."""

    name: str
    kind: str                  # "gpu", "cpu", "tpu", "lpu" (Groq) or "wse" (Cerebras)
    bandwidth: float           # bytes/s
    peak_bf16: float | None    # FLOP/s, dense
    peak_fp16: float | None    # FLOP/s, dense
    memory: float | None       # bytes
    source: str
    notes: str = ""
    match: tuple[str, ...] = ()
    memory_kind: str = ""      # where the weights live: "HBM", "GDDR6", "SRAM", ...
    memory_nominal: float | None = None   # bytes, the datasheet's size read as decimal GB
    memory_reserved: float | None = None  # bytes the driver keeps (nvidia-smi "Reserved")
    memory_source: str = ""    # where the reported size and reserve were read; "" if nominal
    peak_fp8: float | None = None  # FLOP/s, dense, FP8 tensor cores
    peak_fp4: float | None = None  # FLOP/s, dense, FP4 tensor cores
    gpu_link: str = ""         # the GPU-to-GPU link of data/links.csv its servers use
    peak_int8: float | None = None  # OP/s, dense, INT8 tensor cores (data/hardware_int8.csv)

    def peak_flops(self, dtype: str | torch.dtype = torch.bfloat16) -> float | None:
        """Datasheet peak for ``dtype``; None where the table has no figure (say, FP32).
        ``"int8"`` is the INT8 tensor cores' rate in operations per second: an int8 multiply-add
        counts as two operations, as a floating-point one counts as two FLOPs."""
        name = str(dtype).removeprefix("torch.")
        return {"bfloat16": self.peak_bf16, "float16": self.peak_fp16, "fp8": self.peak_fp8,
                "float8_e4m3fn": self.peak_fp8, "fp4": self.peak_fp4,
                "int8": self.peak_int8}.get(name)

    def ridge_point(self, dtype: str | torch.dtype = torch.bfloat16) -> float | None:
        """Peak FLOP/s over bandwidth, in FLOP per byte (None without a peak figure)."""
        peak = self.peak_flops(dtype)
        return None if peak is None else peak / self.bandwidth


def _number(text: str, scale: float) -> float | None:
    return float(text) * scale if text.strip() else None


MIB = 2**20


def _memory(row: dict) -> tuple[float | None, float | None]:
    """(bytes a program can allocate, bytes the driver reserves) for one table row.

    With the reported total (MiB) the usable bytes are total minus the driver's reserve (0
    where the reserve was not read); without it, the datasheet's size in decimal GB."""
    total = _number(row.get("memory_total_mib", "") or "", MIB)
    if total is None:
        return _number(row["memory_gb"], 1e9), None
    reserved = _number(row.get("memory_reserved_mib", "") or "", MIB)
    return total - (reserved or 0.0), reserved


DEFAULT_KINDS = ("gpu", "cpu")


def _int8_peaks() -> dict[str, float]:
    """Dense INT8 tensor-core peaks (OP/s) by device name, from ``data/hardware_int8.csv``: kept
    apart from ``hardware.csv`` so that the INT8 rows, each with its source, add no column to
    every row of the main table."""
    return {r["name"]: float(r["peak_int8_tops"]) * 1e12 for r in read_table("hardware_int8.csv")
            if r["peak_int8_tops"].strip()}


def load_hardware(kinds: tuple[str, ...] | None = DEFAULT_KINDS) -> dict[str, DeviceSpec]:
    """The rows of ``data/hardware.csv`` of the given ``kinds``, keyed by name, in table order.

    The default keeps the GPUs and CPUs (the devices of Chapters 1-4); ``kinds=None`` gives
    every row, TPUs ("tpu") and SRAM-first chips ("lpu", "wse") included.
    """
    specs = {}
    int8 = _int8_peaks()
    for row in read_table("hardware.csv"):
        if kinds is not None and row["kind"] not in kinds:
            continue
        memory, reserved = _memory(row)
        specs[row["name"]] = DeviceSpec(
            name=row["name"], kind=row["kind"],
            bandwidth=float(row["bandwidth_gbs"]) * 1e9,
            peak_bf16=_number(row["peak_bf16_tflops"], 1e12),
            peak_fp16=_number(row["peak_fp16_tflops"], 1e12),
            memory=memory,
            source=row["source"], notes=row["notes"],
            match=tuple(m for m in row["match"].split("|") if m),
            memory_kind=row.get("memory_kind", ""),
            memory_nominal=_number(row["memory_gb"], 1e9),
            memory_reserved=reserved,
            memory_source=row.get("memory_source", "") or "",
            peak_fp8=_number(row.get("peak_fp8_tflops", ""), 1e12),
            peak_fp4=_number(row.get("peak_fp4_tflops", ""), 1e12),
            gpu_link=row.get("gpu_link", ""),
            peak_int8=int8.get(row["name"]),
        )
    return specs


def get_device_spec(name: str) -> DeviceSpec:
    """The table row called ``name`` (case-insensitive, any kind); an unknown name lists the
    known ones."""
    specs = load_hardware(kinds=None)
    for key, spec in specs.items():
        if key.lower() == name.strip().lower():
            return spec
    raise ValueError(f"unknown device {name!r}; the hardware table knows: {', '.join(specs)}")


VENDOR_PREFIXES = ("NVIDIA ", "Tesla ", "AMD Instinct ", "AMD ")


def _bare_name(device_name: str) -> str:
    """A device name without its vendor prefix, lower case: "NVIDIA H200" -> "h200"."""
    name = " ".join(device_name.split())
    for prefix in VENDOR_PREFIXES:
        if name.lower().startswith(prefix.lower()):
            name = name[len(prefix):]
            break
    return name.lower()


def match_device_name(device_name: str) -> DeviceSpec | None:
    """The table row one of whose ``match`` names equals ``device_name`` (as torch reports it,
    e.g. "NVIDIA H200"), compared without the vendor prefix and case.

    The match is exact, not a substring: "L4" must not claim an L40S, "H200" a GH200, "B200" a
    GB200, nor "A100 80GB" an A100 80GB PCIe, whose rooflines differ. A name the table does not
    list returns None rather than a neighbour's row."""
    bare = _bare_name(device_name)
    for spec in load_hardware().values():
        if any(_bare_name(pattern) == bare for pattern in spec.match):
            return spec
    return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


@dataclass(frozen=True)
class DeviceInfo:
    """The device torch is using, its table row if it has one, and the software around it."""

    device: str                 # "cpu" or "cuda"
    name: str                   # e.g. "NVIDIA H200" or the CPU's model name
    spec: DeviceSpec | None
    torch_version: str
    cuda_version: str | None
    threads: int

    def provenance(self) -> dict:
        """What a measurement must carry: device, software versions and today's date."""
        return {"device": self.device, "device_name": self.name,
                "table_row": self.spec.name if self.spec else None,
                "torch": self.torch_version, "cuda": self.cuda_version,
                "threads": self.threads, "date": _dt.date.today().isoformat()}


def detect_device(device: str | None = None) -> DeviceInfo:
    """Describe ``device`` ("cpu" or "cuda"; default: the GPU when there is one)."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for but torch sees no CUDA GPU; "
                               "pass device='cpu'")
        name = torch.cuda.get_device_name(0)
        spec = match_device_name(name)
    elif device == "cpu":
        name, spec = _cpu_name(), None
    else:
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    return DeviceInfo(device=device, name=name, spec=spec, torch_version=torch.__version__,
                      cuda_version=torch.version.cuda, threads=torch.get_num_threads())


@dataclass(frozen=True)
class ProbeResult:
    """A measured rate with what it ran on: ``value`` is in ``unit`` (bytes/s or FLOP/s)."""

    value: float
    unit: str
    what: str
    device: DeviceInfo
    dtype: str
    size: int
    timing: Timing = field(repr=False)

    def __str__(self) -> str:
        scale, prefix = (1e9, "G") if self.value < 1e12 else (1e12, "T")
        return (f"{self.what}: {self.value / scale:,.1f} {prefix}{self.unit} on "
                f"{self.device.name} ({self.dtype}, torch {self.device.torch_version}; fastest "
                f"of {self.timing.runs} runs, {self.timing.threads} "
                f"thread{'s' if self.timing.threads != 1 else ''})")

    def to_dict(self) -> dict:
        return {"what": self.what, "value": self.value, "unit": self.unit, "dtype": self.dtype,
                "size": self.size, "median_s": self.timing.median_s, "min_s": self.timing.min_s,
                "timing_threads": self.timing.threads,
                **self.device.provenance()}


def cache_bytes(device: str = "cpu") -> int:
    """The largest cache in front of ``device``'s memory (the CPU's last level from Linux's
    sysfs, a GPU's L2), in bytes; 0 where the system does not say.

    A buffer that fits in it is read from the cache, not from memory, and a bandwidth measured
    on it is the cache's: size probes and sweeps to a few times this.
    """
    if device == "cuda":
        if not torch.cuda.is_available():
            return 0
        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=0)


def _resolve(device: str | None) -> tuple[str, "object"]:
    profile = choose_profile(device)
    return (device or profile.device), profile


def stream_rates(device: str | None = None, n_bytes: int | None = None,
                 min_run_time: float | None = None,
                 num_threads: int | None = None) -> tuple[int, dict[str, tuple[float, Timing]]]:
    """The two memory streams ``measure_bandwidth`` picks from: the buffer's bytes, and for
    ``"copy"`` (bytes read plus bytes written) and ``"read"`` (a sum over the buffer) the bytes
    per second of the fastest run with its timing. The buffer is ``n_bytes`` (default: the
    profile's size or twice the largest cache, whichever is larger)."""
    device, profile = _resolve(device)
    if n_bytes is None:  # at least twice the largest cache, or the probe would measure it
        n_bytes = max(profile.probe_bytes, 2 * cache_bytes(device))
    if n_bytes < 2**20:
        raise ValueError(f"n_bytes={n_bytes} is too small to measure memory rather than cache; "
                         "pass at least 1 MiB (the profile's default is "
                         f"{profile.probe_bytes // 2**20} MiB)")
    src = torch.empty(n_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    total = torch.empty((), dtype=torch.float32, device=device)
    run_time = min_run_time or profile.min_run_time
    size = src.numel() * src.element_size()
    copy = time_fn(lambda: dst.copy_(src), min_run_time=run_time, label="copy",
                   num_threads=num_threads)
    read = time_fn(lambda: torch.sum(src, 0, out=total), min_run_time=run_time, label="read",
                   num_threads=num_threads)
    return size, {"copy": (2 * size / copy.min_s, copy),  # each byte read once, written once
                  "read": (size / read.min_s, read)}


def measure_bandwidth(device: str | None = None, n_bytes: int | None = None,
                      min_run_time: float | None = None,
                      num_threads: int | None = None) -> ProbeResult:
    """Memory bandwidth, the faster of two streams over a buffer of ``n_bytes``: a copy,
    counting bytes read plus bytes written, and a read (a sum over the buffer).

    Both are reported because neither is always the ceiling: a copy pays for its writes (on a
    CPU one core's stores are often the bottleneck), while a matrix-vector product, like a
    decode step, mostly reads. The buffer must be much larger than the caches (hundreds of MB
    on a CPU, GBs on a GPU), or the probe measures the cache instead of memory. By default it
    is the profile's size or twice the largest cache (``cache_bytes``), whichever is larger.

    We checked the probe against what decode gets (the course's 2-core Xeon VM, torch
    2.13.0+cpu, one thread, CPU time, November 2026): the copy moved 12.6-13.0 GB/s, a
    read-only ``sum`` of the same buffer 12.1-13.7 GB/s, and batch-1 decode of 'small' read its
    400 MB at 11.8-12.5 GB/s, 94-97% of the copy. A bare matrix-vector product streams about
    20% faster (15.1-15.7 GB/s), so a decode can come out a little above this floor.
    """
    device, _ = _resolve(device)
    size, rates = stream_rates(device, n_bytes, min_run_time, num_threads)
    name = max(rates, key=lambda k: rates[k][0])
    other = "read" if name == "copy" else "copy"
    what = (f"memory bandwidth ({name}; a {other} reached {rates[other][0] / rates[name][0]:.0%}"
            " of it)")
    return ProbeResult(rates[name][0], "B/s", what, detect_device(device), "float32", size,
                       rates[name][1])


def measure_peak_flops(dtype: str | torch.dtype | None = None, device: str | None = None,
                       n: int | None = None, min_run_time: float | None = None,
                       num_threads: int | None = None) -> ProbeResult:
    """Matmul throughput: an n x n by n x n product does 2 n^3 FLOPs (a multiply and an add).

    ``dtype`` defaults to the profile's; one the device does not support is refused with the
    options. ``n`` must be large enough to keep every core busy (thousands on a GPU).
    """
    device, profile = _resolve(device)
    dtype = check_dtype(profile.dtype if dtype is None else dtype, device)
    n = profile.matmul_n if n is None else n
    if n < 64:
        raise ValueError(f"n={n} is too small to reach peak; pass n >= 64 "
                         f"(the profile's default is {profile.matmul_n})")
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    timing = time_fn(lambda: torch.mm(a, b, out=out),
                     min_run_time=min_run_time or profile.min_run_time, label="matmul",
                     num_threads=num_threads)
    return ProbeResult(2 * n**3 / timing.min_s, "FLOP/s", "peak matmul throughput",
                       detect_device(device), str(dtype).removeprefix("torch."), n, timing)
