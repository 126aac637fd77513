"""KV-cache bytes for attention that is not one full-length cache per layer.

Chapter 2's formula, 2 x layers x KV heads x head_dim x bytes per token, assumes every layer
attends to every earlier token and keeps all of them. Recent models mix layer kinds
(``data/attention_layouts.csv``, one row per model with its config's source):

- **interleaved sliding-window and full layers** (gpt-oss: half its layers see only the last 128
  tokens): a sliding layer keeps at most its window, so its cache stops growing;
- **linear-attention hybrids** (Qwen3-Next: three of every four layers are Gated DeltaNet): a
  linear layer keeps no per-token K/V at all but a fixed recurrent state per sequence, a
  (value heads x key dim x value dim) matrix plus a short convolution's last inputs, whatever
  the context;
- **latent and sparse attention** (DeepSeek-V3.2): multi-head latent attention caches one
  compressed vector per token and layer (``latent_dim``), and its sparse attention adds a small
  indexer key per token and layer (``index_dim``) with which it picks the ``index_topk`` tokens
  each query attends to: the cache still holds every token, but a decode step reads the latents
  of only ``index_topk`` of them (and every indexer key).

``stored_bytes`` is what one sequence of ``tokens`` tokens holds, ``read_bytes`` what one decode
step's attention reads, ``sequences_that_fit`` the capacity of a memory budget. Byte widths are
arguments: a cache in bfloat16 (2), FP8 (1); a recurrent state that an engine keeps in float32
(4) is ``state_bytes``.

Engines do not store DeepSeek-V3.2's latent cache in bfloat16. FlashMLA's sparse decoding kernel
reads an "FP8 with scale" record of 656 bytes per token and layer: the latent's 512 non-positional
numbers in FP8 E4M3 with one float32 scale per 128 of them, and its 64 rotary numbers left in
bfloat16 (FlashMLA README, section FP8 KV Cache); the model's reference code keeps the indexer
key in FP8 with one float32 scale per 128 numbers (DeepSeek-V3.2-Exp ``inference/model.py``,
``Indexer.k_cache`` and ``k_scale_cache``). ``fp8_token_bytes`` counts that format.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.data import read_table


def _int(text: str) -> int:
    return int(text) if text.strip() else 0


@dataclass(frozen=True)
class AttentionLayout:
    """How a model's layers keep their past: full, windowed, linear (recurrent) or latent."""

    name: str
    n_layers: int
    full_layers: int = 0         # layers with a full-length K/V cache (or latent, if latent_dim)
    window_layers: int = 0       # sliding-window layers (same K/V shape as the full ones)
    window: int = 0
    n_kv_heads: int = 0
    head_dim: int = 0
    linear_layers: int = 0       # recurrent (linear-attention) layers
    linear_v_heads: int = 0
    linear_k_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv_kernel: int = 0
    latent_dim: int = 0          # MLA: numbers cached per token and layer (replaces K and V)
    latent_rope_dim: int = 0     # of those, the rotary part (kept in 16-bit by FP8 formats)
    index_dim: int = 0           # sparse attention: indexer key numbers per token and layer
    index_topk: int = 0          # tokens each query attends to (0: all)
    max_seq_len: int = 0
    source: str = ""

    def __post_init__(self):
        if self.full_layers + self.window_layers + self.linear_layers != self.n_layers:
            raise ValueError(f"{self.name}: {self.full_layers} full + {self.window_layers} "
                             f"window + {self.linear_layers} linear layers != {self.n_layers}")

    @classmethod
    def from_name(cls, name: str) -> "AttentionLayout":
        rows = {r["name"]: r for r in read_table("attention_layouts.csv")}
        if name not in rows:
            raise KeyError(f"no layout {name!r} in data/attention_layouts.csv; known: "
                           f"{', '.join(rows)}")
        r = rows[name]
        ints = {k: _int(r[k]) for k in r if k not in ("name", "hf_name", "source")}
        return cls(name=name, source=r["source"], **ints)

    # -- per token and per sequence ----------------------------------------------------------
    def token_elements(self) -> int:
        """Numbers one token adds to the cache of one full (or latent) layer."""
        if self.latent_dim:
            return self.latent_dim + self.index_dim
        return 2 * self.n_kv_heads * self.head_dim  # K and V

    def state_elements(self) -> int:
        """Numbers of one linear layer's fixed state per sequence: the (heads x d_k x d_v)
        recurrent matrix plus the convolution's last (kernel - 1) inputs of q, k and v."""
        if not self.linear_layers:
            return 0
        recurrent = self.linear_v_heads * self.linear_k_dim * self.linear_v_dim
        conv_width = 2 * self.linear_k_heads * self.linear_k_dim \
            + self.linear_v_heads * self.linear_v_dim
        return recurrent + conv_width * (self.linear_conv_kernel - 1)

    def fp8_token_bytes(self, scale_block: int = 128, scale_bytes: int = 4) -> float:
        """Bytes one token adds to one latent layer in the engines' FP8 format: the latent's
        non-rotary numbers in FP8 with a float32 scale per ``scale_block`` of them, its rotary
        numbers in bfloat16, the indexer key in FP8 with a float32 scale per ``scale_block``.
        DeepSeek-V3.2: (512 + 4 x 4 + 64 x 2) + (128 + 4) = 656 + 132 = 788 bytes."""
        if not self.latent_dim:
            raise ValueError(f"{self.name} has no latent cache; the FP8 record is MLA's")
        nope = self.latent_dim - self.latent_rope_dim
        latent = nope + -(-nope // scale_block) * scale_bytes + 2 * self.latent_rope_dim
        index = (self.index_dim + -(-self.index_dim // scale_block) * scale_bytes
                 if self.index_dim else 0)
        return latent + index

    def stored_bytes_fp8(self, tokens: int) -> float:
        """Bytes one sequence of ``tokens`` tokens keeps in the engines' FP8 format."""
        return self.full_layers * tokens * self.fp8_token_bytes()

    def stored_bytes(self, tokens: int, bytes_per_element: float = 2,
                     state_bytes: float | None = None) -> float:
        """Bytes one sequence of ``tokens`` tokens keeps across all layers."""
        state_bytes = bytes_per_element if state_bytes is None else state_bytes
        per_token = self.token_elements() * bytes_per_element
        return (self.full_layers * tokens * per_token
                + self.window_layers * min(tokens, self.window) * per_token
                + self.linear_layers * self.state_elements() * state_bytes)

    def growth_bytes_per_token(self, bytes_per_element: float = 2) -> float:
        """What one more token adds once the context is past every window."""
        return self.full_layers * self.token_elements() * bytes_per_element

    def read_bytes(self, tokens: int, bytes_per_element: float = 2,
                   state_bytes: float | None = None) -> float:
        """Bytes one decode step's attention reads for one sequence at ``tokens`` of context.
        A sparse layer reads the indexer keys of every token and the latents of ``index_topk``."""
        if self.index_topk and self.latent_dim:
            per_layer = (min(tokens, self.index_topk) * self.latent_dim
                         + tokens * self.index_dim) * bytes_per_element
            return self.full_layers * per_layer
        return self.stored_bytes(tokens, bytes_per_element, state_bytes)

    def sequences_that_fit(self, memory_bytes: float, tokens: int,
                           bytes_per_element: float = 2, state_bytes: float | None = None) -> int:
        """Sequences of ``tokens`` tokens whose caches fit in ``memory_bytes``."""
        return int(memory_bytes // self.stored_bytes(tokens, bytes_per_element, state_bytes))


def layouts() -> list[AttentionLayout]:
    return [AttentionLayout.from_name(r["name"]) for r in read_table("attention_layouts.csv")]
