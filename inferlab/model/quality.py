"""How well a model predicts text it never trained on: perplexity, bits per byte, a baseline.

A language model assigns each next token a probability; its loss on a text is the mean negative
log-probability, in nats, of the tokens that actually follow. **Perplexity** is e to that power:
the number of equally likely tokens the model is, on average, as unsure as. It depends on the
tokenizer (a vocabulary of longer tokens has fewer, harder predictions), so it compares only
models that share one. **Bits per byte** divides the total information, in bits, by the text's
UTF-8 bytes: a tokenizer-free unit, the one to compare a model with a hub model, or with the
baseline (the measure of Gao et al. 2020, The Pile).

The **unigram baseline** ignores context: it predicts every token with its frequency in the
training split (add-one smoothed). A model that has learnt anything beyond token frequencies
beats it; the course's bar is half its bits per byte.

Each text is a document, scored as the model was trained: preceded and followed by the
end-of-sequence token, the first one as context. A long stream is scored in windows of the
model's context that overlap by a quarter: each scores its last three quarters, so every token
is predicted from at least a quarter of the context (wider overlaps change the result in the
fourth digit and cost more).
``agreement`` counts how often two models' greedy next tokens agree, the quantity speculative
decoding's acceptance rate grows with (Chapter 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from inferlab.data import read_table
from inferlab.model.generate import check_vocabulary


@dataclass(frozen=True)
class Score:
    """A text's total negative log-likelihood, its tokens predicted and its UTF-8 bytes."""

    nats: float
    tokens: int
    bytes: int

    @property
    def nats_per_token(self) -> float:
        return self.nats / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.nats_per_token)

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes


def _eos(tokenizer) -> int | None:
    eos = getattr(tokenizer, "eos_token_id", None)
    return eos[0] if isinstance(eos, (list, tuple)) else eos


def token_ids(tokenizer, texts) -> list[int]:
    """The documents as one stream, each followed by end-of-sequence, with one in front."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    eos = _eos(tokenizer)
    end = [] if eos is None else [eos]
    ids = list(end)
    for text in texts:
        ids += list(tokenizer.encode(text)) + end
    return ids


def _utf8_bytes(texts) -> int:
    texts = [texts] if isinstance(texts, str) else texts
    return sum(len(t.encode("utf-8")) for t in texts)


@torch.inference_mode()
def token_nats(model, ids, stride: int | None = None, batch: int = 8) -> torch.Tensor:
    """Negative log-probability (nats) of each of ``ids[1:]`` given the tokens before it.

    Windows hold at most the model's context; a window scores its last ``stride`` tokens
    (default: three quarters of it, so every token but the first few sees at least a quarter).
    """
    ids = torch.as_tensor(ids, dtype=torch.long)
    n, W = ids.numel(), model.config.max_seq_len
    S = stride or W - W // 4
    if not 0 < S <= W:
        raise ValueError(f"stride must lie in [1, {W}] (the model's context), got {stride}")
    if n < 2:
        raise ValueError("scoring needs at least two tokens (a context and a prediction)")
    blocks = [(a, min(a + S, n)) for a in range(1, n, S)]  # target positions [a, b)
    out = torch.empty(n - 1)
    for i in range(0, len(blocks), batch):
        group = blocks[i:i + batch]
        starts = [max(0, b - 1 - W) for _, b in group]
        x = torch.zeros(len(group), W, dtype=torch.long)  # right-padded: causal, so harmless
        for row, ((a, b), s) in enumerate(zip(group, starts)):
            x[row, :b - 1 - s] = ids[s:b - 1]
        logp = torch.log_softmax(model(x.to(model.device)).float(), dim=-1).cpu()  # (B, W, V)
        for row, ((a, b), s) in enumerate(zip(group, starts)):
            pos = torch.arange(a - 1 - s, b - 1 - s)  # the outputs that predict tokens a..b-1
            out[a - 1:b - 1] = -logp[row, pos, ids[a:b]]
    return out


def score(model, tokenizer, texts, stride: int | None = None) -> Score:
    """The model's ``Score`` on a text or a list of documents."""
    check_vocabulary(model, tokenizer)
    nats = token_nats(model, token_ids(tokenizer, texts), stride)
    return Score(float(nats.double().sum()), nats.numel(), _utf8_bytes(texts))


def perplexity(model, tokenizer, texts) -> float:
    """exp(mean nats per token) of the model on ``texts`` (see the module's docstring)."""
    return score(model, tokenizer, texts).perplexity


def bits_per_byte(model, tokenizer, texts) -> float:
    """Bits of information per UTF-8 byte of ``texts``: comparable across tokenizers."""
    return score(model, tokenizer, texts).bits_per_byte


class Unigram:
    """The context-free baseline: p(token) = (count + 1) / (total + vocabulary)."""

    def __init__(self, counts):
        counts = torch.as_tensor(counts, dtype=torch.float64)
        self.log_probs = torch.log((counts + 1) / (counts.sum() + counts.numel()))  # (V,)

    @classmethod
    def course(cls) -> "Unigram":
        """Fitted on the course tokenizer's counts of the training split (``data/models/``)."""
        rows = read_table("models/train_token_counts.csv")
        return cls([int(r["count"]) for r in sorted(rows, key=lambda r: int(r["token_id"]))])

    def score(self, tokenizer, texts) -> Score:
        ids = torch.as_tensor(token_ids(tokenizer, texts)[1:], dtype=torch.long)
        if int(ids.max()) >= self.log_probs.numel():
            raise ValueError(f"token id {int(ids.max())} is outside the baseline's "
                             f"{self.log_probs.numel()} counts: another tokenizer's?")
        return Score(float(-self.log_probs[ids].sum()), ids.numel(), _utf8_bytes(texts))


@torch.inference_mode()
def agreement(draft, target, tokenizer, texts, limit: int | None = None) -> float:
    """Share of positions where ``draft`` and ``target`` would greedily pick the same next token."""
    ids = torch.as_tensor(token_ids(tokenizer, texts), dtype=torch.long)[:limit]
    W = min(draft.config.max_seq_len, target.config.max_seq_len)
    same = total = 0
    for s in range(0, ids.numel(), W):
        x = ids[None, s:s + W]
        same += int((draft(x.to(draft.device)).argmax(-1).cpu()
                     == target(x.to(target.device)).argmax(-1).cpu()).sum())
        total += x.shape[1]
    return same / total
