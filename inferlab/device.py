"""Which device a lab runs on, and the sizes that fit it.

One notebook runs everywhere: on the 2-core CPU of CI in seconds, on a Colab T4 and on a large
data-centre GPU. ``choose_profile()`` looks at the machine and returns a ``Profile`` whose fields
the labs and the benchmarks read their sizes from (``serving`` for Chapter 4's experiment,
``attention`` for Chapter 3's kernel timing); set the environment variable ``INFERLAB_PROFILE``
to one of ``PROFILES`` to force a choice (tests use ``cpu``). ``free_memory_bytes`` says how
much memory a device has free now, for sizing a KV pool. ``DeviceInfo`` describes the device a
measurement ran on (``inferlab.analysis.hardware.detect_device`` adds its row of the hardware
table), for the record it carries.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from dataclasses import dataclass, replace

import torch

from inferlab.validation import positive

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class ServingSizes:
    """Chapter 4's serving experiment on one class of device (Lab 4, ``benchmarks.batching``)."""

    model: str                  # a row of data/models.csv
    requests: int               # requests in the trace
    length_scale: float         # factor on the trace's prompt and output lengths
    max_batch: int              # sequences decoded at once
    rate: float                 # offered load, requests per second (Poisson)
    rates: tuple[float, ...]    # the sweep for the latency-throughput curve

    def __post_init__(self) -> None:
        positive("ServingSizes.", requests=self.requests, length_scale=self.length_scale,
                 max_batch=self.max_batch, rate=self.rate, **{f"rates[{i}]": r for i, r in
                                                               enumerate(self.rates)})


@dataclass(frozen=True)
class AttentionSizes:
    """One decode step of paged against contiguous attention (Lab 3, ``benchmarks.paged``)."""

    batch: int
    context: int
    n_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        positive("AttentionSizes.", batch=self.batch, context=self.context,
                 n_heads=self.n_heads, head_dim=self.head_dim)


@dataclass(frozen=True)
class Profile:
    """Sizes for one class of device. Every lab takes its sizes from here."""

    name: str
    device: str           # "cpu" or "cuda"
    dtype: torch.dtype    # the dtype the labs compute in
    model: str            # a row of data/models.csv: the model the generation labs run
    decode_model: str     # a larger row for timing decode against the bandwidth floor
    probe_bytes: int      # size of the buffer the bandwidth probe copies
    matmul_n: int         # side of the square matmul the FLOP/s probe runs
    sweep_dim: int        # side of the weight matrix in the GEMV-to-GEMM sweep
    max_batch: int        # largest batch in sweeps
    max_context: int      # longest context the labs generate to
    decode_tokens: int    # tokens to generate when timing decode
    min_run_time: float   # seconds each timing runs for (torch.utils.benchmark)
    serving: ServingSizes     # the serving experiment
    attention: AttentionSizes  # the paged-attention timing

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"Profile.device must be 'cpu' or 'cuda', not {self.device!r}")
        positive("Profile.", **{f: getattr(self, f) for f in (
            "probe_bytes", "matmul_n", "sweep_dim", "max_batch", "max_context", "decode_tokens")})

    def scaled(self, **changes) -> "Profile":
        """A copy with some fields changed, e.g. ``profile.scaled(max_batch=64)``."""
        return replace(self, **changes)


PROFILES: dict[str, Profile] = {
    "cpu": Profile("cpu", "cpu", torch.float32, "tiny", "small", probe_bytes=256 * 2**20, matmul_n=1024,
                   sweep_dim=4096, max_batch=256, max_context=2048, decode_tokens=16,
                   min_run_time=0.2,
                   serving=ServingSizes("tiny", 96, 1 / 8, 16, 100.0, (10.0, 25.0, 50.0, 100.0)),
                   attention=AttentionSizes(batch=8, context=1024, n_heads=8, head_dim=64)),
    "small-gpu": Profile("small-gpu", "cuda", torch.float16, "small", "medium", probe_bytes=1 * 2**30,
                         matmul_n=8192, sweep_dim=8192, max_batch=1024, max_context=4096,
                         decode_tokens=64, min_run_time=0.5,
                         serving=ServingSizes("small", 128, 1 / 2, 64, 50.0, (5.0, 10.0, 20.0, 50.0)),
                         attention=AttentionSizes(batch=32, context=2048, n_heads=32, head_dim=128)),
    "large-gpu": Profile("large-gpu", "cuda", torch.bfloat16, "small", "llama-2-7b",
                         probe_bytes=4 * 2**30, matmul_n=8192, sweep_dim=8192, max_batch=2048,
                         max_context=4096, decode_tokens=64, min_run_time=0.5,
                         serving=ServingSizes("llama-2-7b", 256, 1.0, 64, 20.0,
                                              (1.0, 2.0, 4.0, 8.0, 20.0)),
                         attention=AttentionSizes(batch=32, context=2048, n_heads=32, head_dim=128)),
}

