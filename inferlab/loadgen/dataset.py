"""What a load sends: each request's prompt, its output length and its send time.

Lengths come from a trace of ``inferlab.sim.traces`` (ShareGPT-like or Alpaca-like, scaled and
cut to a context) or from vLLM's *random* dataset (``vllm bench serve --dataset-name random``,
vllm/benchmarks/datasets/random.py): each request's input and output lengths drawn uniformly
from [floor(n (1 - r)), ceil(n (1 + r))] around the given means with range ratio r, after an
optional shared prefix of ``prefix_len`` tokens that every request starts with (vLLM's
``--random-prefix-len``: the workload of a common system prompt, which a prefix cache serves
once).

**A prompt's length is what the server counts.** A prompt is token ids. Sent as ids (the
Completions API takes them: vLLM, SGLang and the course's server do), its length is exact on
any server. The Chat Completions API takes text only, so for it the ids are turned into a text
that the served model's own tokenizer encodes to exactly that many tokens: decoded, encoded
again, and cut or topped up until the two agree (byte-level BPE does not round-trip arbitrary
ids: about nine in ten random 64-id sequences of the course's tokenizer come back at another
length), as vLLM's ``gen_prompt_decode_to_target_len`` does. The server then adds its chat
template's tokens, which its ``usage`` reports; the report counts input tokens from ``usage``
whenever the server gives it. ``PromptTokenizer`` reads a tokenizer.json (the course's models
keep one in data/models/) or, given a Hugging Face Hub id, fetches that file (a network call,
made only on request).

Send times: all at once (rate ``inf``), a Poisson process at a rate, or vLLM's gamma arrivals
(``--burstiness`` b: gaps drawn from a gamma distribution of shape b and mean 1/rate; b = 1 is
Poisson, b < 1 burstier, b > 1 more even), or given times (a replayed trace).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferlab.sim import traces, workloads

RANDOM = "random"  # vLLM's random dataset: lengths given, prompts random tokens


@dataclass(frozen=True)
class LoadRequest:
    """One request of a load: prompt token ids (and, for text APIs, a text the served model's
    tokenizer encodes to exactly those ids' number of tokens), tokens to generate, when to send
    it (seconds after the load starts)."""

    prompt: tuple[int, ...]
    max_tokens: int
    send_at_s: float
    text: str | None = None


class PromptTokenizer:
    """A served model's tokenizer, as a load generator needs it: ``encode`` without special
    tokens, ``decode``, and the ids a random prompt may use (every id but the special ones)."""

    def __init__(self, backend, name: str = ""):
        self.backend, self.name = backend, name
        special = {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
        size = backend.get_vocab_size(with_added_tokens=True)
        self.allowed = np.array([i for i in range(size) if i not in special])

    @classmethod
    def load_local(cls, name_or_path: str | Path) -> "PromptTokenizer":
        """From a tokenizer.json file, a directory holding one, or one of the course's models
        by name (``course-target``); FileNotFoundError if none is on this machine."""
        from tokenizers import Tokenizer

        from inferlab import data_path

        path = Path(name_or_path)
        course = data_path("models.csv").parent / "models" / str(name_or_path)
        for file in (path, path / "tokenizer.json", course / "tokenizer.json"):
            if file.is_file():
                return cls(Tokenizer.from_file(str(file)), str(name_or_path))
        raise FileNotFoundError(f"no tokenizer.json at {name_or_path!r} nor a course model of "
                                "that name")

    @classmethod
    def load(cls, name_or_path: str | Path) -> "PromptTokenizer":
        """``load_local``, or else a Hugging Face Hub id's tokenizer.json (needs a network)."""
        try:
            return cls.load_local(name_or_path)
        except FileNotFoundError:
            from tokenizers import Tokenizer

            return cls(Tokenizer.from_pretrained(str(name_or_path)), str(name_or_path))

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def text_of_length(self, ids, rng: np.random.Generator) -> str:
        """A text this tokenizer encodes to exactly ``len(ids)`` tokens, made from ``ids``.

        Decode and encode again (the count drifts), top up or cut to a little less than the
        target, then append one random ordinary token at a time, keeping it only if the count does not
        overshoot, until the count is exact and the text neither starts nor ends with
        whitespace (which a chat template around it could merge with its own)."""
        n = len(ids)
        text = self.decode(ids).lstrip()
        for _ in range(20 * n + 200):
            count = len(self.encode(text))
            if count == n and text[-1:].strip():
                return text
            if count > n - 1 and count != n:  # too long: cut back to a shorter prefix
                text = self.decode(self.encode(text)[:max(0, n - 4)]).lstrip()
                continue
            if count < n - 4:  # far below: top up with as many tokens as are missing
                text = (text + self.decode(self.draw(rng, n - count))).lstrip()
                continue
            grown = (text + self.decode(self.draw(rng, 1))).lstrip()
            if len(self.encode(grown)) <= n:
                text = grown
            elif count == n:  # exact but ending in whitespace: give up its last token
                text = self.decode(self.encode(text)[:-1]).lstrip()
        raise ValueError(f"no text of exactly {n} tokens was found")

    def draw(self, rng: np.random.Generator, n: int) -> list[int]:
        return [int(i) for i in rng.choice(self.allowed, size=n)]


def random_lengths(num_requests: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                   seed: int = 0) -> list[traces.TraceRow]:
    """Input and output lengths of vLLM's random dataset: uniform integers in
    [floor(n (1 - r)), ceil(n (1 + r))] around each length n, outputs at least 1."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    if input_len < 1 or output_len < 1:
        raise ValueError(f"input and output lengths must be at least 1, got {input_len}, "
                         f"{output_len}")
    rng = np.random.default_rng(seed)
    lows = [max(1, math.floor(n * (1 - range_ratio))) for n in (input_len, output_len)]
    highs = [math.ceil(n * (1 + range_ratio)) for n in (input_len, output_len)]
    ins = rng.integers(lows[0], highs[0] + 1, size=num_requests)
    outs = rng.integers(lows[1], highs[1] + 1, size=num_requests)
    return [traces.TraceRow(n, int(i), int(o)) for n, (i, o) in enumerate(zip(ins, outs))]


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (s) of ``n`` requests at ``rate`` per second on average: all at 0 for an
    infinite rate; gaps exponential (Poisson, ``burstiness`` 1) or gamma-distributed with shape
    ``burstiness`` and mean 1/rate; evenly spaced for an infinite burstiness."""
    if not burstiness > 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    if math.isinf(rate) or math.isnan(rate):
        return [0.0] * n
    if burstiness == 1.0:
        return workloads.poisson_arrivals(n, rate, seed)
    if rate <= 0:
        raise ValueError(f"the rate must be positive, got {rate}")
    if math.isinf(burstiness):
        gaps = np.full(n, 1.0 / rate)
    else:
        gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    return np.cumsum(gaps).tolist()


def make_load(trace: str = "sharegpt_like", num_requests: int = 100, rate: float = math.inf,
              scale: float = 1.0, max_len: int | None = None, vocab_size: int = 1000,
              seed: int = 0, arrivals_s: list[float] | None = None,
              input_len: int = 1024, output_len: int = 128, range_ratio: float = 0.0, *,
              prefix_len: int = 0, burstiness: float = 1.0,
              tokenizer: PromptTokenizer | None = None, text: bool = False) -> list[LoadRequest]:
    """``num_requests`` rows of a trace of ``inferlab.sim.traces`` (lengths times ``scale``,
    cut to ``max_len``), or of the random dataset (``trace="random"``: ``input_len``,
    ``output_len``, ``range_ratio``, after a shared prefix of ``prefix_len`` tokens), arriving
    at ``rate`` per second (all at 0 for ``inf``; gaps shaped by ``burstiness``) or at the given
    ``arrivals_s``.

    Prompt ids are drawn from ``tokenizer``'s ordinary ids when given, else below
    ``vocab_size``; with ``text``, each request also carries a text that ``tokenizer`` encodes to
    exactly its prompt's length (what a chat request sends)."""
    if text and tokenizer is None:
        raise ValueError("text prompts need the served model's tokenizer")
    if prefix_len < 0 or (prefix_len and trace != RANDOM):
        raise ValueError(f"a shared prefix (prefix_len={prefix_len}) is a random-dataset option")
    if trace == RANDOM:
        rows = random_lengths(num_requests, input_len, output_len, range_ratio, seed)
    elif trace in traces.WORKLOADS:
        rows = getattr(traces, trace)(num_requests, seed=seed)
    else:
        raise ValueError(f"unknown trace {trace!r}; use one of "
                         f"{sorted([*traces.WORKLOADS, RANDOM])}")
    if scale != 1.0 or max_len is not None:
        rows = traces.scale_lengths(rows, scale, max_len)
    if arrivals_s is None:
        arrivals_s = arrival_times(num_requests, rate, burstiness, seed)
    if len(arrivals_s) != len(rows):
        raise ValueError(f"{len(rows)} requests but {len(arrivals_s)} arrival times")
    rng = np.random.default_rng(seed)

    def draw(n: int) -> list[int]:
        return tokenizer.draw(rng, n) if tokenizer else [int(t) for t in
                                                          rng.integers(1, vocab_size, n)]

    prefix = draw(prefix_len)
    # As text, the shared prefix is one text every request starts with, and a line break (one
    # token of its own in a byte-level BPE) keeps it from merging with what follows.
    head = tokenizer.text_of_length(prefix, rng) + "\n" if text and prefix else ""
    out = []
    for r, t in zip(rows, arrivals_s):
        ids = prefix + draw(r.prompt_len)
        words = None
        if text:
            body = r.prompt_len - (1 if head else 0)
            words = head + (tokenizer.text_of_length(draw(body), rng) if body else "")
            ids = tokenizer.encode(words)  # the length the tokenizer counts, whatever it is
        out.append(LoadRequest(tuple(ids), r.output_len, float(t), words))
    return out
