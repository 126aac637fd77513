"""The shape of a Llama-architecture model, and the named shapes in ``data/models.csv``.

``ModelConfig`` is a small frozen dataclass that checks itself (gpt-fast's ``ModelArgs``): every
size is a positive integer, ``head_dim`` is derived from ``d_model / n_heads`` unless given, and
the query heads divide evenly among the KV heads. ``sliding_window`` records a model trained with
sliding-window attention (Mistral-7B-v0.1: 4,096 tokens), whose KV cache stops growing at the window;
the cache-size formulas use it (``formulas.kv_tokens_held``), while the course's model itself always
attends to the whole context. ``ModelConfig.from_name`` reads a preset from
``data/models.csv``; ``from_hf_config`` and ``to_hf_config`` translate a Hugging Face
``config.json``, so a real checkpoint's shape needs no table row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from inferlab.data import read_table
from inferlab.device import element_bytes
from inferlab.validation import positive_ints


def kv_bytes_per_token(config, dtype="bfloat16") -> int:
    """KV-cache bytes one token occupies: 2 (K and V) x layers x KV heads x head_dim x bytes.

    The course's one home for this number, below the model's caches, the engine's pool and the
    analysis that all use it (``inferlab.analysis.formulas`` quotes it): ``config`` is anything
    with ``n_layers``, ``n_kv_heads`` and ``head_dim`` (a ``ModelConfig``, a cache);
    ``dtype`` is a dtype name or bytes per number."""
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * element_bytes(dtype)


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-architecture model. ``head_dim`` defaults to d_model / n_heads."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int = 2048
    head_dim: int = 0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    attention_bias: bool = False
    tie_embeddings: bool = False
    sliding_window: int | None = None   # tokens each query attends to; None: the whole context
    name: str = "custom"

    def __post_init__(self) -> None:
        positive_ints("ModelConfig.", **{f: getattr(self, f) for f in (
            "n_layers", "d_model", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "max_seq_len")})
        if self.head_dim == 0:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model={self.d_model} is not divisible by n_heads="
                                 f"{self.n_heads}; pass head_dim explicitly")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"head_dim must be a positive even number (RoPE rotates pairs), "
                             f"got {self.head_dim}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be a multiple of n_kv_heads="
                             f"{self.n_kv_heads} (each KV head serves a group of query heads)")
        if self.sliding_window is not None:
            positive_ints("ModelConfig.", sliding_window=self.sliding_window)
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError("rope_theta and norm_eps must be positive")

    @property
    def group_size(self) -> int:
        """Query heads per KV head: 1 is multi-head attention, n_heads is multi-query."""
        return self.n_heads // self.n_kv_heads

    def with_kv_heads(self, n_kv_heads: int) -> "ModelConfig":
        """The same shape with ``n_kv_heads`` KV heads (MHA: n_heads; GQA: fewer; MQA: 1)."""
        return replace(self, n_kv_heads=n_kv_heads, name=f"{self.name}-kv{n_kv_heads}")

    def scaled(self, **changes) -> "ModelConfig":
        """A copy with some fields changed, e.g. ``config.scaled(n_layers=2)``."""
        return replace(self, **changes)

    @classmethod
    def from_name(cls, name: str, **overrides) -> "ModelConfig":
        """A preset from ``data/models.csv``; an unknown name lists the known ones."""
        presets = model_presets()
        key = name.strip().lower()
        if key not in presets:
            raise ValueError(f"unknown model {name!r}; known models: {', '.join(presets)}")
        return replace(presets[key], **overrides) if overrides else presets[key]

    @classmethod
    def from_hf_config(cls, hf: dict, name: str | None = None) -> "ModelConfig":
        """Read a Hugging Face ``config.json`` (Llama or Qwen2 family) as a ModelConfig."""
        archs = hf.get("architectures") or []
        known = {"LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"}
        if archs and not set(archs) & known:
            raise ValueError(f"architecture {archs} is not Llama-like; inferlab loads "
                             f"{sorted(known)}")
        n_heads = hf["num_attention_heads"]
        return cls(
            n_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"], n_heads=n_heads,
            n_kv_heads=hf.get("num_key_value_heads") or n_heads,
            ffn_dim=hf["intermediate_size"], vocab_size=hf["vocab_size"],
            max_seq_len=hf.get("max_position_embeddings", 2048),
            # Qwen2 files carry a sliding_window that is off unless use_sliding_window is true
            sliding_window=(hf.get("sliding_window") if hf.get("use_sliding_window", True)
                            else None) or None,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
            # transformers 5 moved rope_theta into rope_parameters; older files keep it on top
            rope_theta=float(hf.get("rope_theta")
                             or (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
            norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            attention_bias=bool(hf.get("attention_bias",
                                       hf.get("model_type") == "qwen2")),
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            name=name or hf.get("_name_or_path") or hf.get("model_type", "custom"),
        )

    def to_hf_config(self) -> dict:
        """A Hugging Face style ``config.json`` dictionary for this shape."""
        return {
            "architectures": ["Qwen2ForCausalLM" if self.attention_bias else "LlamaForCausalLM"],
            "model_type": "qwen2" if self.attention_bias else "llama",
            "num_hidden_layers": self.n_layers, "hidden_size": self.d_model,
            "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim, "intermediate_size": self.ffn_dim,
            "vocab_size": self.vocab_size, "max_position_embeddings": self.max_seq_len,
            "rope_theta": self.rope_theta, "rms_norm_eps": self.norm_eps,
            "attention_bias": self.attention_bias, "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
        } | ({"sliding_window": self.sliding_window} if self.sliding_window else {})

    def as_dict(self) -> dict:
        return asdict(self)


def _bool(text: str) -> bool:
    return text.strip().lower() in ("true", "1", "yes")


def model_presets() -> dict[str, ModelConfig]:
    """Every model shape in ``data/models.csv``, keyed by lower-case name."""
    presets = {}
    for row in read_table("models.csv"):
        presets[row["name"].lower()] = ModelConfig(
            n_layers=int(row["n_layers"]), d_model=int(row["d_model"]),
            n_heads=int(row["n_heads"]), n_kv_heads=int(row["n_kv_heads"]),
            head_dim=int(row["head_dim"]), ffn_dim=int(row["ffn_dim"]),
            vocab_size=int(row["vocab_size"]), max_seq_len=int(row["max_seq_len"]),
            sliding_window=int(row["sliding_window"]) if row.get("sliding_window") else None,
            rope_theta=float(row["rope_theta"]), norm_eps=float(row["norm_eps"]),
            attention_bias=_bool(row["attention_bias"]),
            tie_embeddings=_bool(row["tie_embeddings"]), name=row["name"],
        )
    return presets
