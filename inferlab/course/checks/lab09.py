"""Checks for Lab 9, "Serving it for real".

Oracles that need no solution:

- a stream's timing against ``inferlab.serving.metrics`` (``ttft``, ``tpot``, ``latency``) on
  token times the check makes up, gaps of every size included;
- salted block hashes by their properties: one hash per full block, equal for equal prefixes
  under one salt, chained (a change in block 0 changes every later hash), and disjoint across
  salts, which is what keeps one tenant's cached blocks out of another's reach;
- the attack's accuracy against the midway-between-medians rule of
  ``inferlab.loadgen.side_channel.threshold``, on made-up probe times with outliers;
- a structured-output mask against its definition, token by token: a token is allowed when the
  text after it can still be completed to a full match of the pattern (the ``regex`` package's
  partial matching), end-of-sequence only after a full match, a token with no text never; on a
  made-up vocabulary with pieces that span the pattern's parts, an empty special token and an
  end-of-sequence token, at texts from empty to complete and one already off the pattern.
"""

from __future__ import annotations

import random

from inferlab.course.checks import CheckFailed, expect_close, expect_equal, lends, run_check
from inferlab.loadgen import side_channel
from inferlab.model import constrained
from inferlab.serving import metrics, prefix_cache

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"9.1": 2, "9.2": 2, "9.3": 1, "9.4": 2}


def _stream_timing(sent_s, chunk_times_s):
    t = list(chunk_times_s)
    return {"ttft": metrics.ttft(sent_s, t), "tpot": metrics.tpot(t),
            "e2e": metrics.latency(sent_s, t), "itl": [b - a for a, b in zip(t, t[1:])]}


def stream_timing(fn):
    """Exercise 9.1: ``stream_timing(sent_s, chunk_times_s)``: a dict of the stream's TTFT,
    TPOT, end-to-end latency and its inter-token latencies (a list)."""
    cases_ = [(0.0, [0.25, 0.30, 0.36, 0.50]), (1.5, [1.75, 2.0]), (2.0, [2.1, 2.1, 2.9, 3.0, 3.05])]

    def cases(f):
        for sent, times in cases_:
            got = f(sent, list(times))
            ref = _stream_timing(sent, times)
            if not isinstance(got, dict):
                raise CheckFailed(f"stream_timing({sent}, {times}) returned {got!r}, expected a "
                                  "dict with keys ttft, tpot, e2e, itl.")
            expect_close(f"stream_timing({sent}, {times})['ttft']", got.get("ttft"), ref["ttft"],
                         hint="TTFT counts from when the request was SENT to the first chunk.")
            expect_close(f"stream_timing({sent}, {times})['tpot']", got.get("tpot"), ref["tpot"],
                         hint="TPOT is (last - first) / (tokens - 1): the first token's wait "
                              "is TTFT's, and n tokens have n - 1 gaps.")
            expect_close(f"stream_timing({sent}, {times})['e2e']", got.get("e2e"), ref["e2e"],
                         hint="end-to-end latency runs from sending to the LAST chunk.")
            itl = got.get("itl")
            if not isinstance(itl, (list, tuple)) or len(itl) != len(ref["itl"]) or any(
                    abs(a - b) > 1e-9 for a, b in zip(itl, ref["itl"])):
                raise CheckFailed(f"stream_timing({sent}, {times})['itl'] returned {itl!r}, "
                                  f"expected {ref['itl']!r}.\n  Hint: one gap between each two "
                                  "consecutive chunks; the wait for the first is not one.")
    return run_check("9.1", "stream_timing", fn,
                     lends(_stream_timing, metrics.ttft, metrics.tpot, metrics.latency), cases,
                     success="your client measures what the engine's clock measures.")


def salted_block_hashes(fn):
    """Exercise 9.2: ``salted_block_hashes(tokens, block_size, salt)``: one chained hash per
    full block, in a namespace of the salt's own."""
    rng = random.Random(9)

    def ids(n):
        return [rng.randrange(1, 1000) for _ in range(n)]

    def cases(f):
        a, b = ids(70), ids(70)
        got = f(a, 16, "alice")
        expect_equal("len(salted_block_hashes(70 tokens, 16, 'alice'))",
                     len(got) if isinstance(got, (list, tuple)) else got, 4,
                     hint="only FULL blocks are hashed: 70 // 16 = 4; a partly filled block "
                          "still changes, so it cannot be shared.")
        expect_equal("salted_block_hashes(a, 16, 'alice') twice", list(f(a, 16, "alice")),
                     list(got), hint="the hash must depend only on the tokens and the salt.")
        same_start = a[:48] + b[48:]
        expect_equal("the first 3 hashes of two prompts sharing 48 tokens",
                     list(f(same_start, 16, "alice"))[:3], list(got)[:3],
                     hint="blocks 0..2 hold the same 48 tokens: their hashes must match.")
        changed = [a[0] + 1] + a[1:]
        later = list(f(changed, 16, "alice"))
        if any(x == y for x, y in zip(later[1:], list(got)[1:])):
            raise CheckFailed("changing token 0 left a later block's hash unchanged.\n  Hint: "
                              "chain the hashes: block i's hash covers the hash of block i - 1, "
                              "because a token's K/V depend on every token before it.")
        other = set(f(a, 16, "bob"))
        if other & set(got):
            raise CheckFailed("the same tokens under the salts 'alice' and 'bob' share a hash."
                              "\n  Hint: start the chain from the salt, so that no block of one "
                              "tenant can match a block of another.")
        if set(f(a, 16, None)) & set(got):
            raise CheckFailed("salt None (the shared cache) and salt 'alice' share a hash.\n"
                              "  Hint: a salted chain must start from a value of its own.")
    return run_check("9.2", "salted_block_hashes", fn,
                     lends(lambda t, s, salt: prefix_cache.block_hashes(t, s, salt),
                           prefix_cache.block_hashes), cases,
                     success="two tenants' equal prompts now land in different cache entries.")


