"""One forward pass over the paged pool: its metadata, built once, attention, and the runner.

Every forward of the engine is a *ragged* batch: decode rows bring one new token each, prefill
rows tens or hundreds, and a prefill chunk may continue a prompt whose first tokens are already
in the cache (chunked prefill, Sarathi-Serve, Agrawal et al. 2024). Padding every row to the
longest would multiply the work of the one-token rows, so the rows are *packed*: their new
tokens are laid end to end in one row of N = (sum of new tokens) tokens, each at its own
position (the "varlen" layout of vLLM and FlashAttention). The weight matmuls do not care which
sequence a token belongs to; only attention does, so it runs by segment:

- the leading one-token rows (the decodes) together, reading each block where it lies in the
  pool (Kwon et al. 2023): on a GPU with the fused Triton kernel
  (``inferlab.serving.paged_triton``), on a CPU with two ``embedding_bag`` sums (``paged_decode``);
- a row whose new tokens start its sequence, causally over those tokens alone (SDPA);
- a row that continues a cached prompt, over the cached tokens and its own, with the causal
  mask shifted by what is cached; its blocks are gathered first (``gather_blocks``).

``prepare`` builds all of it once per forward pass, from Python lists, in ONE host-to-device
copy (nano-vllm's ``prepare_prefill`` / ``prepare_decode`` in one): the rows' token ids and
positions, where each new token's K/V go, and what each row attends over. What it returns,
``RaggedMetadata``, is what the model receives as its cache: at every layer the model calls
``metadata.attend(layer, q, k, v, positions)``, which writes the new K/V into the pool
(``PagedKVCache.write``) and attends. Nothing is bound to the pool between forwards.

``embedding_bag`` sums rows of a table picked by an index, each row scaled by a weight, without
copying them anywhere first. Decode attention is two such sums (``paged_decode``):

- scores: the pool stores keys transposed, one (D, block_size) tile per block and KV head, so
  row (tile, d) holds dimension d of the tile's keys; the score of every key in the tile is the
  sum over d of q[d] times that row (rows picked through the block table, weights from q);
- output: the sum over the row's tokens of softmax(scores)[n] times value row n (values are
  stored one (block_size, D) tile per block and KV head).

Their indices (``decode_index``) depend only on the block tables, so ``prepare`` builds them
once per forward for every layer. ``inferlab.benchmarks.attention_paths`` times these paths
beside contiguous attention (Lab 3, ``python -m inferlab.benchmarks.paged``).

The engine's ``ModelRunner`` (nano-vllm's ``ModelRunner`` prepares and runs the same way) has
ONE method, ``forward(rows)``: each row is a ``Span`` (``inferlab.serving.request``), a sequence
and the tokens of it to run, and every kind of step is a list of rows: a decode batch (a row of
one token per running sequence, at its newest slot), a whole prompt (Chapter 4's prefill: one
row of all its uncomputed tokens), or a chunked step (Chapter 7: the decode rows and the
prefill chunks together). It builds the pass's metadata here (``prepare``), runs the model with
it as the cache, computes the logits at each row's last token only and samples them on the
device (``inferlab.model.sampling.sample``): greedy unless the sequence asks for a temperature,
with the sequence's own generator on the pool's device. A row that keeps no token (a chunk that
leaves part of its prompt for later, a padding row) draws nothing from its sequence's
generator, so a seeded request's tokens do not depend on how its prompt was chunked. The
runner only reads the sequences; the scheduler changes them.

Letters: N packed tokens, H query heads, K KV heads, D head dim, S block size, W blocks a row
reads.
"""

from __future__ import annotations

import itertools
import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from inferlab.model.sampling import sample
from inferlab.serving.interfaces import Runner
from inferlab.serving.request import Span
from inferlab.serving.structured import Matchers, apply_grammars


