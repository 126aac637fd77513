"""First-principles numbers: the formulas, the hardware table, the roofline, and calculators.

Read in this order: ``formulas`` (bytes, FLOPs, intensity and floors the book quotes),
``hardware`` (the device table, detection, bandwidth and FLOP/s probes), ``roofline`` (the model
and its plot), ``decode_timing`` (one generation step timed: cached decode against recompute),
``capacity`` (how many requests or KV blocks fit on a device), ``widgets`` and ``explore`` (the
interactive calculators).
"""
