"""The model runner: one forward pass over rows of any length, on the model and the paged cache.

nano-vllm's ``ModelRunner`` reads the scheduled sequences, builds the step's inputs from Python
lists, runs the model and samples. This one has ONE method, ``forward(rows)``: each row is a
sequence and how many of its next tokens to run, and every kind of step is a list of rows:

- a decode batch: a row of one token per running sequence, at its newest slot;
- a whole prompt (Chapter 4's prefill): one row of all its uncomputed tokens;
- a chunked step (Chapter 7): the decode rows and the prefill chunks together.

The rows' new tokens are packed end to end in one row (1, N) (``inferlab.serving.ragged``); the
inputs (token ids, positions) and the attention metadata (slots, block tables, context
lengths, masks) are built once from Python lists, reach the device in one copy, and are bound
to the cache before the forward for every layer to read. The logits are computed at each row's
last token only, and sampled on the device (``inferlab.serving.sampling``): greedy unless the
sequence asks for a temperature, with the sequence's own generator on the cache's device. A row that leaves part of its prompt for later (a chunk) draws nothing from
its sequence's generator (its token is dropped), so a seeded request's tokens do not depend on
how its prompt was chunked.

The runner only reads the sequences; the scheduler changes them.
"""

from __future__ import annotations

import torch

from inferlab.serving.interfaces import Runner
from inferlab.serving.paged_cache import PagedKVCache
from inferlab.serving.request import Sequence
from inferlab.serving.sampling import DeviceGenerators, sample, sampling_inputs


class ModelRunner(Runner):
    """Runs forward passes of ``model`` over ``cache``."""

    def __init__(self, model, cache: PagedKVCache):
        self.model, self.cache = model, cache
        self.generators = DeviceGenerators(cache.k.device)  # each sequence's stream, there

    def prepare(self, rows: list[tuple[Sequence, int]]):
        """Input ids and positions (1, N) of one forward: each row's next ``n`` tokens; the
        metadata is bound to the cache. Returns them with each row's last index in the row."""
        tables = [s.table for s, _ in rows]
        starts = [s.row_start(n) for s, n in rows]
        tokens = [s.token_slice(start, n) for (s, n), start in zip(rows, starts)]
        ids, positions, meta = self.cache.prepare(tables, tokens, starts)
        self.cache.bind(tables, meta)
        return ids, positions, meta.last_index

    @torch.inference_mode()
    def forward(self, rows: list[tuple[Sequence, int]]) -> list[int]:
        """One forward pass over ``rows`` ``(sequence, new tokens)``: a token per row, sampled
        at its last new token (meaningful for rows that complete their sequence's uncomputed
        tokens; put one-token rows first, as the loop does: they are attended together)."""
        ids, positions, last = self.prepare(rows)
        logits = self.model(ids, positions, self.cache, logits_at=last)[0]  # (rows, V)
        seqs = [s for s, _ in rows]
        emits = [n == s.num_uncomputed for s, n in rows]
        return sample(logits, *sampling_inputs(seqs, emits, self.generators))
