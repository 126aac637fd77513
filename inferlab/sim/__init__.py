"""Serving without a model: request traces, and runs whose step times are modelled, not measured.

Read in this order: ``traces`` (ShareGPT- and Alpaca-like request lengths, Poisson arrivals),
``memory_sim`` (where reserved KV memory goes under four reservation policies), ``simulator``
(the engine's own scheduler and loop on a virtual clock), ``plots`` (timelines and
latency-throughput curves).
"""
