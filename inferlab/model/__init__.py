"""The model: a Llama-architecture network and how it generates, with no serving state.

Read in this order: ``config`` (the shape, and the presets of ``data/models.csv``), ``llama``
(the network, with Hugging Face parameter names), ``kv_cache`` (the reference contiguous cache),
``generate`` (prefill, one decode step, the loop), ``speculative`` (draft, verify in one pass,
roll back: several tokens per target pass), ``weights`` (Hugging Face checkpoints and
tokenizers), ``gqa`` (fewer KV heads by mean pooling), ``quant`` (int8 and int4 weights per
group, an int8 weight-only layer; the int8 KV cache is in ``kv_cache``), ``formats`` (FP8,
block-wise FP8, MXFP4 and NVFP4 emulated), ``fp8_kv_cache`` (an FP8 cache with static scales),
``eagle`` (an EAGLE-style draft head on the target's features), ``chat_template`` (a
conversation rendered into one prompt by the tokenizer's Jinja template), ``constrained`` (a
regular expression as a per-step vocabulary mask), ``moe`` (a Mixtral-style
mixture of experts in Mixtral's checkpoint layout) and ``routing`` (what its router did: load
per expert, imbalance, distinct experts per batch). The course's own trained pair:
``corpus`` (the Python standard library as text), ``bpe`` (the tokenizer), ``train`` (the
training script; ``train_eagle`` trains the draft head), ``quality`` (perplexity, bits per byte, the unigram baseline).
"""
