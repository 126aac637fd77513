"""inferlab: the helper package of the Memory-Bound course.

The folders are the architecture; each module holds one mechanism:

- ``model/``: the Llama-architecture network, its KV cache, generation, checkpoints, and the
  course's own trained models (corpus, tokenizer, training script, quality measures).
- ``serving/``: the engine: one ``ServingConfig``, requests, the scheduler and its policies, the
  paged cache (block manager and pool), attention and the model runner, the loop, ``serve``,
  metrics (and their Prometheus export), prefix caching, and the engine online (``online``: a
  background loop, a token stream per request).
- ``serve/``: the engine behind an OpenAI-compatible HTTP server (``python -m inferlab.serve``):
  the wire format, tenants, the app, a local background server.
- ``loadgen/``: a load generator for any OpenAI-compatible server (``python -m
  inferlab.loadgen``), its report, and the prefix-cache timing side channel.
- ``sim/``: request traces and serving runs with modelled step times (memory, latency).
- ``analysis/``: formulas, the hardware table and probes, the roofline, capacity calculators.
- ``course/``: the labs' checks, the student-lab generator, the grader, the course catalog.
- ``benchmarks/``: runnable measurements (``python -m inferlab.benchmarks.<name>``).

The ground floor, which everything above may use: ``data`` (the course's tables), ``device``
(device choice, size profiles, free memory), ``timing`` (``torch.utils.benchmark``),
``validation`` (the size checks constructors make, and the one check of a request the engine
serves), ``measurements`` (results measured on real devices, with their provenance).
"""

from inferlab.data import data_path, read_table

__version__ = "0.1.0"

__all__ = ["__version__", "data_path", "read_table"]
