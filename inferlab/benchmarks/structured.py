"""What a structured-output mask costs a decode step, at the course's vocabulary and a real one.

    python -m inferlab.benchmarks.structured            # print the table
    python -m inferlab.benchmarks.structured --write    # and a record in data/measurements/

A constrained request pays, at every step, for the set of tokens its grammar allows next. This
command times the parts on the CPU, one thread, beside the course model's decode forward pass
(batch 1), for one JSON schema walked along one valid answer, token by token (each figure the fastest
of ``inferlab.timing``'s measured blocks, medians in the record too: on a machine that other
programs share, the minimum is what the work itself costs):

- ``fill``: XGrammar's ``fill_next_token_bitmask`` plus ``accept_token`` (the matcher's host
  work a step), averaged over the answer's tokens;
- ``apply``: ``apply_token_bitmask_inplace`` on one row of logits, and the engine's clamp of
  the masked logits (``inferlab.serving.structured.apply_grammars``);
- ``course mask``: the course's own mask (``inferlab.model.constrained.RegexConstraint``), which
  tries every token's string against a pattern at every step, at a mid-answer text.

Both at the course model's 1,024 tokens and at Llama 3's 128,256. No tokenizer of that size is on
this machine (and nothing is downloaded), so the large vocabulary is synthetic: the course
tokenizer's 1,024 strings, then distinct concatenations of two to four of them drawn with a
fixed seed, 128,256 in all, the way byte-pair merges build longer tokens from shorter ones. The
answer's tokens are course tokens, which keep their ids in it. What it measures is how the mask's
work grows with the number of strings XGrammar must sort per state; a real tokenizer's strings
differ, and so would its figures. The forward pass at that vocabulary is not run here: a
Llama-3-8B step is priced in Chapter 9 from its bytes and a GPU's bandwidth.
Times are this machine's; nothing asserts them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

from inferlab.analysis.hardware import detect_device
from inferlab.measurements import write_record
from inferlab.timing import time_fn

COMMAND = "python -m inferlab.benchmarks.structured"
SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "line": {"type": "integer", "minimum": 0, "maximum": 99999},
                         "public": {"type": "boolean"}},
          "required": ["name", "line", "public"], "additionalProperties": False}
ANSWER = '{"name": "parse_config_line", "line": 1207, "public": true}'
PATTERN = r'\{"name": "[a-z_]{1,24}", "line": [0-9]{1,5}, "public": (true|false)\}'
LLAMA3_VOCAB = 128_256


def synthetic_vocab(pieces: list[str], size: int, seed: int = 0) -> list[str]:
    """``pieces`` then distinct concatenations of 2-4 of them (seeded), ``size`` strings."""
    rng, seen, out = random.Random(seed), set(pieces), list(pieces)
    usable = [p for p in pieces if p and "\ufffd" not in p]
    while len(out) < size:
        s = "".join(rng.choice(usable) for _ in range(rng.randint(2, 4)))
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


class Pieces:
    """A stand-in tokenizer whose token i decodes to ``vocab[i]`` (for the course mask)."""

    def __init__(self, vocab: list[str]):
        self.vocab = vocab

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)


def mask_costs(info, answer_ids: list[int], vocab_size: int, course_mask) -> dict:
    """Seconds of compile, fill + accept per token, apply and clamp, and the course mask."""
    import xgrammar as xgr

    t = time.perf_counter()
    compiled = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False) \
        .compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    compile_s = time.perf_counter() - t
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def walk():
        matcher = xgr.GrammarMatcher(compiled)
        for token in answer_ids:
            matcher.fill_next_token_bitmask(bitmask, 0)
            assert matcher.accept_token(token), token
        return matcher

    walk()  # every token of the answer is accepted (it asserts so)
    logits = torch.randn(1, vocab_size)
    lowest = torch.finfo(torch.float32).min
    apply = time_fn(lambda: xgr.apply_token_bitmask_inplace(logits, bitmask))
    clamp = time_fn(lambda: logits.clamp_(min=lowest))
    fill = time_fn(walk, min_run_time=0.5)
    text = ANSWER[:len(ANSWER) // 2]
    t = time.perf_counter()
    allowed = course_mask.allowed(text)
    course_s = time.perf_counter() - t
    if vocab_size <= 4096:  # small enough to time properly
        course_s = time_fn(lambda: course_mask.allowed(text), min_run_time=0.5).min_s
    return {"vocab_size": vocab_size, "compile_s": compile_s,
            "fill_accept_s": fill.min_s / len(answer_ids), "apply_s": apply.min_s,
            "clamp_s": clamp.min_s, "course_mask_s": course_s,
            "fill_accept_median_s": fill.median_s / len(answer_ids),
            "apply_median_s": apply.median_s, "course_mask_allowed": int(allowed.sum())}


def measure(threads: int = 1) -> dict:
    import xgrammar as xgr

    from inferlab.model.constrained import RegexConstraint
    from inferlab.model.generate import decode_one_token, prefill
    from inferlab.model.kv_cache import KVCache
    from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer
    from inferlab.serving.structured import tokenizer_info

    torch.set_num_threads(threads)
    path = checkpoint_path("course-target")
    model = load_checkpoint(path)
    tok = load_tokenizer(path, model=model)
    V, eos = model.config.vocab_size, tok.eos_token_id
    answer = tok.encode(ANSWER)

    # the forward a constrained step rides on: one decode token at batch 1, 64 tokens cached
    prompt = tok.encode("# where the function starts, as JSON\nrecord = ")
    cache = KVCache.for_model(model, 1, max_len=len(prompt) + 128)
    with torch.inference_mode():
        prefill(model, torch.tensor([prompt]), cache)
        token = torch.tensor([answer[0]])

        def step():  # the same position each time: the cache forgets the token it stored
            out = decode_one_token(model, token, cache)
            cache.length = len(prompt)
            return out
        forward = time_fn(step, min_run_time=0.5)

    pieces = [tok.decode([i]) for i in range(V)]
    small = mask_costs(tokenizer_info(tok, V, [eos]), answer, V,
                       RegexConstraint(PATTERN, tok, V, eos))
    vocab = synthetic_vocab(pieces, LLAMA3_VOCAB)
    big_info = xgr.TokenizerInfo([p.encode("utf-8") for p in vocab], xgr.VocabType.RAW,
                                 vocab_size=LLAMA3_VOCAB, stop_token_ids=[eos])
    big = mask_costs(big_info, answer, LLAMA3_VOCAB,
                     RegexConstraint(PATTERN, Pieces(vocab), LLAMA3_VOCAB, eos))
    return {"benchmark": "structured", "model": "course-target", "dtype": "float32",
            "schema": SCHEMA, "answer": ANSWER, "answer_tokens": len(answer),
            "xgrammar": xgr.__version__ if hasattr(xgr, "__version__") else
            __import__("importlib.metadata").metadata.version("xgrammar"),
            "forward_s": forward.min_s, "forward_median_s": forward.median_s,
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "course_vocab": small, "llama3_vocab": big,
            "llama3_vocab_note": "synthetic: the course tokenizer's 1,024 strings and seeded "
                                 "concatenations of 2-4 of them (no real tokenizer on disk)"}


def main(argv=None) -> int:
    from inferlab.analysis.column import Table

    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--write", action="store_true", help="write a record to "
                                                             "data/measurements/")
    args = parser.parse_args(argv)
    record = measure(args.threads)
    us = lambda s: f"{s * 1e6:,.1f}"  # noqa: E731
    print(f"course model decode forward (batch 1, {args.threads} thread): "
          f"{record['forward_s'] * 1e3:.2f} ms; XGrammar {record['xgrammar']}")
    rows = [[f"{r['vocab_size']:,}", f"{r['compile_s'] * 1e3:,.1f}", us(r["fill_accept_s"]),
             us(r["apply_s"]), us(r["clamp_s"]), us(r["course_mask_s"])]
            for r in (record["course_vocab"], record["llama3_vocab"])]
    print(Table(rows, ["vocabulary", "compile ms", "fill+accept us", "apply us", "clamp us",
                       "course mask us"]))
    if args.write:
        record["command"] = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
        print(f"written to {write_record(record, detect_device('cpu'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
