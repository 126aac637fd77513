"""The serving engine: many requests over one paged KV cache, scheduled one iteration at a time.

Read in this order. The data: ``config`` (``ServingConfig``, the one object of sizes every part
reads), ``request`` (a ``Request``, the ``Sequence`` the engine makes of it, and the ``Span``
rows a forward pass runs); whether a request can be served at all is ``inferlab.validation``'s
one check, run once per request. Memory: ``paged_cache`` (blocks, block tables, the
``BlockManager`` the scheduler admits through, and the K/V pool they index; ``paged_int8``, the
same pool in int8 codes with scales), ``reservation`` (the contiguous reservations paging
replaced, with the same interface), ``prefix_cache`` (sharing the blocks of a common prompt
start; ``kv_tier``, a second tier below it). Deciding a step: ``scheduler`` (the ``Step`` a
policy returns, laid out as forward passes of ``Span`` rows; the queues and the only actions
that change a sequence, checking each step and recording its tokens; and the policies beside
it: continuous, chunked, static and dynamic batching). Running it: ``paged_attention`` (one
forward's metadata, built once, attention over the blocks in place, and the ``ModelRunner``,
the engine's one forward: ``forward(rows)``; ``paged_triton``, the fused GPU kernel;
``shared_prefix``, attention over a prefix every row shares; sampling is
``inferlab.model.sampling``'s, shared with the labs). The loop: ``interfaces`` (the memory,
runner and clock every loop runs through), ``iteration`` (the log of a run: an ``Iteration`` a
step, its ``Forward`` passes and their ``Row``s), ``run`` (the ``Run`` a loop returns: a
``Result`` per request), ``loop`` (``StepLoop``, the loop every run goes through, and its
clocks; every kept token leaves through one hook), ``engine`` (``Engine``, the loop wired once
over the model, and ``serve``, the front door), ``metrics`` (TTFT, TPOT, percentiles, goodput,
the largest gap between tokens, and the series a server exports to Prometheus), ``online`` (one
``Engine`` stepped by a background thread while requests arrive, one token stream per request,
a failure ending only the requests it hit: what ``inferlab.serve`` serves).

Where what comes next plugs in: a step's metadata is built in one place
(``paged_attention.prepare``, from the ``Span`` rows ``Step.plan`` lays out), so a decode path
that shares a prefix's K/V (cascade attention, ``paged_attention.split_prefix``) adds its
segment there; a second KV tier sits under the memory manager (``interfaces.MemoryManager``:
``allocate_sequence`` reports what is cached, ``make_room`` evicts); logits are masked in one
place (``inferlab.model.sampling.sample``, between the logits and the draw), where a grammar's
token bitmask would apply; every token leaves through one hook (``StepLoop.on_token``), which an
overlapped scheduler or a new endpoint reads as it is.
"""
