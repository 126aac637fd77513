"""First-principles numbers: the formulas, the hardware table, the roofline, and calculators.

Read in this order: ``formulas`` (bytes, FLOPs, intensity and floors the book quotes),
``hardware`` (the device table, detection, bandwidth and FLOP/s probes), ``roofline`` (the model
and its plot), ``capacity`` (how many requests fit on a device), ``widgets`` and ``explore`` (the
interactive calculators).
"""