def _attack_accuracy(ttft_s, sent, hit_s, miss_s):
    cut = side_channel.threshold(hit_s, miss_s)
    return sum((t < cut) == bool(s) for t, s in zip(ttft_s, sent)) / len(sent)


def attack_accuracy(fn):
    """Exercise 9.3: ``attack_accuracy(ttft_s, sent, hit_s, miss_s)``: the share of probes
    guessed right, guessing "sent" below the threshold midway between the medians of the
    attacker's own hits and misses."""
    hit = [0.050, 0.052, 0.055, 0.60]       # one hit slowed by a hiccup
    miss = [0.110, 0.115, 0.120, 0.118]
    probes = [0.054, 0.112, 0.090, 0.070, 0.125, 0.05, 0.081, 0.086]
    sent = [True, False, False, True, False, True, True, False]

    def cases(f):
        for h, m, t, s in [(hit, miss, probes, sent), (hit[:3], miss[:3], probes[::-1], sent),
                           (miss, hit, probes, [not x for x in sent])]:
            expected = _attack_accuracy(t, s, h, m)
            got = f(list(t), list(s), list(h), list(m))
            hint = "guess 'sent' when a probe's TTFT is BELOW (h_med + m_med) / 2, with the " \
                   "medians of the hits and of the misses; score the share of right guesses."
            if isinstance(got, (int, float)) and abs(got - (1 - expected)) < 1e-9 and \
                    expected != 0.5:
                hint = "the guesses are inverted: a cache hit is FASTER, so below the threshold."
            elif isinstance(got, (int, float)) and got > 1:
                hint = "return a fraction of the probes, not a count."
            expect_close(f"attack_accuracy(probes {t}, sent {s})", got, expected, rel=1e-9,
                         hint=hint)
    return run_check("9.3", "attack_accuracy", fn,
                     lends(_attack_accuracy, side_channel.threshold), cases,
                     success="a median ignores the one slow hit that a mean would follow.")


# Exercise 9.4's made-up vocabulary: pieces that span the pattern's parts ('{"n', '": 1'), a
# special token that decodes to no text (id 1) and end-of-sequence (id 0, no text either, as the
# course tokenizer's).
MASK_PATTERN = r'\{"n": [0-9]{1,3}\}'
MASK_PIECES = ["", "", "{", '{"', '{"n', '"', "n", '": ', '": 1', ":", " ", "0", "1", "12",
               "123", "1}", "}", "x", "\ufffd", "\n"]
MASK_EOS = 0
MASK_TEXTS = ["", "{", '{"n', '{"n": ', '{"n": 1', '{"n": 123', '{"n": 12}', '{"x']


def allowed_tokens(fn):
    """Exercise 9.4: ``allowed_tokens(pattern, pieces, text, eos_token_id)``: a (V,) bool tensor,
    True for each token after which ``text`` can still become a full match of ``pattern``, and
    for end-of-sequence only once ``text`` is one."""
    import regex
    import torch

    pattern = regex.compile(MASK_PATTERN)

    def cases(f):
        for text in MASK_TEXTS:
            call = f"allowed_tokens(pattern, pieces, {text!r}, eos_token_id={MASK_EOS})"
            got = f(pattern, list(MASK_PIECES), text, MASK_EOS)
            ref = constrained.allowed_tokens(pattern, MASK_PIECES, text, MASK_EOS)
            if not isinstance(got, torch.Tensor) or got.dtype != torch.bool or \
                    tuple(got.shape) != (len(MASK_PIECES),):
                raise CheckFailed(
                    f"{call} returned {_describe(got)}, expected a bool tensor of shape "
                    f"({len(MASK_PIECES)},), one entry per token.\n  Hint: start from "
                    "torch.zeros(len(pieces), dtype=torch.bool) and set the allowed tokens True.")
            if torch.equal(got, ref):
                continue
            i = int((got != ref).nonzero()[0])
            piece, wanted = MASK_PIECES[i], bool(ref[i])
            if i == MASK_EOS:
                hint = ("end-of-sequence ends the text, so it is allowed exactly when the text "
                        "so far is already a FULL match: pattern.fullmatch(text) is not None.")
            elif not piece:
                hint = ("a token that adds no text (a special token) never moves the text on: "
                        "allowing it lets the model loop in place. Skip empty pieces.")
            elif wanted:
                hint = ("the text need not match yet, only still be able to: test "
                        "pattern.fullmatch(text + piece, partial=True), which is not None for a "
                        "prefix of some match.")
            else:
                hint = ("test the text WITH the token appended (text + piece), against the "
                        "whole pattern (fullmatch, not match or search), so that the pieces "
                        "before this step count too.")
            raise CheckFailed(f"{call}: token {i} ({piece!r}) came back "
                              f"{'allowed' if not wanted else 'not allowed'}, expected "
                              f"{'allowed' if wanted else 'not allowed'} (expected "
                              f"{int(ref.sum())} tokens allowed: "
                              f"{[MASK_PIECES[j] for j in ref.nonzero().flatten().tolist()]}, "
                              f"got {int(got.sum())}).\n  Hint: {hint}")
    return run_check("9.4", "allowed_tokens", fn, constrained.allowed_tokens, cases,
                     success="a token stays allowed exactly while the text can still match.")


def _describe(value) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"{type(value).__name__} {value!r}"[:120]