@dataclass(frozen=True)
class Segment:
    """A row of more than one new token (or a one-token row after the decodes): where its
    tokens sit in the packed row, and what it attends over beyond them."""

    offset: int                          # its first token's index in the packed row
    length: int                          # T, its new tokens
    tiles: torch.Tensor | None = None    # (K*W,) blocks to gather; None: nothing cached before
    mask: torch.Tensor | None = None     # (1, 1, T, W*S): the keys each query sees


@dataclass(frozen=True)
class RaggedMetadata:
    """Everything one packed forward's attention needs, shared by every layer, and the pool it
    reads and writes: what the model receives as its cache."""

    pool: object                         # the PagedKVCache (``write``, its K/V, its buffers)
    tables: tuple                        # each row's block table (``BlockTable``)
    slot_blocks: torch.Tensor            # (N,) where each new token's K/V go
    slot_offsets: torch.Tensor           # (N,)
    last_index: torch.Tensor             # (R,) each row's last token in the packed row
    decode_rows: int                     # the leading one-token rows, attended together
    decode_tables: torch.Tensor | None   # (d, W) their block tables
    decode_context: torch.Tensor | None  # (d,) keys each of them attends over
    key_rows: torch.Tensor | None        # paged_decode's indices (CPU path)
    value_rows: torch.Tensor | None
    decode_mask: torch.Tensor | None     # (d, 1, W*S); None: every key
    segments: tuple[Segment, ...]
    fused: bool                          # decodes through the Triton kernel
    prefix_tiles: torch.Tensor | None = None  # (K*P/S,) blocks every decode row shares, attended
    # once for all of them (cascade); the decode tables above then hold only what follows

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               positions: torch.Tensor | None = None) -> torch.Tensor:
        """The model's call at every layer: write k, v (1, K, N, D) into the pool at the new
        tokens' slots and attend q (1, H, N, D) by segment: (1, H, N, D)."""
        k, v, k_pool, v_pool = self.pool.write(layer, self, k, v)
        H, K, d = q.shape[1], k.shape[1], self.decode_rows
        out = torch.empty_like(q)
        if d:  # the leading one-token rows together, each reading its blocks in place
            qd = q[0, :, :d].transpose(0, 1).unsqueeze(2)  # (d, H, 1, D)
            if self.fused:
                from inferlab.serving.paged_triton import paged_decode_attention
                od = paged_decode_attention(qd.contiguous(), k_pool, v_pool, self.decode_tables,
                                            self.decode_context)
            elif self.prefix_tiles is not None:  # the shared prefix once, each row's rest
                od = cascade_decode(qd, k_pool, v_pool, self, self.pool.buffers)
            else:
                od = paged_decode(qd, k_pool, v_pool, self.key_rows, self.value_rows,
                                  self.decode_mask)
            out[0, :, :d] = od[:, :, 0].transpose(0, 1)
        for seg in self.segments:  # a row that starts its sequence attends its own tokens
            rows = slice(seg.offset, seg.offset + seg.length)
            keys, values = k[:, :, rows], v[:, :, rows]
            if seg.tiles is not None:  # it continues a cached prompt: its blocks, mask shifted
                keys, values = gather_blocks(k_pool, v_pool, seg.tiles, 1, self.pool.buffers)
            out[:, :, rows] = F.scaled_dot_product_attention(
                q[:, :, rows], keys, values, attn_mask=seg.mask,
                is_causal=seg.tiles is None and seg.length > 1, enable_gqa=H != K)
        return out


def to_device(lists: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """int64 tensors of several host lists, moved to ``device`` in one copy (pinned on a GPU):
    a step's attention metadata crosses to the device once, not once a list."""
    sizes = [len(x) for x in lists]
    host = torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.long)
    if device.type == "cuda":
        return list(host.pin_memory().to(device, non_blocking=True).split(sizes))
    return list(host.to(device).split(sizes))


