"""Generation stops at end-of-sequence: a sequence ends at its first EOS token, a batch stops
when every sequence has ended, and the tokens before the stop are those of an unstopped run."""

import pytest
import torch

from inferlab.model.config import ModelConfig
from inferlab.model.generate import (decode_one_token, generate, generate_text,
                                     generate_without_cache)
from inferlab.model.llama import build_model

CONFIG = ModelConfig.from_name("tiny").scaled(n_layers=2, max_seq_len=128)
PROMPTS = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])


@pytest.fixture(scope="module")
def model():
    return build_model(CONFIG, seed=11)


def _first_new_token_not_in(row, banned):
    return next(t for t in row if t not in banned)


@pytest.mark.parametrize("loop", [generate, generate_without_cache], ids=["cached", "recomputed"])
def test_one_sequence_ends_with_its_first_eos(model, loop):
    free = loop(model, PROMPTS[:1], 20)[0]
    eos = int(free[4 + 3])  # the fourth new token plays the end-of-sequence token
    stop = free[4:].tolist().index(eos)  # its first occurrence among the new tokens
    out = loop(model, PROMPTS[:1], 20, eos_token_id=eos)[0]
    assert out.tolist() == free[:4 + stop + 1].tolist()
    assert int(out[-1]) == eos and stop <= 3
    never = next(t for t in range(CONFIG.vocab_size) if t not in free.tolist())
    assert torch.equal(loop(model, PROMPTS[:1], 20, eos_token_id=never)[0], free)


def test_a_batch_pads_ended_sequences_and_stops_when_all_have_ended(model):
    free = generate(model, PROMPTS, 24)
    new0, new1 = free[0, 4:].tolist(), free[1, 4:].tolist()
    eos = _first_new_token_not_in(new0[2:], set(new1[:5]))  # row 0 ends before row 1 can
    out = generate(model, PROMPTS, 24, eos_token_id=eos)
    end0 = new0.index(eos)
    end1 = new1.index(eos) if eos in new1 else len(new1) - 1
    assert out.shape == (2, 4 + max(end0, end1) + 1)
    assert out[0, :4 + end0 + 1].tolist() == free[0, :4 + end0 + 1].tolist()
    assert set(out[0, 4 + end0:].tolist()) == {eos}  # padded with the end-of-sequence id
    assert out[1].tolist() == free[1, :out.shape[1]].tolist()  # untouched by row 0's end
    assert torch.equal(out, generate_without_cache(model, PROMPTS, 24, eos_token_id=eos))


def test_several_eos_ids_and_no_stop_without_them(model):
    free = generate(model, PROMPTS[:1], 16)[0, 4:].tolist()
    first, second = free[5], free[2]
    out = generate(model, PROMPTS[:1], 16, eos_token_id=[first, second])[0, 4:].tolist()
    assert out == free[:min(free.index(first), free.index(second)) + 1]
    assert generate(model, PROMPTS[:1], 16, eos_token_id=[])[0, 4:].tolist() == free


def test_generate_text_stops_decoding_at_eos_not_only_its_text(model, monkeypatch):
    free = generate(model, PROMPTS[:1], 30)[0, 4:].tolist()
    eos = free[3]
    steps = []

    def counting(*args, **kwargs):
        steps.append(1)
        return decode_one_token(*args, **kwargs)

    monkeypatch.setattr("inferlab.model.generate.decode_one_token", counting)

    class Words:
        eos_token_id = eos

        def encode(self, text):
            return [int(w) for w in text.split()]

        def decode(self, ids):
            return " ".join(map(str, ids))

    text = generate_text(model, Words(), "5 6 7 8", max_new_tokens=30)
    stop = free.index(eos)
    assert text == " ".join(map(str, free[:stop]))
    assert len(steps) == stop  # one prefill then a decode step per token up to the EOS
