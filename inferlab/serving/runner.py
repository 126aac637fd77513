"""The model runner: one step's prefills and decode batch, run on the model over the paged cache.

nano-vllm's ``ModelRunner`` reads the scheduled sequences, builds the step's inputs from Python
lists (``prepare_prefill``, ``prepare_decode``), runs the model and samples. This one does the
same, greedily. Each forward's inputs (token ids and positions) and its attention metadata
(slots, block tables, context lengths: ``inferlab.serving.paged_cache.prepare``) are built
once, reach the device in one copy, and are bound to the cache for every layer to read.

- A prefill runs one sequence's tokens (its prompt, and after a preemption the tokens it already
  produced) in one forward (1, T).
- A decode runs one new token for each sequence in one forward (n, 1), at each row's last slot.

The runner only reads the sequences; the scheduler changes them.
"""

from __future__ import annotations

import torch

from inferlab.serving.paged_cache import PagedKVCache
from inferlab.serving.request import Sequence


class ModelRunner:
    """Runs prefills and decode batches on ``model`` over ``cache``; greedy sampling."""

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

    @torch.inference_mode()
    def prefill(self, seq: Sequence) -> int:
        ids, positions = self.prepare_prefill(seq)
        logits = self.model(ids, positions, self.cache, last_only=True)[:, -1]  # (1, V)
        return int(logits.argmax(-1))

    @torch.inference_mode()
    def decode(self, seqs: list[Sequence]) -> list[int]:
        ids, positions = self.prepare_decode(seqs)
        logits = self.model(ids, positions, self.cache)[:, -1]  # (n, V)
        return logits.argmax(-1).tolist()
