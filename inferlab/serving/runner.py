"""The model runner: one step's prefills and decode batch, run on the model over the paged cache.

nano-vllm's ``ModelRunner`` reads the scheduled sequences, builds the step's inputs from Python
lists (``prepare_prefill``, ``prepare_decode``), runs the model and samples. This one does the
same, greedily unless a request asks for a temperature (``inferlab.serving.sampling``). Each forward's inputs (token ids and positions) and its attention metadata
(slots, block tables, context lengths: ``inferlab.serving.paged_cache.prepare``) are built
once, reach the device in one copy, and are bound to the cache for every layer to read.

- A prefill runs one sequence's tokens (its prompt, and after a preemption the tokens it already
  produced) in one forward (1, T).
- A decode runs one new token for each sequence in one forward (n, 1), at each row's last slot.
- A chunked step (``forward``) runs decode rows and prefill chunks (each sequence's next
  uncomputed tokens) in one forward, packed into one row (1, N) (``inferlab.serving.ragged``);
  it samples at each row's last token. A chunk that leaves part of its prompt for later draws
  nothing from its sequence's generator (its token is dropped), so a seeded request's tokens do
  not depend on how its prompt was chunked.

The runner only reads the sequences; the scheduler changes them.
"""

from __future__ import annotations

import torch

from inferlab.serving.paged_cache import PagedKVCache
from inferlab.serving.request import Sequence
from inferlab.serving.sampling import sample, sampling_inputs


class ModelRunner:
    """Runs prefills and decode batches on ``model`` over ``cache``; greedy sampling unless a
    sequence asks for a temperature (``inferlab.serving.sampling.sample``)."""

    def __init__(self, model, cache: PagedKVCache):
        self.model, self.cache = model, cache

    def prepare_prefill(self, seq: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
        """Input ids and positions (1, T) of a prefill, with its metadata bound to the cache."""
        ids, positions, meta = self.cache.prepare([seq.table], [seq.tokens])
        self.cache.bind([seq.table], meta)
        return ids, positions

    def prepare_decode(self, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Input ids and positions (n, 1): each row's newest token at its table's last slot.

        For a running sequence that slot is the one ``append_slot`` just made; a padding row
        (a finished member of a static batch) rewrites its last slot, at the same cost.
        """
        tables = [s.table for s in seqs]
        ids, positions, meta = self.cache.prepare(tables, [[s.output[-1]] for s in seqs])
        self.cache.bind(tables, meta)
        return ids, positions

    def prepare_forward(self, rows: list[tuple[Sequence, int]]):
        """Input ids and positions (1, N) of a packed step: each row's next ``n`` uncomputed
        tokens, one-token rows first as given; the metadata is bound to the cache."""
        tables = [s.table for s, _ in rows]
        starts = [s.num_computed for s, _ in rows]
        tokens = [s.token_slice(s.num_computed, n) for s, n in rows]
        ids, positions, meta = self.cache.prepare_ragged(tables, tokens, starts)
        self.cache.bind(tables, meta)
        return ids, positions, meta.last_index

    @torch.inference_mode()
    def prefill(self, seq: Sequence) -> int:
        ids, positions = self.prepare_prefill(seq)
        logits = self.model(ids, positions, self.cache, last_only=True)[:, -1]  # (1, V)
        return sample(logits, *sampling_inputs([seq]))[0]

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> list[int]:
        ids, positions = self.prepare_decode(seqs)
        logits = self.model(ids, positions, self.cache)[:, -1]  # (n, V)
        return sample(logits, *sampling_inputs(seqs))

    @torch.inference_mode()
    def forward(self, decodes: list[Sequence], chunks: list[tuple[Sequence, int]]) -> list[int]:
        """One forward pass: a token for each of ``decodes``, and ``(seq, n)`` chunks, the next
        ``n`` uncomputed tokens of each. Returns a token per row, decodes first, sampled at each
        row's last token (the loop drops those of chunks that leave part of a prompt)."""
        if not chunks:
            return self.decode(decodes)  # decodes only: the (n, 1) path
        ids, positions, last = self.prepare_forward([(s, 1) for s in decodes] + chunks)
        logits = self.model(ids, positions, self.cache, logits_at=last)[0]  # (rows, V)
        seqs = [*decodes, *(s for s, _ in chunks)]
        emits = [True] * len(decodes) + [n == s.num_uncomputed for s, n in chunks]
        return sample(logits, *sampling_inputs(seqs, emits))
