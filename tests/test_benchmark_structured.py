"""The structured-output benchmark's real vocabulary: the Tekken reader and its byte-level BPE,
on a tiny hand-made rank table (the real file is not needed), and a matcher walk over it."""

from __future__ import annotations

import base64
import json
import zipfile

import pytest

from inferlab.benchmarks import structured as bench
from inferlab.benchmarks.tekken import (TEKKEN_MEMBER, BPEVocab, bpe_merge, from_tekken_json,
                                        read_tekken)

PATTERN = r" ?[a-z]+| ?[0-9]| ?[^\sa-z0-9]+|\s+"   # a small stand-in for Tekken's


def table(merges: list[bytes]) -> dict:
    """A Tekken-shaped file: every byte, then ``merges`` in rank order, 3 special ids."""
    tokens = [bytes([b]) for b in range(256)] + merges
    vocab = [{"rank": r, "token_bytes": base64.b64encode(t).decode(),
              "token_str": t.decode("utf-8", errors="replace")} for r, t in enumerate(tokens)]
    return {"config": {"pattern": PATTERN, "default_vocab_size": 3 + len(tokens),
                       "default_num_special_tokens": 3, "version": "v3"}, "vocab": vocab}


def ranks_of(merges: list[bytes]) -> dict[bytes, int]:
    return {**{bytes([b]): b for b in range(256)},
            **{m: 256 + i for i, m in enumerate(merges)}}


def test_merges_follow_rank_order():
    # "ab" ranked before "bc": "abc" merges a+b first, then ab+c if that is a token
    assert bpe_merge(b"abc", ranks_of([b"ab", b"bc"])) == [b"ab", b"c"]
    assert bpe_merge(b"abc", ranks_of([b"bc", b"ab"])) == [b"a", b"bc"]
    assert bpe_merge(b"abc", ranks_of([b"ab", b"bc", b"abc"])) == [b"abc"]
    assert bpe_merge(b"abc", ranks_of([b"bc", b"ab", b"abc"])) == [b"abc"]  # a + bc
    assert bpe_merge(b"abcd", ranks_of([b"bc", b"ab", b"cd"])) == [b"a", b"bc", b"d"]
    assert bpe_merge(b"abcd", ranks_of([b"ab", b"cd", b"bc"])) == [b"ab", b"cd"]
    assert bpe_merge(b"aaaa", ranks_of([b"aa"])) == [b"aa", b"aa"]  # leftmost on a tie
    assert bpe_merge(b"", ranks_of([])) == []


def test_the_reader_numbers_specials_first_and_round_trips():
    vocab = from_tekken_json(table([b"ab", b"bc", b"abc", b" t", b"ru", b" tru", b" true"]))
    assert vocab.num_special == 3 and vocab.vocab_size == 3 + 256 + 7
    assert vocab.token_bytes[:3] == [b""] * 3 and vocab.eos_id == 2
    assert vocab.token_bytes[3 + ord("a")] == b"a" and vocab.token_bytes[3 + 256] == b"ab"
    ids = vocab.encode("abc true")
    assert [vocab.token_bytes[i] for i in ids] == [b"abc", b" true"]
    whole = from_tekken_json(table([b" true"]))  # a piece that is a token is that token
    assert [whole.token_bytes[i] for i in whole.encode(" true")] == [b" true"]
    for text in ["abc true", '{"name": "x_1", "line": 12}', "ünï 日本 \n\n x", ""]:
        assert vocab.decode(vocab.encode(text)) == text


def test_the_reader_checks_the_file_s_structure_and_reads_a_wheel(tmp_path):
    data = table([b"ab"])
    data["vocab"][300 - 256 + 1:] = []
    with pytest.raises(ValueError, match="fewer"):
        from_tekken_json({**data, "config": {**data["config"], "default_vocab_size": 400}})
    shuffled = table([b"ab", b"bc"])
    shuffled["vocab"][256], shuffled["vocab"][257] = shuffled["vocab"][257], \
        shuffled["vocab"][256]
    with pytest.raises(ValueError, match="rank order"):
        from_tekken_json(shuffled)
    with pytest.raises(ValueError, match="every byte"):
        BPEVocab([b""], {b"a": 0}, PATTERN, 1, 0, {})
    wheel = tmp_path / "mistral_common-0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(TEKKEN_MEMBER, json.dumps(table([b"ab"])))
    vocab = read_tekken(wheel)
    assert vocab.source["member"] == TEKKEN_MEMBER and len(vocab.source["sha256"]) == 64
    assert vocab.encode("ab") == [3 + 256]


def test_the_matcher_accepts_the_answer_as_the_bpe_encodes_it():
    xgr = pytest.importorskip("xgrammar")
    vocab = from_tekken_json(table([b"ab", b"na", b"me", b"name", b"\":", b" t", b"ru", b" tru",
                                   b" true"]))
    info = xgr.TokenizerInfo(vocab.token_bytes, xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                             stop_token_ids=[vocab.eos_id])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_json_schema(
        json.dumps(bench.SCHEMA), any_whitespace=False)
    answer = vocab.encode(bench.ANSWER)
    assert b"name" in [vocab.token_bytes[i] for i in answer] and len(answer) < len(bench.ANSWER)
    times = bench.fill_times(compiled, answer, xgr.allocate_token_bitmask(1, vocab.vocab_size),
                             walks=2)
    assert len(times) == len(answer) and all(t > 0 for t in times)