def prepare(tables: list, tokens: list[list[int]], starts: list[int], pool):
    """Input ids (1, N), positions (1, N) and the ``RaggedMetadata`` of one packed forward over
    ``pool`` (a ``PagedKVCache``).

    Row b brings ``tokens[b]``, the tokens at positions ``starts[b]`` onwards of the sequence
    whose table is ``tables[b]``; the table must have slots for them. Put the one-token rows
    first: they are attended together.
    """
    lens, S, (_, _, K, D, _), device = [len(t) for t in tokens], pool.block_size, pool.k.shape, \
        pool.k.device
    if not lens or min(lens) < 1 or len(tables) != len(lens) or len(starts) != len(lens):
        raise ValueError("need one table, one start and at least one new token for every row")
    for b, (table, start, n) in enumerate(zip(tables, starts, lens)):
        if start < 0 or start + n > table.num_tokens:
            raise ValueError(f"row {b} runs positions {start}..{start + n - 1} but its table "
                             f"holds {table.num_tokens} slots; append to the table first")
    d = next((b for b, n in enumerate(lens) if n != 1), len(lens))  # leading one-token rows
    positions = [range(s, s + n) for s, n in zip(starts, lens)]
    width = [(s + n - 1) // S + 1 for s, n in zip(starts, lens)]  # blocks up to its last token's
    wd, cached = max(width[:d], default=0), [b for b in range(d, len(lens)) if starts[b] > 0]
    ends = [e - 1 for e in itertools.accumulate(lens)]  # each row's last token in the row
    ids, pos, blocks, offsets, last, decode_tables, context, *seg_tables = to_device([
        [x for row in tokens for x in row],
        [p for ps in positions for p in ps],
        [t.blocks[p // S] for t, ps in zip(tables, positions) for p in ps],
        [p % S for ps in positions for p in ps],
        ends,
        [x for t, w in zip(tables[:d], width) for x in t.blocks[:w] + [0] * (wd - w)],
        [s + 1 for s in starts[:d]],
        *[tables[b].blocks[:width[b]] for b in cached]], device)
    decode_tables, prefix_tiles = decode_tables.view(d, wd), None
    shared = shared_blocks(tables[:d], starts[:d], S) if pool.shared_prefix and d > 1 else 0
    if shared:  # cascade: the blocks every decode row shares apart, each row's own after them
        prefix_tiles, decode_tables, context = split_prefix(pool, decode_tables, context, shared)
    fused = pool.use_triton and d > 0 and not shared  # the split runs in torch on any device
    key_rows = value_rows = decode_mask = None
    if d and not fused:
        key_rows, value_rows = decode_index(decode_tables, K, pool.group, D, S)
        if any(s + 1 != wd * S for s in starts[:d]):  # some keys are padding
            keys = torch.arange(decode_tables.shape[1] * S, device=device)
            decode_mask = (keys < context.view(d, 1))[:, None]  # (d, 1, keys)
    segments, tables_of = [], dict(zip(cached, seg_tables))
    for b in range(d, len(lens)):
        first, tiles, mask = ends[b] - lens[b] + 1, None, None
        if b in tables_of:  # it continues a cached prompt: its blocks, the mask shifted
            tiles = block_gather_index(tables_of[b].view(1, -1), K)
            keys = torch.arange(width[b] * S, device=device)
            mask = (keys <= pos[first:ends[b] + 1].view(-1, 1))[None, None]  # (1, 1, T, keys)
        segments.append(Segment(first, lens[b], tiles, mask))
    return ids.view(1, -1), pos.view(1, -1), RaggedMetadata(
        pool, tuple(tables), blocks, offsets, last, d, decode_tables if d else None,
        context if d else None, key_rows, value_rows, decode_mask, tuple(segments), fused,
        prefix_tiles)


def shared_blocks(tables: list, starts: list[int], block_size: int) -> int:
    """How many leading blocks every one of the decode rows' ``tables`` holds in common (the
    same physical blocks, as a prefix cache shares them), ending before any row's new token."""
    if not tables:
        return 0
    limit = min(starts) // block_size  # whole blocks before every row's new token
    first = tables[0].blocks
    n = 0
    while n < limit and all(t.blocks[n] == first[n] for t in tables[1:]):
        n += 1
    return n


def split_prefix(pool, tables: torch.Tensor, context: torch.Tensor, shared: int):
    """Cascade attention's metadata: the ``shared`` leading blocks of the decode rows' block
    tables (d, W) as tiles (``block_gather_index``), each row's table and key count after them;
    the pool counts the rows and tokens that went this way."""
    pool.shared_prefix_rows += tables.shape[0]
    pool.shared_prefix_tokens += shared * pool.block_size
    return (block_gather_index(tables[:1, :shared], pool.k.shape[2]), tables[:, shared:],
            context - shared * pool.block_size)


def cascade_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                   meta: RaggedMetadata, buffers: dict) -> torch.Tensor:
    """Decode attention of q (d, H, 1, D) whose rows share the blocks ``meta.prefix_tiles``:
    the prefix gathered once and attended by every row's queries together (one product per KV
    head), each row's own blocks in place (``paged_decode``), the two merged by their
    log-sum-exp (``inferlab.serving.shared_prefix``). (d, H, 1, D), equal to ``paged_decode``
    over the whole tables."""
    from inferlab.serving.shared_prefix import merge, prefix_attention

    o_own, lse_own = paged_decode(q, k_pool, v_pool, meta.key_rows, meta.value_rows,
                                  meta.decode_mask, return_lse=True)
    kp, vp = gather_blocks(k_pool, v_pool, meta.prefix_tiles, 1, buffers)  # (1, K, P, D)
    o_pre, lse_pre = prefix_attention(q[:, :, 0], kp[0], vp[0])
    out, _ = merge(o_pre, lse_pre, o_own[:, :, 0], lse_own)
    return out.unsqueeze(2)


def block_gather_index(block_tables: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """Tiles (B x K x W,) of a (blocks x K, ...) view of the pool, in (b, k, j) order, from each
    row's physical blocks ``block_tables`` (B, W) (padding: any valid block)."""
    heads = torch.arange(n_kv_heads, device=block_tables.device)
    return (block_tables[:, None, :] * n_kv_heads + heads[None, :, None]).reshape(-1)


def decode_index(block_tables: torch.Tensor, n_kv_heads: int, group: int, head_dim: int,
                 block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``paged_decode`` sums, from the block tables (B, W); built once per forward.

    Key rows (B*H*W, D): bag (b, h, j) sums rows tile*D + d, d = 0..D-1, of the keys viewed as
    (blocks*K*D, block_size), where tile = table[b][j] * K + h // group. Value rows (B*H, W*S):
    bag (b, h) sums rows tile*S + s of the values viewed as (blocks*K*S, D), in position order.
    """
    B, W = block_tables.shape
    tiles = block_gather_index(block_tables, n_kv_heads).view(B, n_kv_heads, 1, W)
    tiles = tiles.expand(B, n_kv_heads, group, W)                       # (B, K, G, W): h = k*G + g
    dims = torch.arange(head_dim, device=tiles.device)
    slots = torch.arange(block_size, device=tiles.device)
    key_rows = (tiles[..., None] * head_dim + dims).reshape(-1, head_dim)      # (B*H*W, D)
    value_rows = (tiles[..., None] * block_size + slots).reshape(B * n_kv_heads * group, -1)
    return key_rows, value_rows                                                # (B*H, W*S)


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 key_rows: torch.Tensor, value_rows: torch.Tensor,
                 mask: torch.Tensor | None = None, return_lse: bool = False):
    """Decode attention of q (B, H, 1, D) over one layer's pool, read in place: (B, H, 1, D),
    equal to SDPA over the gathered K/V. ``key_rows``, ``value_rows``: ``decode_index``'s;
    ``mask`` (B, 1, W*S): the keys each row sees (None: all of them). With ``return_lse``, also
    each query's log-sum-exp of scores (B, H), to merge with attention over other keys."""
    B, H, _, D = q.shape
    S, W = v_pool.shape[2], key_rows.shape[0] // (B * H)
    weights = (q * (1 / math.sqrt(D))).view(B, H, 1, D).expand(B, H, W, D)
    scores = F.embedding_bag(key_rows, k_pool.view(-1, S), mode="sum",  # (B*H*W, S)
                             per_sample_weights=weights.reshape(key_rows.shape)).view(B, H, W * S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)                                          # (B, H, N)
    out = F.embedding_bag(value_rows, v_pool.view(-1, D), mode="sum",
                          per_sample_weights=probs.view(value_rows.shape))        # (B*H, D)
    if return_lse:
        return out.view(B, H, 1, D), torch.logsumexp(scores, dim=-1)
    return out.view(B, H, 1, D)


def gather_blocks(k_pool: torch.Tensor, v_pool: torch.Tensor, tiles: torch.Tensor, batch: int,
                  buffers: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of one layer's pool at ``tiles`` (``block_gather_index``): each (B, K, N, D).

    N = W * block_size, contiguous, as SDPA reads fastest; the keys' tiles are transposed back,
    a second copy. ``buffers`` (a dict, filled on first use) keeps the copies' memory between
    calls: on a CPU a fresh buffer of tens of MB costs more in page faults than the copy.
    """
    num_blocks, K, D, S = k_pool.shape
    n = tiles.numel()
    buffers = {} if buffers is None else buffers
    if "v" not in buffers or buffers["v"].shape[0] < n:
        for name, shape in (("k_tiles", (n, D, S)), ("k", (n, S, D)), ("v", (n, S, D))):
            buffers[name] = torch.empty(shape, dtype=k_pool.dtype, device=k_pool.device)
    k_tiles = torch.index_select(k_pool.view(num_blocks * K, D, S), 0, tiles,
                                 out=buffers["k_tiles"][:n])               # (B*K*W, D, S)
    k = buffers["k"][:n]
    k.copy_(k_tiles.transpose(1, 2))                                       # (B*K*W, S, D)
    v = torch.index_select(v_pool.view(num_blocks * K, S, D), 0, tiles, out=buffers["v"][:n])
    return k.view(batch, K, -1, D), v.view(batch, K, -1, D)


# -- the runner: one forward pass of the model over Span rows -------------------------------------
class ModelRunner(Runner):
    """Runs forward passes of ``model`` over ``cache`` (a ``PagedKVCache``)."""

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.device = cache.k.device
        self._generators = weakref.WeakKeyDictionary()  # each sequence's stream on the device
        self._matchers = Matchers()  # each constrained sequence's place in its grammar

    def generator(self, seq) -> torch.Generator | None:
        """``seq``'s random stream on the pool's device (on a GPU: seeded from its own)."""
        if seq.generator is not None and self.device.type != "cpu" and seq not in self._generators:
            self._generators[seq] = torch.Generator(self.device).manual_seed(
                seq.generator.initial_seed())
        return self._generators.get(seq, seq.generator)

    def forward(self, rows: list[Span]) -> list[int]:  # the Runner protocol's one pass
        return self.run(*self.inputs(rows))

    def inputs(self, rows: list[Span]) -> tuple:
        """``run``'s arguments for ``rows``, built on the host (overlap: during the step before)."""
        ids, positions, meta = prepare([r.seq.table for r in rows], [r.seq.token_slice(
            r.start, r.new) for r in rows], [r.start for r in rows], self.cache)
        return ids, positions, meta, rows, torch.tensor(
            [r.seq.request.temperature for r in rows]), [self.generator(r.seq) if r.emits else
            None for r in rows], torch.tensor([r.seq.request.top_k for r in rows]), torch.tensor(
            [r.seq.request.top_p for r in rows])

    @torch.inference_mode()
    def run(self, ids, positions, meta, rows, *sampling) -> list[int]:
        """A token per row: the logits at each row's last token, sampled (drawn where it emits)."""
        logits = self.model(ids, positions, meta, logits_at=meta.last_index)[0]  # (rows, V)
        if any(r.seq.request.grammar is not None for r in rows):  # structured outputs
            logits = apply_grammars(rows, logits, self._matchers)
        return sample(logits, *sampling)
