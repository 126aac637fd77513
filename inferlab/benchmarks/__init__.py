"""Benchmarks anyone can rerun: ``python -m inferlab.benchmarks.<name> --help``.

Each prints what it measured and on what; those meant for a GPU refuse politely on a CPU and
record their results, with provenance, in ``data/measurements/``. They take their sizes from
the device profile (``inferlab.device``) and their mechanisms from the package's public
modules; nothing in the labs or the book imports a benchmark. ``prefill`` compares the model
with Hugging Face transformers where transformers is installed (it is not a requirement).
``speculative`` measures speculative decoding with the course's trained pair at batch 1 (CPU or
GPU; it records to ``data/measurements/`` only with ``--json``). ``quant`` times int8 weight-only
decode against float and scores each weight format's perplexity (Chapter 5); ``formats`` scores
FP8, MXFP4, NVFP4 and the FP8 KV cache beside int8 and int4. ``eagle`` measures the EAGLE-style
head against the two-layer draft (acceptance, cost, speed-up against k and temperature). ``prefill_decode``
measures chunked prefill on the engine (Chapter 7's cluster study is a stored simulation:
``inferlab.sim.cluster_study``). ``decode_profile`` splits a batch-1 decode step of the engine by
operator (linear layers, attention, sampling, the rest) against the bandwidth floor (Chapter 1).
``loadgen_agreement`` runs
Chapter 9's load generator against the course server and compares its view with the engine's
clock, request by request. ``gpu_suite`` runs every solved lab and every GPU benchmark on a GPU in one command, within
eight minutes.
"""
