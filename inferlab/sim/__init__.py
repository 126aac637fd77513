"""Serving without a model: request traces, and runs whose step times are modelled, not measured.

Read in this order: ``traces`` (ShareGPT- and Alpaca-like request lengths, Poisson arrivals, and
the engine's requests made from them), ``memory_sim`` (the engine's scheduler and loop under
four reservation schemes, recording where KV memory goes), ``simulator`` (the same loop on a
virtual clock with fitted or roofline step costs; it returns the ``Run`` that ``serve`` does),
``steady_state`` (a Poisson stream served until what is measured stops changing: offered
against achieved load, overload, the highest rate within an SLO), ``sweeps`` (Chapter 4's
steady-state sweep, stored in ``data/simulations/``), ``plots`` (timelines, latency-throughput
curves and steady states), ``workloads`` (Chapter 7's mixed trace, and
chat-like, long-document and short-prompt streams), ``disaggregation`` (a cluster of prefill,
decode or colocated instances on one timeline, its router, KV transfers and failures),
``goodput`` (the highest rate within an SLO, in a steady state).
"""
