"""The paged K/V pool and its attention: K/V written and read through block tables.

The pool holds every layer's K and V in fixed-size blocks, shaped (L, blocks, block_size, K, D);
which block belongs to which sequence is the block manager's business
(``inferlab.serving.block_manager``). ``PagedKVCache.bind`` says which sequences the next forward
runs (and runs the queued copy-on-write copies first); ``attend`` (called by the model once per
layer) writes the new K/V through each sequence's slot mapping and attends each row over its own
blocks. On a GPU, decode attention reads K/V straight through the block table with a Triton
kernel (``inferlab.serving.paged_triton``); elsewhere ``attend`` gathers the blocks into a
contiguous tensor and calls ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from inferlab.serving.block_manager import BlockAllocator, BlockTable
from inferlab.validation import positive_ints


def gather_index(tables: list[BlockTable], lengths: list[int],
                 device: str | torch.device = "cpu") -> torch.Tensor:
    """Slots (B, N) of tokens 0..lengths[b]-1 of each table; N = max(lengths), padded with 0.

    Padding points at slot 0, which holds some other sequence's K/V: mask those keys out.
    """
    idx = torch.zeros(len(tables), max(lengths), dtype=torch.long, device=device)
    for b, (table, n) in enumerate(zip(tables, lengths)):
        idx[b, :n] = table.slot_mapping(torch.arange(n, device=device))
    return idx


def gather_kv(pool: torch.Tensor, index: torch.Tensor,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """K or V from one layer's pool (num_slots, K, D) at slots ``index`` (B, N): (B, K, N, D).

    ``out`` (rows, K, D) with rows >= B * N is a buffer to gather into. Reusing one matters on a
    CPU: a fresh buffer of tens of MB at every layer costs more in page faults than the copy.
    """
    B, N = index.shape
    flat = index.reshape(-1)
    if out is None:
        rows = pool.index_select(0, flat)
    else:
        rows = torch.index_select(pool, 0, flat, out=out[: flat.numel()])
    return rows.view(B, N, *pool.shape[1:]).transpose(1, 2)  # (B, K, N, D)


class PagedKVCache:
    """The paged K/V pool for every layer: (L, num_blocks, block_size, K, D) for K and for V."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int = 16, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", use_triton: bool | None = None):
        positive_ints("PagedKVCache ", n_layers=n_layers, n_kv_heads=n_kv_heads,
                      head_dim=head_dim, num_blocks=num_blocks, block_size=block_size)
        shape = (n_layers, num_blocks, block_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.allocator = BlockAllocator(num_blocks)
        self.tables: list[BlockTable] = []
        self._plan = None  # per-forward index tensors, shared by every layer
        self._gathered: dict[str, torch.Tensor] = {}  # reused gather buffers, grown on demand
        if use_triton is None:  # the fused kernel where it can run, the gather path elsewhere
            from inferlab.serving import paged_triton
            use_triton = paged_triton.available(self.k.device)
        self.use_triton = use_triton

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16, **kw) -> "PagedKVCache":
        """A pool shaped for ``model`` (an ``inferlab.model.llama.Llama``), in its dtype and device."""
        c = model.config
        return cls(c.n_layers, c.n_kv_heads, c.head_dim, num_blocks, block_size,
                   model.dtype, model.device, **kw)

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes the K and V pools occupy."""
        return 2 * self.k.numel() * self.k.element_size()

    def new_table(self) -> BlockTable:
        """An empty block table drawing on this cache's allocator."""
        return BlockTable(self.allocator, self.block_size)

    def copy_pending(self) -> None:
        """Run the allocator's queued copy-on-write copies (all layers), oldest first."""
        for source, dest in self.allocator.take_copies():
            self.k[:, dest] = self.k[:, source]
            self.v[:, dest] = self.v[:, source]

    def bind(self, tables: list[BlockTable]) -> None:
        """Say which sequences the next forward runs: row b of the batch is ``tables[b]``.

        Each table must already have room for the new tokens (``table.append``). Queued
        copy-on-write copies are done here, before any layer writes.
        """
        for table in tables:
            if table.allocator is not self.allocator:
                raise ValueError("a table from another allocator was bound to this cache")
        self.copy_pending()
        self.tables = list(tables)
        self._plan = None

    def _make_plan(self, positions: torch.Tensor, T: int):
        B = len(self.tables)
        if positions.dim() == 1:
            positions = positions.expand(B, T)
        if tuple(positions.shape) != (B, T):
            raise ValueError(f"positions have shape {tuple(positions.shape)}, expected {(B, T)} "
                             f"(the batch has {B} bound tables)")
        lengths = [int(p) + 1 for p in positions[:, -1].tolist()]  # causal: keys 0..last
        for b, (table, n) in enumerate(zip(self.tables, lengths)):
            if n > table.num_tokens:
                raise ValueError(f"row {b} writes position {n - 1} but its table holds "
                                 f"{table.num_tokens} tokens; call table.append first")
        slots = torch.stack([t.slot_mapping(p) for t, p in zip(self.tables, positions)])  # (B, T)
        plan = dict(lengths=lengths, slots=slots.reshape(-1))
        if not (self.use_triton and T == 1):  # the gather path: slot index and causal mask
            mask = torch.arange(max(lengths), device=positions.device) <= positions[:, :, None]
            plan.update(mask=mask[:, None],  # (B, 1, T, N)
                        gather=gather_index(self.tables, lengths, self.k.device))
        else:
            width = max(len(t.blocks) for t in self.tables)
            table = torch.zeros(B, width, dtype=torch.int32)
            for b, t in enumerate(self.tables):
                table[b, :len(t.blocks)] = torch.tensor(t.blocks, dtype=torch.int32)
            plan["block_table"] = table.to(self.k.device)
            plan["context_lens"] = torch.tensor(lengths, dtype=torch.int32, device=self.k.device)
        return plan

    def _buffer(self, name: str, rows: int) -> torch.Tensor:
        """A (>= rows, K, D) buffer for gathered K or V, kept between layers and steps."""
        buf = self._gathered.get(name)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(rows, *self.k.shape[3:], dtype=self.k.dtype, device=self.k.device)
            self._gathered[name] = buf
        return buf

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """Write k, v (B, K, T, D) at ``positions`` (B, T); attend q (B, H, T, D) causally."""
        B, H, T, D = q.shape
        if len(self.tables) != B:
            raise ValueError(f"the batch has {B} rows but {len(self.tables)} tables are bound; "
                             "call cache.bind(tables) before the forward")
        K = self.k.shape[3]
        if tuple(k.shape) != (B, K, T, D) or tuple(v.shape) != (B, K, T, D):
            raise ValueError(f"k, v have shapes {tuple(k.shape)}, {tuple(v.shape)}; expected "
                             f"{(B, K, T, D)} (batch, KV heads, new tokens, head_dim)")
        if k.dtype != self.k.dtype:
            raise TypeError(f"k is {k.dtype} but the cache holds {self.k.dtype}")
        if self._plan is None or self._plan["source"] is not positions:
            self._plan = self._make_plan(positions, T)
            self._plan["source"] = positions
        plan = self._plan
        k_pool = self.k[layer].view(-1, K, D)  # (num_slots, K, D)
        v_pool = self.v[layer].view(-1, K, D)
        k_pool[plan["slots"]] = k.transpose(1, 2).reshape(B * T, K, D)
        v_pool[plan["slots"]] = v.transpose(1, 2).reshape(B * T, K, D)
        if "block_table" in plan:
            from inferlab.serving.paged_triton import paged_decode_attention
            return paged_decode_attention(q, self.k[layer], self.v[layer], plan["block_table"],
                                          plan["context_lens"])
        k_all = gather_kv(k_pool, plan["gather"], self._buffer("k", plan["gather"].numel()))
        v_all = gather_kv(v_pool, plan["gather"], self._buffer("v", plan["gather"].numel()))
        return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=plan["mask"],
                                              enable_gqa=H != K)
