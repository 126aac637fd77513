"""First-principles numbers: the formulas, the hardware table, the roofline, and calculators.

Read in this order: ``formulas`` (bytes, FLOPs, intensity and floors the book quotes),
``hardware`` (the device table, detection, bandwidth and FLOP/s probes), ``roofline`` (the model
and its plot), ``step_time`` (the course's one model of a step's time: every kernel on its own
roofline, summed; everything that models a time uses it), ``collectives`` (what one
all-reduce or all-to-all between devices costs: a per-call latency plus its bytes over the link,
from sourced tables), ``request_time`` (a request's prefill and decode at the roofline, and
recompute against swap), ``attention_io`` (prefill attention's memory traffic, with and
without tiling), ``mla`` and ``moe`` (multi-head latent attention and mixture-of-experts models),
``attention_layouts`` (KV bytes of sliding-window, linear-attention and sparse layers),
``prefix_routing`` (chats over replicas: round-robin against longest cached prefix),
``decode_timing`` (one generation step timed: cached decode against recompute),
``speculation`` (speculative decoding's expected tokens, speed-up, best k and batch crossover)
and ``speculative_timing`` (its acceptance, costs and speed-up measured),
``interference`` (how prefills stall decodes, by chunk size, measured), ``capacity``
(how many requests or KV blocks fit on a device), ``published`` (the numbers quoted from
papers, with their sources), ``figures`` (the plotting habits and the check that keeps them),
``widgets`` and ``explore`` (the interactive calculators); and what a token costs:
``prices`` (dated, sourced prices of devices and APIs, and dollars per million tokens from a
price and a rate), ``cost_split`` (the two conventions that split a mixed step between input
and output tokens, and the counts behind them), ``chip_costs`` (the chips of 2026 by
precision, reasoning output, owning against renting), ``agent_cost`` (an agent's task, with
prefix caching), ``chips`` (HBM, TPU and SRAM-first chips: chips to hold a model, speed per
user against throughput per chip). The simulated cost studies (``token_cost``,
``cost_limits``, ``cost_calculator``, ``step_fit``) live in ``inferlab.sim``: they run the
simulator, and this package imports nothing of it.
"""
