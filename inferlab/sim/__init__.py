"""Serving without a model: request traces, and runs whose step times are modelled, not measured.

Read in this order: ``traces`` (ShareGPT- and Alpaca-like request lengths), ``workloads``
(every Poisson trace: lengths to draw from, arrivals, the engine's requests made from them,
Chapter 7's streams and mixed trace), ``memory_sim`` (the engine's scheduler and loop under
four reservation schemes, recording where KV memory goes), ``simulator`` (the same loop on a
virtual clock with fitted or roofline step costs; it returns the ``Run`` that ``serve`` does),
``work`` (what each simulated instance computed and moved, counted row by row against a ledger
of the K/V computed so far, the counts every simulated conclusion is checked by),
``steady_state`` (the one steady-state machinery: a window between warm-up and drain over any
run, a trace grown until it stops changing, the highest rate within an SLO), ``records``
(its results to JSON and back), ``sweeps``
(Chapter 4's steady-state sweep, stored in ``data/simulations/``), ``plots`` (timelines,
latency-throughput curves and steady states), ``disaggregation`` (a cluster of prefill, decode
or colocated instances on one timeline, its router, KV transfers and failures), ``goodput``
(per-GPU goodput: the steady-state search on a cluster), ``cluster_study`` (Chapter 7's stored
comparison of colocated, chunked and disaggregated clusters); and the studies built on the
simulator: ``step_fit`` (the step-time model fitted to the engine's logged steps),
``cost_limits`` (what holds a simulated batch down), ``token_cost`` (dollars per million tokens
from the roofline floor and from the steady-state simulator within an SLO; the dollar formulas
and the sizes at a precision it offers by name live below, in ``inferlab.analysis.prices`` and
``inferlab.analysis.step_time``) and ``cost_calculator`` (Chapter 8's calculator and its
widget).
"""
