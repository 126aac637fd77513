"""Perplexity, bits per byte and the unigram baseline, against direct computations on a toy
model; and the messages for checkpoints that cannot be used (a missing file, an unknown
architecture, a tokenizer from another checkpoint)."""

import json
import math
import sys

import pytest
import torch

from inferlab.model.config import ModelConfig
from inferlab.model.generate import generate_text
from inferlab.model.llama import build_model
from inferlab.model.quality import Score, Unigram, agreement, score, token_ids, token_nats
from inferlab.model.generate import check_vocabulary
from inferlab.model.weights import SINGLE_NAME, load_checkpoint, load_tokenizer, save_checkpoint

TOY = ModelConfig.from_name("tiny").scaled(n_layers=2, vocab_size=64, max_seq_len=32)


@pytest.fixture(scope="module")
def model():
    return build_model(TOY, seed=3)


class Chars:
    """Each character is one token (its code point mod 60, plus 4); id 0 ends a document."""

    eos_token_id = 0
    vocab_size = 64

    def encode(self, text):
        return [4 + ord(c) % 60 for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def _direct_nats(model, ids, pos):
    """-log p(ids[pos] | the up to max_seq_len tokens before it), from one forward pass."""
    context = ids[max(0, pos - model.config.max_seq_len):pos]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([context]))[0, -1].float(), -1)
    return float(-logp[ids[pos]])


def test_a_text_within_one_window_is_scored_by_one_forward_pass(model):
    ids = token_ids(Chars(), ["def f(x):\n", "    return x\n"])
    assert ids[0] == 0 and ids.count(0) == 3  # one in front, one after each document
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids[:-1]])).float(), -1)[0]
    expected = -logp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    for stride in (None, 5, TOY.max_seq_len):
        torch.testing.assert_close(token_nats(model, ids, stride), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride", [8, 16, 32])
def test_a_long_text_gives_every_token_at_least_a_window_minus_a_stride_of_context(model, stride):
    ids = [0] + [4 + (7 * i) % 50 for i in range(100)]
    nats = token_nats(model, ids, stride, batch=3)
    assert nats.shape == (len(ids) - 1,) and torch.isfinite(nats).all()
    W = TOY.max_seq_len
    for pos in (1, 20, W, W + 1, 70, len(ids) - 1):
        block_end = min(((pos - 1) // stride + 1) * stride + 1, len(ids))
        context_start = max(0, block_end - 1 - W)
        assert pos - context_start >= min(pos, W - stride + 1)
        window = ids[context_start:pos + 1]
        assert float(nats[pos - 1]) == pytest.approx(_direct_nats(model, window, len(window) - 1),
                                                     abs=1e-4)


def test_score_units_and_the_unigram_baseline(model):
    texts = ["ab\n", "é\n"]  # é is two UTF-8 bytes
    s = score(model, Chars(), texts)
    assert s.tokens == 3 + 2 + 2 and s.bytes == 3 + 3
    assert s.perplexity == pytest.approx(math.exp(s.nats / s.tokens))
    assert s.bits_per_byte == pytest.approx(s.nats / math.log(2) / 6)
    counts = torch.zeros(64, dtype=torch.long)
    counts[0], counts[4 + ord("a") % 60] = 10, 30
    u = Unigram(counts).score(Chars(), texts)
    ids = token_ids(Chars(), texts)[1:]
    expected = -sum(math.log((int(counts[i]) + 1) / (40 + 64)) for i in ids)
    assert u.nats == pytest.approx(expected) and u.tokens == len(ids) and u.bytes == 6
    assert Score(nats=math.log(2) * 8, tokens=4, bytes=4).bits_per_byte == 2.0


def test_a_model_agrees_with_itself_and_less_with_another(model):
    other = build_model(TOY, seed=4)
    texts = ["class A:\n    pass\n"] * 3
    assert agreement(model, model, Chars(), texts) == 1.0
    assert agreement(other, model, Chars(), texts) < 1.0


def test_a_tokenizer_larger_than_the_model_is_refused_everywhere(model, tmp_path):
    class Big(Chars):
        vocab_size = 100
        path = tmp_path / "other-checkpoint"

    for call in (lambda: check_vocabulary(model, Big()),
                 lambda: score(model, Big(), "x = 1\n"),
                 lambda: generate_text(model, Big(), "x", max_new_tokens=2)):
        with pytest.raises(ValueError, match=r"other-checkpoint/tokenizer\.json has 100 tokens.*"
                                             r"64.*same directory"):
            call()
    check_vocabulary(model, Chars())  # same size: fine; a larger model table is fine too


def _word_tokenizer(path, size):
    tokenizers = pytest.importorskip("tokenizers")
    words = ["<eos>"] + [f"w{i}" for i in range(size - 1)]
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)},
                                                           unk_token="<eos>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok.save(str(path / "tokenizer.json"))


def test_load_tokenizer_checks_the_model_and_names_a_missing_file(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # the `tokenizers` path
    path = save_checkpoint(build_model(TOY, seed=5), tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match=r"ckpt/tokenizer\.json does not exist.*download"):
        load_tokenizer(path)
    _word_tokenizer(path, 80)
    model = load_checkpoint(path)
    with pytest.raises(ValueError, match=r"ckpt/tokenizer\.json has 80 tokens"):
        load_tokenizer(path, model=model)
    _word_tokenizer(path, 64)
    assert load_tokenizer(path, model=model).vocab_size == 64


def test_missing_weights_and_unknown_architectures_name_the_file(tmp_path):
    path = save_checkpoint(build_model(TOY, seed=6), tmp_path / "ckpt")
    hf = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(hf | {"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"ckpt/config\.json: architecture.*GPT2LMHeadModel.*"
                                         r"Choose a checkpoint"):
        load_checkpoint(path)
    (path / "config.json").write_text(json.dumps({k: v for k, v in hf.items()
                                                  if k != "hidden_size"}))
    with pytest.raises(ValueError, match=r"ckpt/config\.json has no 'hidden_size'"):
        load_checkpoint(path)
    (path / "config.json").write_text(json.dumps(hf))
    (path / SINGLE_NAME).unlink()
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors.*ckpt.*download"):
        load_checkpoint(path)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"ckpt has no config\.json"):
        load_checkpoint(path)
