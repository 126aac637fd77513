"""Capacity planning: how many requests' KV caches fit on a device beside the weights.

    requests = (utilization x device memory - weights - activation reserve)
               / (KV bytes per token x context)

The utilization is the share of the device an engine lets itself use. vLLM's
``gpu_memory_utilization`` (default 0.92, ``VLLM_GPU_MEMORY_UTILIZATION``) is exactly that: its
worker takes that fraction of the total memory the driver reports, profiles a forward pass, and
gives the KV cache what is left of the fraction after the weights and the pass's peak activations
and other allocations (``vllm/v1/worker/gpu_worker.py``, ``determine_available_memory``). The
remaining 8% stays untouched, and the activation reserve sits inside the 92%, not beside it.

The formulas live in ``inferlab.analysis.formulas`` (``kv_memory_budget``, ``kv_token_slots``,
``max_concurrent_requests``); this module puts a model from ``data/models.csv`` and a device
from ``data/hardware.csv`` together, draws the static figure the site shows, and builds the
ipywidgets calculator a notebook shows when ipywidgets is installed (``show_capacity`` picks).

The worked example is the PagedAttention paper's Table 1 (Kwon et al. 2023): OPT-13B, which
has Llama-2-13B's attention shape, on one A100-40GB keeps 26 GB of weights and 12 GB for the
cache, 15.7K token slots at 800 KB per token (``paper_pool_slots``). ``kv_blocks_for_device``
counts the KV blocks a table device holds beside a model's weights, for the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.analysis import formulas
from inferlab.analysis.figures import legend_outside
from inferlab.analysis.hardware import DeviceSpec, get_device_spec, load_hardware
from inferlab.model.config import ModelConfig, model_presets
from inferlab.analysis.widgets import redrawing, widget_or_figure
from inferlab.serving.config import BLOCK_SIZE

# Memory kept back for activations, the framework and its allocator: the PagedAttention paper's
# Fig. 1 leaves about 2 GB of an A100-40GB for them beside 26 GB of weights and 12 GB of cache.
DEFAULT_ACTIVATION_RESERVE = 2e9
# The share of the device's memory the engine sizes itself from: vLLM's CacheConfig default
# (vllm/config/cache.py, gpu_memory_utilization; data/engine_facts.csv row
# vllm-gpu-memory-utilization). 1.0 counts the whole device, as the paper's example does.
VLLM_GPU_MEMORY_UTILIZATION = 0.92
PAPER_KV_GIB = 12  # KV memory of OPT-13B on one A100-40GB (Kwon et al. 2023, Table 1 / Sec. 3)


@dataclass(frozen=True)
class Capacity:
    """One model on one device at one context length; bytes throughout."""

    model: str
    device: str
    context: int
    kv_dtype: str
    device_memory: float
    memory_utilization: float   # share of device_memory the engine may use
    weights: float
    activation_reserve: float
    kv_budget: float            # bytes left for the cache (negative: the weights do not fit)
    kv_bytes_per_token: int
    token_slots: int
    max_requests: int           # each reserving its whole context

    def __str__(self) -> str:
        if self.kv_budget <= 0:
            return (f"{self.model} on {self.device}: the weights ({self.weights / 1e9:.1f} GB) "
                    f"and reserve leave no room for a KV cache in {self.usable_memory / 1e9:.1f} GB "
                    f"({self.memory_utilization:.0%} of {self.device_memory / 1e9:.1f} GB)")
        return (f"{self.model} on {self.device} ({self.kv_dtype} cache, "
                f"{self.memory_utilization:.0%} of {self.device_memory / 1e9:.1f} GB): "
                f"{self.weights / 1e9:.1f} GB weights, {self.kv_budget / 1e9:.1f} GB for the cache "
                f"at {self.kv_bytes_per_token / 2**10:,.0f} KiB/token = {self.token_slots:,} token "
                f"slots = {self.max_requests:,} requests of {self.context:,} tokens")

    @property
    def usable_memory(self) -> float:
        """The bytes the engine sizes itself from: utilization x device memory."""
        return self.memory_utilization * self.device_memory


def _config(model: ModelConfig | str) -> ModelConfig:
    return ModelConfig.from_name(model) if isinstance(model, str) else model


def _spec(device: DeviceSpec | str) -> DeviceSpec:
    spec = get_device_spec(device) if isinstance(device, str) else device
    if spec.memory is None:
        raise ValueError(f"the hardware table has no memory size for {spec.name}; choose one of "
                         f"{', '.join(gpu_names())}")
    return spec


def gpu_names() -> list[str]:
    """Rows of the hardware table that have a memory size (the GPUs)."""
    return [name for name, spec in load_hardware().items() if spec.memory]


def dtype_label(dtype) -> str:
    """A number format as the tables print it: its name, or ``"1-byte"`` for bytes per number."""
    if isinstance(dtype, (int, float)):
        return f"{dtype:g}-byte"
    return str(dtype).removeprefix("torch.")


def capacity(model: ModelConfig | str, device: DeviceSpec | str, context: int,
             kv_dtype="bfloat16", weight_dtype="bfloat16",
             activation_reserve: float = DEFAULT_ACTIVATION_RESERVE,
             weights: float | None = None,
             memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> Capacity:
    """How many ``context``-token requests of ``model`` fit on ``device`` (a hardware-table row).

    ``kv_dtype`` is the cache's number format: a dtype name (``"bfloat16"``, or a one-byte
    storage format such as ``"float8_e4m3fn"`` or ``"int8"``) or bytes per number. The engine
    sizes itself from ``memory_utilization`` x the device's memory (vLLM's default 0.92); the
    weights and the ``activation_reserve`` come out of that share, the rest holds the cache."""
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization is a share of the device's memory in (0, 1], "
                         f"got {memory_utilization!r}")
    config, spec = _config(model), _spec(device)
    w = formulas.weight_bytes(config, weight_dtype) if weights is None else weights
    usable = memory_utilization * spec.memory
    budget = formulas.kv_memory_budget(config, usable, weight_dtype, activation_reserve, w)
    return Capacity(
        model=config.name, device=spec.name, context=context,
        kv_dtype=dtype_label(kv_dtype),
        device_memory=spec.memory, memory_utilization=memory_utilization, weights=w,
        activation_reserve=activation_reserve,
        kv_budget=budget, kv_bytes_per_token=formulas.kv_bytes_per_token(config, kv_dtype),
        token_slots=formulas.kv_token_slots(config, max(budget, 0.0), kv_dtype),
        max_requests=formulas.max_concurrent_requests(config, usable, context, kv_dtype,
                                                      activation_reserve, weight_dtype, w),
    )


def kv_blocks_for_device(config: ModelConfig, spec: DeviceSpec, dtype: str = "bfloat16",
                         block_size: int = BLOCK_SIZE, activation_reserve: float = 0.0) -> int:
    """KV blocks that fit on a table device beside ``config``'s weights (``formulas``), counting
    the whole of the device's memory: the simulator's pool, not an engine's utilization share."""
    budget = formulas.kv_memory_budget(config, spec.memory, dtype, activation_reserve)
    if budget <= 0:
        raise ValueError(f"{config.name}'s weights do not fit in {spec.name}'s memory")
    return formulas.kv_token_slots(config, budget, dtype) // block_size


