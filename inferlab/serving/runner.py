"""The model runner: one forward pass over rows of any length, on the model and the paged pool.

nano-vllm's ``ModelRunner`` reads the scheduled sequences, builds the step's inputs from Python
lists, runs the model and samples. This one has ONE method, ``forward(rows)``: each row is a
``Span`` (``inferlab.serving.policies``), a sequence and the tokens of it to run, and every
kind of step is a list of rows:

- a decode batch: a row of one token per running sequence, at its newest slot;
- a whole prompt (Chapter 4's prefill): one row of all its uncomputed tokens;
- a chunked step (Chapter 7): the decode rows and the prefill chunks together.

The rows' new tokens are packed end to end in one row (1, N); their inputs and the attention
metadata are built once, from Python lists, and reach the device in one copy
(``inferlab.serving.paged_attention.prepare``); the model receives that metadata as its cache.
The logits are computed at each row's last token only and sampled on the device
(``inferlab.model.sampling.sample``): greedy unless the sequence asks for a temperature, with
the sequence's own generator on the pool's device. A row that keeps no token (a chunk that
leaves part of its prompt for later, a padding row) draws nothing from its sequence's
generator, so a seeded request's tokens do not depend on how its prompt was chunked.

The runner only reads the sequences; the scheduler changes them.
"""

from __future__ import annotations

import weakref

import torch

from inferlab.model.sampling import sample
from inferlab.serving.interfaces import Runner
from inferlab.serving.paged_attention import prepare
from inferlab.serving.paged_cache import PagedKVCache
from inferlab.serving.policies import Span


class ModelRunner(Runner):
    """Runs forward passes of ``model`` over ``cache``."""

    def __init__(self, model, cache: PagedKVCache):
        self.model, self.cache = model, cache
        self.device = cache.k.device
        self._generators = weakref.WeakKeyDictionary()  # each sequence's stream on the device

    def generator(self, seq) -> torch.Generator | None:
        """``seq``'s random stream on the pool's device (on a GPU: seeded from its own)."""
        if seq.generator is not None and self.device.type != "cpu" and seq not in self._generators:
            self._generators[seq] = torch.Generator(self.device).manual_seed(
                seq.generator.initial_seed())
        return self._generators.get(seq, seq.generator)

    @torch.inference_mode()
    def forward(self, rows: list[Span]) -> list[int]:
        """One forward pass over ``rows`` (one-token rows first): a token per row, sampled at
        its last new token (drawn only where ``row.emits``)."""
        ids, positions, meta = prepare([r.seq.table for r in rows], [r.seq.token_slice(
            r.start, r.new) for r in rows], [r.start for r in rows], self.cache)
        logits = self.model(ids, positions, meta, logits_at=meta.last_index)[0]  # (rows, V)
        requests = [r.seq.request for r in rows]
        return sample(logits, torch.tensor([q.temperature for q in requests], dtype=torch.float32),
                      [self.generator(r.seq) if r.emits else None for r in rows],
                      torch.tensor([q.top_k for q in requests], dtype=torch.int64),
                      torch.tensor([q.top_p for q in requests], dtype=torch.float32))
