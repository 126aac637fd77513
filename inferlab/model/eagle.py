"""An EAGLE-style draft head: one decoder layer that drafts from the target's own features.

EAGLE (Li et al. 2024, arXiv:2401.15077) drafts at the level of the target's last hidden state
(its "feature", the vector the LM head reads) instead of training a separate small model on
tokens. The head sees, at each position, the target's feature there and the token that
follows it (the "shifted" token, which tells the head which of the possible continuations was
actually taken), fuses the pair with one linear layer, runs one decoder layer and predicts the
feature at the next position. The target's own LM head turns that predicted feature into
logits, and the predicted feature feeds the next draft step. The head shares the target's
embedding table and LM head, so it stores only the fusion layer and one decoder layer.

What this module keeps and what it simplifies (the course's target has 6 layers of width 192):

- Kept from EAGLE: fc(concat(embedding(next token), feature)) with a bias, one Llama decoder
  layer, the target's frozen embedding and LM head, a regression loss on the feature plus a
  classification loss on the logits, and lossless verification (the loop of
  ``inferlab.model.speculative``; greedy output equals the target's greedy output).
- Simplified: a chain of k drafts, not EAGLE's tree (tree attention) or EAGLE-2's dynamic tree;
  the feature is the target's final normed hidden state only, not EAGLE-3's fusion of low, mid
  and high layers (arXiv:2503.01840); the decoder layer keeps its input norm. Training unrolls
  the head on its own predictions for a few steps, a small version of EAGLE-3's "training-time
  test", and keeps the feature loss (EAGLE-3 drops it).

``EagleHead`` is the module; ``FeatureTarget`` runs the target and keeps the feature of every
position it computed; ``EagleDrafter`` plugs into ``speculative_generate``. ``save_head`` and
``load_head`` write and read the head in the course's Hugging Face-like layout
(``data/models/course-eagle``: ``config.json`` naming its target, ``model.safetensors``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from inferlab.model.config import ModelConfig
from inferlab.model.kv_cache import KVCache
from inferlab.model.llama import DecoderLayer, Llama, rope_cos_sin
from inferlab.model.speculative import ContiguousTarget, rollback


class EagleHead(nn.Module):
    """fc(concat(embed(token), feature)) -> one decoder layer -> predicted next feature.

    ``embed`` and ``lm_head`` are the target's modules, held by reference and never trained or
    saved with the head.
    """

    def __init__(self, config: ModelConfig, embed: nn.Embedding, lm_head: nn.Linear):
        super().__init__()
        self.config = config.scaled(n_layers=1, name=f"{config.name}-eagle")
        d = config.d_model
        self.fc = nn.Linear(2 * d, d, bias=True)
        self.layer = DecoderLayer(self.config, 0)
        self._shared = {"embed": embed, "lm_head": lm_head}  # a dict: not registered as children

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        """Predicted features (B, T, d) from tokens (B, T) and the features (B, T, d) before them."""
        e = self._shared["embed"](tokens).to(features.dtype)           # (B, T, d)
        x = self.fc(torch.cat([e, features], dim=-1))                  # (B, T, d)
        c = self.config
        rope = rope_cos_sin(positions, c.head_dim, c.rope_theta, x.dtype)
        return self.layer(x, positions, cache, rope)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self._shared["lm_head"](features)

    @property
    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def target_features(model: Llama, tokens: torch.Tensor, positions=None, cache=None):
    """The target's logits and its final normed hidden states (B, T, d) for ``tokens``."""
    captured = {}
    hook = model.model.norm.register_forward_hook(lambda m, i, o: captured.update(h=o))
    try:
        logits = model(tokens, positions, cache)
    finally:
        hook.remove()
    return logits, captured["h"]


class FeatureTarget(ContiguousTarget):
    """The target's side of the loop that also keeps each computed position's feature.

    ``features[p]`` is valid for every position the target's cache holds (rejected positions
    are overwritten by the next verification, as their K/V are).
    """

    def __init__(self, model: Llama, max_len: int):
        super().__init__(model, max_len)
        self.features = torch.zeros(max_len, model.config.d_model, dtype=model.dtype,
                                    device=model.device)

    def forward(self, tokens: list[int], start: int) -> torch.Tensor:
        dev = self.model.device
        x = torch.tensor([tokens], device=dev)
        logits, h = target_features(self.model, x, torch.arange(start, start + len(tokens),
                                                                  device=dev), self.cache)
        self.features[start:start + len(tokens)] = h[0]
        return logits[0]