def paper_pool_slots() -> int:
    """Token slots in 12 GiB of KV for a 13B model of OPT-13B's shape (Llama-2-13B, fp16):
    the pool of the PagedAttention paper's memory experiment."""
    config = ModelConfig.from_name("llama-2-13b")
    return PAPER_KV_GIB * 2**30 // formulas.kv_bytes_per_token(config, "float16")


def plot_capacity(models=("llama-2-7b", "llama-2-13b", "llama-3-8b", "mistral-7b"),
                  device: str = "A100 80GB SXM", contexts=None, kv_dtype="bfloat16",
                  activation_reserve: float = DEFAULT_ACTIVATION_RESERVE, ax=None,
                  memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION):
    """Requests that fit against context length, one line per model: the site's static figure."""
    import matplotlib.pyplot as plt

    contexts = contexts or [2**i for i in range(9, 16)]  # 512 .. 32K tokens
    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 4.2))
    spec = _spec(device)
    markers = "os^Dv<>p"
    top = 1
    for i, name in enumerate(models):
        config = _config(name)
        counts = [capacity(name, spec, c, kv_dtype, activation_reserve=activation_reserve,
                           memory_utilization=memory_utilization).max_requests
                  for c in contexts]
        top = max(top, *counts)
        kib = formulas.kv_bytes_per_token(config, kv_dtype) / 2**10
        window = (f", window {config.sliding_window:,}" if config.sliding_window else "")
        # alternate solid and dashed lines with open markers, so that two models with the
        # same count (Llama-3-8B and Mistral-7B up to its window) both stay visible
        ax.plot(contexts, counts, linestyle="-" if i % 2 == 0 else "--",
                marker=markers[i % len(markers)], markersize=7 if i % 2 == 0 else 5,
                markerfacecolor="none" if i % 2 else None,
                label=f"{name} ({kib:,.0f} KiB/token{window})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=1)  # linear near 0, so a count of 0 still shows
    ax.set_ylim(0, top * 2.0)              # headroom: the top markers are not cut
    ax.set_xticks(contexts, [f"{c:,}" for c in contexts])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("context reserved per request (tokens)")
    ax.set_ylabel("requests that fit at once")
    ax.set_title(f"KV cache capacity on {spec.name} ({memory_utilization:.0%} of "
                 f"{spec.memory / 1e9:.0f} GB), {dtype_label(kv_dtype)} cache, "
                 f"{activation_reserve / 1e9:.0f} GB reserve", fontsize="medium")
    ax.grid(True, which="both", alpha=0.3)
    legend_outside(ax)
    ax.figure.tight_layout()
    return ax


def capacity_widget():
    """An ipywidgets calculator: model x device x context x dtype -> concurrent requests.

    Raises ImportError when ipywidgets is missing (``pip install ipywidgets``); a notebook that
    should run everywhere calls ``show_capacity()`` instead.
    """
    import ipywidgets as widgets

    names = [n for n in model_presets() if n not in ("tiny", "small", "medium")]
    controls = {
        "model": widgets.Dropdown(options=names, value="llama-2-13b", description="model"),
        "device": widgets.Dropdown(options=gpu_names(), value="A100 40GB SXM",
                                   description="device"),
        "context": widgets.IntSlider(value=2048, min=256, max=32768, step=256,
                                     description="context", continuous_update=False),
        "kv_dtype": widgets.Dropdown(options=["bfloat16", "float32"], value="bfloat16",
                                     description="KV dtype"),
        "reserve_gb": widgets.FloatSlider(value=DEFAULT_ACTIVATION_RESERVE / 1e9, min=0, max=20,
                                          step=0.5, description="reserve GB",
                                          continuous_update=False),
        "utilization": widgets.FloatSlider(value=VLLM_GPU_MEMORY_UTILIZATION, min=0.5, max=1.0,
                                           step=0.01, description="memory share",
                                           continuous_update=False),
    }

    def draw(model, device, context, kv_dtype, reserve_gb, utilization):
        print(capacity(model, device, context, kv_dtype, activation_reserve=reserve_gb * 1e9,
                       memory_utilization=utilization))
        plot_capacity([model], device, kv_dtype=kv_dtype, activation_reserve=reserve_gb * 1e9,
                      memory_utilization=utilization)

    return redrawing(controls, [["model", "device"], ["context", "kv_dtype"],
                                ["reserve_gb", "utilization"]], draw)


def show_capacity(**plot_kwargs):
    """The widget when ipywidgets is importable, else the static figure (returns what it made)."""
    return widget_or_figure(capacity_widget, plot_capacity, **plot_kwargs)
