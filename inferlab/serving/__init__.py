"""The serving engine: many requests over one paged KV cache, scheduled one iteration at a time.

Read in this order: ``config`` (``ServingConfig``, the one object of sizes every part reads),
``request`` (a request, the check every front door runs on it, the sequence the engine makes of
it, its longest length), ``block_manager`` (blocks, block tables, the paged memory the scheduler
admits through), ``reservation`` (the contiguous reservations paging replaced, with the same
interface), ``scheduler`` (who prefills, decodes or is preempted each step), ``paged_cache``
(the K/V pool and each forward's attention metadata; ``paged_int8``, the same pool in int8
codes with scales), ``paged_attention`` (attention read in place on any device;
``paged_triton``, the fused GPU kernel), ``ragged`` (decodes and prefill chunks packed into one
forward pass, for chunked prefill), ``sampling`` (the next token from the logits: greedy, or a
seeded draw at a temperature), ``runner`` (one step on the model), ``loop`` (the loop every run
goes through, one ``Server`` a step at a time, and the ``Run`` it returns), ``engine``
(``serve``, the front door), ``metrics`` (TTFT, TPOT, percentiles, goodput, the largest gap
between tokens), ``prefix_cache`` (sharing the blocks of a common prompt start, and the memory
manager that admits through it), ``online`` (the engine stepped by a background loop while
requests arrive, one token stream per request, a failure ending only the requests it hit: what
``inferlab.serve`` serves).
"""
