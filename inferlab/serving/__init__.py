"""The serving engine: many requests over one paged KV cache, scheduled one iteration at a time.

Read in this order: ``config`` (``ServingConfig``, the one object of sizes every part reads),
``request`` (a request, the check every front door runs on it, the sequence the engine makes of
it, its longest length), ``block_manager`` (blocks, block tables, the paged memory the scheduler
admits through), ``reservation`` (the contiguous reservations paging replaced, with the same
interface), ``step`` (what one iteration runs: its prefills, decodes, chunks, padding rows and
preemptions), ``scheduler`` (the queues and the only actions that change a sequence),
``policies`` (who prefills, decodes or is preempted each step: continuous, chunked, static and
dynamic batching, written with those actions), ``paged_cache``
(the K/V pool and each forward's attention metadata; ``paged_int8``, the same pool in int8
codes with scales), ``paged_attention`` (attention read in place on any device;
``paged_triton``, the fused GPU kernel), ``ragged`` (rows of any length packed into one forward
pass: the metadata every engine forward is built with), ``sampling`` (the next token from the
logits: greedy, or a seeded draw at a temperature), ``runner`` (the engine's one forward:
``forward(rows)``, rows of a sequence and its new tokens), ``loop`` (the loop every run goes
through, one ``StepLoop`` a step at a time, and its clocks), ``iteration`` (the log of a run:
an ``Iteration`` a step, its ``Forward`` passes and their ``Row``s), ``run`` (the ``Run`` a
loop returns: a ``Result`` per request), ``engine``
(``serve``, the front door), ``metrics`` (TTFT, TPOT, percentiles, goodput, the largest gap
between tokens), ``prefix_cache`` (sharing the blocks of a common prompt start, and the memory
manager that admits through it), ``online`` (the engine stepped by a background loop while
requests arrive, one token stream per request, a failure ending only the requests it hit: what
``inferlab.serve`` serves).
"""
