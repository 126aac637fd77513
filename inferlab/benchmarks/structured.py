"""What a structured-output mask costs a decode step, at the course's vocabulary and a real one.

    python -m inferlab.benchmarks.structured --tekken PATH          # print the table
    python -m inferlab.benchmarks.structured --tekken PATH --write  # and a record

A constrained request pays, at every step, for the set of tokens its grammar allows next. This
command times the parts on the CPU, one thread, beside the course model's decode forward pass
(batch 1), for one JSON schema (compiled with ``any_whitespace=False``) walked along one valid
answer, token by token:

- ``fill``: XGrammar's ``fill_next_token_bitmask`` plus ``accept_token`` (the matcher's host
  work a step): each position of the answer timed over many walks, the median per position,
  then their mean over the answer (``fill_accept_s``) and their largest (``fill_accept_worst_s``);
- ``apply``: ``apply_token_bitmask_inplace`` on one row of logits, and the engine's clamp of
  the masked logits (``inferlab.serving.structured.apply_grammars``);
- ``compile``: the schema compiled against the vocabulary (median of a few, cache off);
- ``course mask``: the course's own mask (``inferlab.model.constrained.RegexConstraint``), which
  tries every token's string against a pattern at every step, at a mid-answer text.

Three vocabularies, each with its answer encoded the way its tokenizer would:

- **course**: the course model's 1,024 tokens;
- **Tekken**: a real 131,072-token byte-level BPE vocabulary, read from the JSON that Mistral's
  ``mistral_common`` package ships for its models (``--tekken``: the wheel
  or the extracted ``tekken_240911.json``; ``inferlab.benchmarks.tekken`` reads it and encodes
  the answer with its own ranks and split pattern). Nothing is downloaded: without the file the
  command says so and measures the other two;
- **constructed worst case**: 128,256 strings (Llama 3's count), the course tokenizer's 1,024
  and seeded concatenations of two to four of them. Not any model's vocabulary: its strings of
  Python fragments are ones XGrammar's compiler cannot settle ahead of time inside a JSON
  string, so nearly every token is left for the matcher to try at run time. It shows what the
  fill costs when that precomputation fails, which is what makes a real vocabulary cheap.

The forward pass at the large vocabularies is not run here: Chapter 9 prices a Llama-3-8B step
from its bytes and a GPU's bandwidth. Times are this machine's, with its load average kept in
the record; nothing asserts them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
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
WORST_CASE_VOCAB = 128_256  # as many strings as Llama 3's vocabulary has tokens
WALKS = 25                  # walks of the answer timed position by position
COMPILES = 5


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


def fill_times(compiled, answer_ids: list[int], bitmask, walks: int) -> list[float]:
    """Seconds of fill + accept at each position of the answer: the median over ``walks``."""
    import xgrammar as xgr

    per_walk = []
    for _ in range(walks + 1):  # the first walk warms up and is dropped
        matcher, times = xgr.GrammarMatcher(compiled), []
        for token in answer_ids:
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask, 0)
            ok = matcher.accept_token(token)
            times.append(time.perf_counter() - t)
            assert ok, token  # every token of the answer is accepted
        per_walk.append(times)
    return [statistics.median(column) for column in zip(*per_walk[1:])]


def mask_costs(info, answer_ids: list[int], vocab_size: int, course_mask,
               walks: int = WALKS) -> dict:
    """Seconds of compile, fill + accept per token, apply and clamp, and the course mask."""
    import xgrammar as xgr

    compiles = []
    for _ in range(COMPILES):
        t = time.perf_counter()
        compiled = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False) \
            .compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
        compiles.append(time.perf_counter() - t)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    per_token = fill_times(compiled, answer_ids, bitmask, walks)
    logits = torch.randn(1, vocab_size)
    lowest = torch.finfo(torch.float32).min
    apply = time_fn(lambda: xgr.apply_token_bitmask_inplace(logits, bitmask))
    clamp = time_fn(lambda: logits.clamp_(min=lowest))
    text = ANSWER[:len(ANSWER) // 2]
    t = time.perf_counter()
    allowed = course_mask.allowed(text)
    course_s = time.perf_counter() - t
    if vocab_size <= 4096:  # small enough to time properly
        course_s = time_fn(lambda: course_mask.allowed(text), min_run_time=0.5).min_s
    return {"vocab_size": vocab_size, "answer_tokens": len(answer_ids),
            "compile_s": statistics.median(compiles), "compile_all_s": compiles,
            "fill_accept_s": statistics.fmean(per_token),
            "fill_accept_worst_s": max(per_token), "fill_accept_per_token_s": per_token,
            "walks": walks, "apply_s": apply.median_s, "apply_min_s": apply.min_s,
            "clamp_s": clamp.median_s, "course_mask_s": course_s,
            "course_mask_allowed": int(allowed.sum())}


def measure(threads: int = 1, tekken: str | None = None) -> dict:
    import xgrammar as xgr

    from inferlab.benchmarks.tekken import read_tekken
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

    record = {"benchmark": "structured", "model": "course-target", "dtype": "float32",
              "schema": SCHEMA, "any_whitespace": False, "answer": ANSWER,
              "answer_tokens": len(answer), "xgrammar": xgr_version(),
              "forward_s": forward.min_s, "forward_median_s": forward.median_s,
              "course_vocab": mask_costs(tokenizer_info(tok, V, [eos]), answer, V,
                                         RegexConstraint(PATTERN, tok, V, eos))}
    if tekken is not None:
        bpe = read_tekken(tekken)
        info = xgr.TokenizerInfo(bpe.token_bytes, xgr.VocabType.RAW,
                                 vocab_size=bpe.vocab_size, stop_token_ids=[bpe.eos_id])
        pieces = [b.decode("utf-8", errors="replace") for b in bpe.token_bytes]
        record["tekken_vocab"] = {
            **mask_costs(info, bpe.encode(ANSWER), bpe.vocab_size,
                         RegexConstraint(PATTERN, Pieces(pieces), bpe.vocab_size, bpe.eos_id)),
            "source": bpe.source,
            "note": "real: Mistral's Tekken byte-level BPE (1,000 special ids, then BPE ranks); "
                    "the answer BPE-encoded with its own ranks and split pattern"}
    vocab = synthetic_vocab([tok.decode([i]) for i in range(V)], WORST_CASE_VOCAB)
    info = xgr.TokenizerInfo([p.encode("utf-8") for p in vocab], xgr.VocabType.RAW,
                             vocab_size=WORST_CASE_VOCAB, stop_token_ids=[eos])
    record["worst_case_vocab"] = {
        **mask_costs(info, answer, WORST_CASE_VOCAB,
                     RegexConstraint(PATTERN, Pieces(vocab), WORST_CASE_VOCAB, eos)),
        "note": "constructed, not a model's: the course tokenizer's 1,024 strings and seeded "
                "concatenations of 2-4 of them, which leave nearly every token for the matcher "
                "to try inside a JSON string"}
    record["load_average"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    record["cpus"], record["python"] = os.cpu_count(), platform.python_version()
    return record


def xgr_version() -> str:
    from importlib.metadata import version
    return version("xgrammar")


def main(argv=None) -> int:
    from inferlab.analysis.column import Table

    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--tekken", metavar="PATH", help="Mistral's Tekken tokenizer: a "
                        "mistral_common wheel or its tekken_240911.json")
    parser.add_argument("--write", action="store_true", help="write a record to "
                                                             "data/measurements/")
    parser.add_argument("--note", help="what the record should say about the machine (e.g. "
                                       "that other programs were running)")
    args = parser.parse_args(argv)
    if args.tekken is not None and not os.path.exists(args.tekken):
        print(f"no file at {args.tekken}: measuring without the real vocabulary")
        args.tekken = None
    if args.tekken is None:
        print("no real vocabulary (--tekken PATH): the course's and the constructed worst case "
              "only" + ("; no record written (the book reads the real vocabulary's row)"
                        if args.write else ""))
    record = measure(args.threads, args.tekken)
    us = lambda s: f"{s * 1e6:,.1f}"  # noqa: E731
    print(f"course model decode forward (batch 1, {args.threads} thread): "
          f"{record['forward_s'] * 1e3:.2f} ms; XGrammar {record['xgrammar']}")
    names = {"course_vocab": "course", "tekken_vocab": "Tekken (real)",
             "worst_case_vocab": "constructed worst case"}
    rows = [[name, f"{r['vocab_size']:,}", f"{r['compile_s'] * 1e3:,.1f}",
             us(r["fill_accept_s"]), us(r["fill_accept_worst_s"]), us(r["apply_s"]),
             us(r["course_mask_s"])]
            for key, name in names.items() if (r := record.get(key))]
    print(Table(rows, ["vocabulary", "tokens", "compile ms", "fill+accept us", "worst us",
                       "apply us", "course mask us"]))
    if args.write and args.tekken is not None:
        record["command"] = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
        if args.note:
            record["note"] = args.note
        print(f"written to {write_record(record, detect_device('cpu'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
