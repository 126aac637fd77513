"""inferlab: the helper package of the Memory-Bound course.

Small modules, one concern each (read them in this order):

- ``data``: where the course's tables live, and how to read them.
- ``device``: which device to run on, and the size profile that fits it.
- ``timing``: timing on ``torch.utils.benchmark``.
- ``hardware``: the hardware table, device detection, bandwidth and FLOP/s probes.
- ``formulas``: the numbers the book quotes (bytes, FLOPs, intensity, floors).
- ``roofline``: attainable FLOP/s, ridge points, and the roofline plot.
- ``model``: a Llama-architecture model with Hugging Face parameter names.
- ``kv_cache`` and ``generate``: the reference KV cache and the generation steps.
- ``weights``: load and save Hugging Face checkpoints (safetensors), and their tokenizers.
- ``gqa`` and ``capacity``: fewer KV heads by mean pooling; how many requests fit on a device.
- ``traces``: synthetic ShareGPT- and Alpaca-like request lengths, Poisson arrivals.
- ``paged`` (and ``paged_triton``): block allocator, block tables with copy-on-write, the paged
  KV cache and its attention (a fused Triton decode kernel where a GPU has Triton).
- ``memory_sim`` and ``prefix_cache``: where reserved KV memory goes under each reservation
  policy; prefix caching by hashing full blocks.
- ``scheduler``, ``engine`` and ``metrics``: continuous batching over the paged cache (admission,
  preemption by recompute, a static baseline), ``serve(model, requests)``, TTFT/TPOT/percentiles.
- ``simulator`` and ``serving_plots``: the serving loop with modelled step times, and its figures.
- ``benchmarks``: runnable measurements (``python -m inferlab.benchmarks.kv_cache``, ...).
- ``validation``: the checks on sizes every constructor makes; ``widgets``: the calculators'
  shared controls (ipywidgets when present, the static figure otherwise).
- ``explore``: the roofline explorer (where decode lands for a device, model, batch, dtype).
- ``measurements``: results measured on real devices (``data/measurements``) with provenance.
- ``checks``: the feedback cells of each lab; ``grade``: grades submitted lab notebooks.
- ``labgen``: generates the student labs from the solved notebooks; ``course``: reads the
  table of contents, the labs and their checks (for the grader and the instructor guide).
"""

from inferlab.data import data_path, read_table

__version__ = "0.1.0"

__all__ = ["__version__", "data_path", "read_table"]