class EagleDrafter:
    """Drafts with an ``EagleHead`` from the features a ``FeatureTarget`` computed.

    Draft slot j holds the head's K/V for the pair (feature of position j, token j + 1). Slots
    whose feature is the target's own are kept between verifications; slots fed with the head's
    predicted features are dropped after each proposal (EAGLE recomputes them from the target's
    features once those exist).
    """

    def __init__(self, head: EagleHead, target: FeatureTarget):
        self.head, self.target = head, target
        c = head.config
        self.cache = KVCache(1, 1, c.n_kv_heads, target.cache.max_len, c.head_dim,
                             target.model.dtype, target.model.device)

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, temperature: float = 0.0,
                generator: torch.Generator | None = None):
        if k == 0:
            return [], None
        dev = self.target.model.device
        start, true_len = self.cache.length, len(tokens) - 1  # slots 0..len-2 have true features
        if true_len == start:  # a one-token prompt: no feature to draft from yet
            return [], None
        feats = self.target.features[start:true_len][None]                 # (1, T, d)
        toks = torch.tensor([tokens[start + 1:true_len + 1]], device=dev)  # (1, T)
        drafted, probs = [], []
        for _ in range(k):
            pos = torch.arange(self.cache.length, self.cache.length + toks.shape[1], device=dev)
            f = self.head(toks, feats, pos, self.cache)[:, -1:]           # (1, 1, d)
            logits = self.head.logits(f)[0, -1]                             # (V,)
            if temperature == 0:
                d = int(logits.argmax())
            else:
                probs.append(torch.softmax(logits.double() / temperature, dim=-1))
                d = int(torch.multinomial(probs[-1], 1, generator=generator))
            drafted.append(d)
            feats, toks = f, torch.tensor([[d]], device=dev)
        rollback(self.cache, true_len)  # forget the slots fed with predicted features
        return drafted, (torch.stack(probs) if probs else None)

    def keep(self, n: int) -> None:
        rollback(self.cache, min(n, self.cache.length))


def save_head(head: EagleHead, path: str | Path, target_name: str, extra: dict | None = None,
              dtype: torch.dtype = torch.bfloat16) -> Path:
    """``config.json`` (the target's shape, one layer, and the target's name) and
    ``model.safetensors`` (the head's own tensors in ``dtype``)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    hf = head.config.to_hf_config()
    hf.update({"architectures": ["EagleHead"], "model_type": "eagle-head",
               "target_model": target_name, "torch_dtype": str(dtype).removeprefix("torch."),
               "shares_with_target": ["model.embed_tokens.weight", "lm_head.weight"],
               **(extra or {})})
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in head.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path


def load_head(path: str | Path, target: Llama) -> EagleHead:
    """The head stored at ``path``, bound to ``target``'s embedding and LM head, in its dtype."""
    from safetensors.torch import load_file

    path = Path(path)
    hf = json.loads((path / "config.json").read_text(encoding="utf-8"))
    if hf.get("hidden_size") != target.config.d_model or hf.get("vocab_size") != \
            target.config.vocab_size:
        raise ValueError(f"the head at {path} was trained for {hf.get('target_model')!r} "
                         f"(width {hf.get('hidden_size')}, vocabulary {hf.get('vocab_size')}); "
                         f"this target has width {target.config.d_model}")
    head = EagleHead(target.config, target.model.embed_tokens, target.lm_head)
    state = load_file(str(path / "model.safetensors"))
    head.load_state_dict({k: v.to(target.dtype) for k, v in state.items()})
    return head.to(target.device).eval()


def head_loss(head: EagleHead, tokens: torch.Tensor, feats: torch.Tensor, logits: torch.Tensor,
              unroll: int = 1, w_cls: float = 0.1, noise: float = 0.0,
              generator: torch.Generator | None = None) -> dict:
    """Training loss on windows: tokens (B, T), the target's features and logits (B, T, .).

    Step 1 feeds the target's features f_0..f_{T-2} with tokens t_1..t_{T-1} and regresses
    f_1..f_{T-1}; step s > 1 feeds the head's own step s-1 predictions (shifted one further),
    as drafting does after the first token. Each step adds a smooth-L1 feature loss and
    ``w_cls`` times the cross-entropy against the target's next-token distribution.
    """
    B, T, _ = feats.shape
    x = feats[:, :-1]
    if noise:
        x = x + (torch.rand(x.shape, generator=generator) - 0.5) * noise  # uniform, as EAGLE
    out = {"loss": 0.0}
    for s in range(1, unroll + 1):
        n = T - s                              # pairs this step can score
        pos = torch.arange(s - 1, s - 1 + n)
        pred = head(tokens[:, s:s + n], x[:, :n], pos)                        # (B, n, d)
        want = feats[:, s:s + n]
        p_target = torch.softmax(logits[:, s:s + n].float(), dim=-1)
        logp = torch.log_softmax(head.logits(pred).float(), dim=-1)
        reg = F.smooth_l1_loss(pred, want)
        cls = -(p_target * logp).sum(-1).mean()
        out["loss"] = out["loss"] + reg + w_cls * cls
        with torch.no_grad():
            out[f"top1_step{s}"] = float((logp.argmax(-1) == p_target.argmax(-1)).float().mean())
        x = pred[:, :-1] if s < unroll else None  # the next step reads these predictions
    return out
