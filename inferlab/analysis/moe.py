"""Mixture-of-experts (MoE) models: how many weight bytes a decode step reads at batch B.

In an MoE layer a router sends each token to ``experts_per_token`` (k) of ``n_experts`` (E)
feed-forward experts, beside any shared experts every token uses (Mixtral: Jiang et al. 2024;
DeepSeek-V2/V3: DeepSeek-AI 2024). A decode step must read the weights of every expert that at
least one token of the batch was routed to. At batch 1 that is the k active experts, so the step
reads the *active* parameters; as the batch grows, more distinct experts are touched, until the
step reads all of them. If each token picks its k experts independently and evenly, an expert is
missed by one token with probability 1 - k/E, so the expected number of distinct experts is

    E [1 - (1 - k/E)^B].

Even routing is what the models' load-balancing aims for; since 1 - (1 - p)^B is concave in an
expert's share p, uneven routing touches fewer experts, so for independent tokens the formula is
an upper bound. Correlated tokens (one long prompt's continuation, a batch of similar requests)
touch fewer still.

``MoEConfig`` reads a model's shape from ``data/moe_models.csv`` (each row from the model's
published ``config.json``); parameter counts are built from the shape, so they can be checked
against the published totals (Mixtral 46.7B total, 12.9B active; DeepSeek-V3 671B and 37B).
Attention is grouped-query (Mixtral) or multi-head latent (DeepSeek, ``inferlab.analysis.mla``).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.analysis import mla
from inferlab.data import read_table
from inferlab.device import bytes_per_element
from inferlab.validation import positive, positive_ints


def expected_experts(batch: float, n_experts: int, experts_per_token: int) -> float:
    """Expected distinct experts a batch of ``batch`` tokens touches in one layer: E [1 - (1 - k/E)^B]."""
    positive(batch=batch)
    positive_ints(n_experts=n_experts, experts_per_token=experts_per_token)
    if experts_per_token > n_experts:
        raise ValueError(f"experts_per_token={experts_per_token} exceeds n_experts={n_experts}")
    return n_experts * (1 - (1 - experts_per_token / n_experts) ** batch)


@dataclass(frozen=True)
class MoEConfig:
    """The shape of an MoE decoder (one row of ``data/moe_models.csv``)."""

    name: str
    n_layers: int
    dense_layers: int          # leading layers with a dense FFN (DeepSeek's first_k_dense_replace)
    d_model: int
    vocab_size: int
    tie_embeddings: bool
    n_heads: int
    n_experts: int
    n_shared_experts: int
    experts_per_token: int
    expert_ffn_dim: int
    dense_ffn_dim: int = 0
    n_kv_heads: int = 0        # grouped-query attention (0 for MLA)
    head_dim: int = 0
    mla: mla.MLAShape | None = None
    max_seq_len: int = 4096

    @property
    def moe_layers(self) -> int:
        return self.n_layers - self.dense_layers

    @property
    def expert_params(self) -> int:
        """One expert: a SwiGLU FFN of three d x ffn matrices."""
        return 3 * self.d_model * self.expert_ffn_dim

    def attention_params(self) -> int:
        """One layer's attention parameters."""
        if self.mla is not None:
            return mla.attention_params(self.mla)
        d, q, kv = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return 2 * d * q + 2 * d * kv

    def params(self, experts: float | None = None) -> float:
        """Parameters with ``experts`` routed experts per MoE layer (default: all of them)."""
        experts = self.n_experts if experts is None else experts
        d = self.d_model
        layers = self.n_layers * (self.attention_params() + 2 * d)          # attention, two norms
        layers += self.dense_layers * 3 * d * self.dense_ffn_dim
        layers += self.moe_layers * (d * self.n_experts                      # router
                                     + (self.n_shared_experts + experts) * self.expert_params)
        total = layers + d                                                   # final norm
        embed = self.vocab_size * d
        total += embed if self.tie_embeddings else 2 * embed                 # lm_head
        return total

    def total_params(self) -> float:
        return self.params()

    def active_params(self) -> float:
        """Parameters one token uses: shared parts plus k routed experts per MoE layer."""
        return self.params(self.experts_per_token)

    def decode_bytes_per_step(self, batch: float = 1, dtype="bfloat16") -> float:
        """Expected weight bytes a decode step of ``batch`` tokens reads (no input embedding).

        Everything but the routed experts is read once; each MoE layer adds the expected number
        of distinct experts the batch touches.
        """
        touched = expected_experts(batch, self.n_experts, self.experts_per_token)
        lookup = 0 if self.tie_embeddings else self.vocab_size * self.d_model  # one row is read
        return (self.params(touched) - lookup) * bytes_per_element(dtype)

    @classmethod
    def from_name(cls, name: str) -> "MoEConfig":
        presets = moe_presets()
        if name.lower() not in presets:
            raise ValueError(f"unknown MoE model {name!r}; known: {', '.join(presets)}")
        return presets[name.lower()]


def _int(text: str) -> int:
    return int(text) if text.strip() else 0


def moe_presets() -> dict[str, MoEConfig]:
    """Every row of ``data/moe_models.csv``, keyed by lower-case name."""
    presets = {}
    for row in read_table("moe_models.csv"):
        shape = None
        if row["attention"] == "mla":
            shape = mla.MLAShape(
                n_layers=int(row["n_layers"]), d_model=int(row["d_model"]),
                n_heads=int(row["n_heads"]), q_lora_rank=_int(row["q_lora_rank"]),
                kv_lora_rank=int(row["kv_lora_rank"]),
                qk_nope_head_dim=int(row["qk_nope_head_dim"]),
                qk_rope_head_dim=int(row["qk_rope_head_dim"]), v_head_dim=int(row["v_head_dim"]))
        elif row["attention"] != "gqa":
            raise ValueError(f"{row['name']}: attention must be 'gqa' or 'mla'")
        presets[row["name"].lower()] = MoEConfig(
            name=row["name"], n_layers=int(row["n_layers"]), dense_layers=int(row["dense_layers"]),
            d_model=int(row["d_model"]), vocab_size=int(row["vocab_size"]),
            tie_embeddings=row["tie_embeddings"].strip().lower() == "true",
            n_heads=int(row["n_heads"]), n_experts=int(row["n_experts"]),
            n_shared_experts=int(row["n_shared_experts"]),
            experts_per_token=int(row["experts_per_token"]),
            expert_ffn_dim=int(row["expert_ffn_dim"]), dense_ffn_dim=_int(row["dense_ffn_dim"]),
            n_kv_heads=_int(row["n_kv_heads"]) if shape is None else 0,
            head_dim=_int(row["head_dim"]), mla=shape, max_seq_len=int(row["max_seq_len"]))
    return presets
