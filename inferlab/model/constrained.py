"""Constrained decoding: a regular expression turned into a mask over the vocabulary, per step.

Structured outputs (vLLM's ``structured_outputs`` with ``regex``, ``json`` or ``choice``;
OpenAI's ``response_format``) make a model's output follow a pattern: at every step, the
tokens that would take the text off the pattern get a logit of minus infinity, so the sampler
can only choose among the rest, and the end-of-sequence token is allowed only once the text is
a complete match. The model is unchanged; only its choices are restricted.

``allowed_tokens`` is the direct version (Lab 9's Exercise 9.4), and ``RegexConstraint`` holds it
for one pattern and vocabulary: for the text so far, it tries every vocabulary token's string
and keeps those after which the text is still a *prefix* of some match (the ``regex`` package's
``partial=True``). That is a Python loop over the vocabulary at every step,
which is what makes it a lesson: its cost per step grows with the vocabulary (1,024 tokens
here, 100,000 or more in real models), and production backends (XGrammar, llguidance) exist to
remove it, by compiling the pattern into an automaton and precomputing, per automaton state,
the mask of allowed tokens, so that a step costs a table lookup. ``constrained_generate`` runs
greedy decoding under a constraint and times the mask and the forward pass of each step
separately.

A JSON schema is compiled to such a pattern by the real backends; here a short schema-shaped
regular expression stands in for it.
"""

from __future__ import annotations

import time

import regex
import torch

from inferlab.model.generate import decode_one_token, prefill
from inferlab.model.kv_cache import KVCache


def allowed_tokens(pattern, pieces: list[str], text: str, eos_token_id: int | None
                   ) -> torch.Tensor:
    """A (V,) bool mask over the ``pieces`` (token i's string is ``pieces[i]``): True for each
    token after which ``text`` is still a prefix of some full match of ``pattern`` (a compiled
    ``regex`` pattern), and for the end-of-sequence token only once ``text`` is a full match.
    A token that adds no text (a special token) is never allowed: it would let the model
    spend its budget without moving."""
    ok = torch.zeros(len(pieces), dtype=torch.bool)
    for i, piece in enumerate(pieces):
        if i != eos_token_id and piece and \
                pattern.fullmatch(text + piece, partial=True) is not None:
            ok[i] = True
    if eos_token_id is not None and pattern.fullmatch(text) is not None:
        ok[eos_token_id] = True
    return ok


class RegexConstraint:
    """The tokens allowed after a text, for outputs that must fully match ``pattern``."""

    def __init__(self, pattern: str, tokenizer, vocab_size: int, eos_token_id: int | None):
        self.pattern = regex.compile(pattern)
        self.eos = eos_token_id
        # the string each token adds (byte-level pieces that are not whole characters decode to
        # U+FFFD and are never allowed by an ASCII pattern)
        self.pieces = [tokenizer.decode([i]) for i in range(vocab_size)]

    def complete(self, text: str) -> bool:
        return self.pattern.fullmatch(text) is not None

    def allowed(self, text: str) -> torch.Tensor:
        """A (V,) bool mask: True for the tokens after which ``text`` can still match."""
        return allowed_tokens(self.pattern, self.pieces, text, self.eos)

    def finished(self, text: str) -> bool:
        """``text`` is a full match that no token other than end-of-sequence can extend."""
        if not self.complete(text):
            return False
        ok = self.allowed(text)
        if self.eos is not None:
            ok[self.eos] = False
        return not ok.any()


@torch.inference_mode()
def constrained_generate(model, prompt: list[int], constraint: RegexConstraint | None,
                         max_new_tokens: int) -> dict:
    """Greedy decoding of up to ``max_new_tokens`` tokens after ``prompt`` under ``constraint``
    (None: unconstrained). Returns the new tokens, their text, whether it fully matches, and
    the seconds of each step's mask and forward pass."""
    tokens = torch.tensor([prompt], device=model.device)
    cache = KVCache.for_model(model, 1, max_len=len(prompt) + max_new_tokens)
    sync = torch.cuda.synchronize if tokens.is_cuda else (lambda: None)  # a kernel ends later
    t = time.perf_counter()
    logits = prefill(model, tokens, cache)[0]
    sync()
    forward_s, mask_s, out, text = [time.perf_counter() - t], [], [], ""
    for _ in range(max_new_tokens):
        if constraint is not None:
            t = time.perf_counter()
            ok = constraint.allowed(text)
            mask_s.append(time.perf_counter() - t)
            if not ok.any():
                break  # the pattern admits nothing more (it cannot happen after a full match)
            logits = logits.masked_fill(~ok.to(logits.device), float("-inf"))
        token = int(logits.argmax())
        if constraint is not None and token == constraint.eos:
            break
        out.append(token)
        text += constraint.pieces[token] if constraint is not None else ""
        if constraint is not None and constraint.finished(text):
            break  # a full match that no token can extend: done
        t = time.perf_counter()
        logits = decode_one_token(model, torch.tensor([token], device=model.device), cache)[0]
        sync()
        forward_s.append(time.perf_counter() - t)
    return {"tokens": out, "text": text,
            "matches": constraint.complete(text) if constraint is not None else None,
            "mask_s": mask_s, "forward_s": forward_s}
