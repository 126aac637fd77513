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
- ``scheduler``, ``engine`` and ``metrics``: continuous batching over the paged cache (admission,
  preemption by recompute, a static baseline), ``serve(model, requests)``, TTFT/TPOT/percentiles.
- ``simulator`` and ``serving_plots``: the serving loop with modelled step times, and its figures.
- ``benchmarks``: runnable measurements (``python -m inferlab.benchmarks.kv_cache``, ...).
- ``checks``: the feedback cells of each lab.
- ``labgen``: generates the student labs from the solved notebooks.
"""

from inferlab.data import data_path, read_table

__version__ = "0.1.0"

__all__ = ["__version__", "data_path", "read_table"]
