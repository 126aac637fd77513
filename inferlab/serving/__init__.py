"""The serving engine: many requests over one paged KV cache, scheduled one iteration at a time.

Read in this order: ``block_manager`` (the block allocator and block tables), ``paged_cache``
(the K/V pool and its attention; ``paged_triton``, the fused GPU kernel), ``scheduler`` (who
prefills, decodes or is preempted each step), ``engine`` (the model runner, the loop and
``serve``), ``metrics`` (TTFT, TPOT, percentiles, goodput), ``prefix_cache`` (sharing the
blocks of a common prompt start).
"""