# A GPU with less memory than this gets the small profile (a T4 has 16 GB, an L4 24 GB).
_LARGE_GPU_MIN_BYTES = 40 * 10**9


def get_profile(name: str) -> Profile:
    """The named profile; an unknown name lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}") from None


def choose_profile(device: str | None = None) -> Profile:
    """The profile for this machine (or for ``device``: "cpu" or "cuda").

    ``INFERLAB_PROFILE`` overrides the choice. A GPU with at least 40 GB gets ``large-gpu``, a
    smaller one ``small-gpu``; ``small-gpu`` computes in float16 because a T4 has no bfloat16.
    """
    forced = os.environ.get("INFERLAB_PROFILE")
    if forced:
        profile = get_profile(forced)
        if profile.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"INFERLAB_PROFILE={forced} needs a CUDA GPU but torch sees none; "
                               "unset it or set it to 'cpu'")
        return profile
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return PROFILES["cpu"]
    if device != "cuda":
        raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
    if not torch.cuda.is_available():
        raise RuntimeError("device='cuda' was asked for but torch sees no CUDA GPU; "
                           "pass device='cpu' (or leave device unset)")
    total = torch.cuda.get_device_properties(0).total_memory
    return PROFILES["large-gpu" if total >= _LARGE_GPU_MIN_BYTES else "small-gpu"]


def free_memory_bytes(device: str | torch.device) -> int:
    """Bytes of memory free on ``device`` now: a GPU's free memory, or the host's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:  # Linux: what the kernel could hand out without swapping
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # macOS has no SC_AVPHYS_PAGES
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a dtype or its name ("float32", "float16", "bfloat16")."""
    if isinstance(dtype, torch.dtype):
        if dtype in _DTYPES.values():
            return dtype
        raise ValueError(f"dtype {dtype} is not supported; use one of {sorted(_DTYPES)}")
    try:
        return _DTYPES[str(dtype).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}") from None


def supported_dtypes(device: str) -> list[torch.dtype]:
    """The dtypes the course computes in on ``device``.

    The CPU gets float32 and bfloat16 (float16 matmuls on a CPU are emulated and very slow);
    a GPU gets float16, float32, and bfloat16 where the GPU has it (a T4 does not).
    """
    if device == "cpu":
        return [torch.float32, torch.bfloat16]
    if device == "cuda":
        dtypes = [torch.float32, torch.float16]
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False):
            dtypes.append(torch.bfloat16)
        return dtypes
    raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")


def check_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """``dtype`` as a torch dtype if ``device`` supports it, else a ValueError naming the options."""
    dtype = parse_dtype(dtype)
    ok = supported_dtypes(device)
    if dtype not in ok:
        names = ", ".join(str(d).removeprefix("torch.") for d in ok)
        raise ValueError(f"{str(dtype).removeprefix('torch.')} is not supported on {device}; "
                         f"pass one of: {names}")
    return dtype


# Storage formats a weight or a KV cache can be kept in without being a compute dtype here.
_STORAGE_BYTES = {"int8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}


def bytes_per_element(dtype: str | torch.dtype) -> int:
    """Bytes one number of ``dtype`` occupies (4 for float32, 2 for float16 and bfloat16, 1 for
    the int8 and FP8 storage formats of Chapter 5)."""
    name = str(dtype).removeprefix("torch.")
    if name in _STORAGE_BYTES:
        return _STORAGE_BYTES[name]
    return torch.empty((), dtype=parse_dtype(dtype)).element_size()


def element_bytes(dtype) -> float:
    """Bytes per number: a dtype's name (or torch dtype), or a number of bytes itself (0.5 for
    4-bit weights), so that quantized formats go through the same formulas."""
    if isinstance(dtype, (int, float)) and not isinstance(dtype, bool):
        if dtype <= 0:
            raise ValueError(f"bytes per element must be > 0, got {dtype}")
        return dtype
    return bytes_per_element(dtype)


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
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
    spec: object | None         # its row of the hardware table (``DeviceSpec``), if it has one
    torch_version: str
    cuda_version: str | None
    threads: int

    @classmethod
    def of(cls, device: str, name: str, spec=None) -> "DeviceInfo":
        """``device`` called ``name`` (with its table row ``spec``), as torch runs it now."""
        return cls(device, name, spec, torch.__version__, torch.version.cuda,
                   torch.get_num_threads())

    def provenance(self) -> dict:
        """What a measurement must carry: device, software versions and today's date."""
        return {"device": self.device, "device_name": self.name,
                "table_row": self.spec.name if self.spec else None,
                "torch": self.torch_version, "cuda": self.cuda_version,
                "threads": self.threads, "date": _dt.date.today().isoformat()}
