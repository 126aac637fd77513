"""Constrained decoding: the mask keeps exactly the tokens that leave the text a prefix of a
match, end-of-sequence only after a full match; greedy decoding under it always matches."""

import torch

from course_server import model_and_tokenizer
from inferlab.model.constrained import RegexConstraint, constrained_generate


class Pieces:
    """A tokenizer whose token i is the string PIECES[i]."""

    PIECES = ["a", "b", "ab", "1", "12", "x", ""]

    def decode(self, ids):
        return "".join(self.PIECES[i] for i in ids)


def test_the_mask_keeps_the_prefixes_of_a_match_and_ends_only_on_a_full_one():
    eos = len(Pieces.PIECES) - 1
    c = RegexConstraint(r"ab[0-9]+", Pieces(), len(Pieces.PIECES), eos)
    names = lambda mask: {Pieces.PIECES[i] or "<eos>" for i in torch.nonzero(mask).flatten()}
    assert names(c.allowed("")) == {"a", "ab"}
    assert names(c.allowed("a")) == {"b"}
    assert names(c.allowed("ab")) == {"1", "12"}
    assert names(c.allowed("ab1")) == {"1", "12", "<eos>"}
    assert not c.allowed("x").any()


def test_a_full_match_ends_only_when_no_token_but_eos_can_extend_it():
    for eos in (0, len(Pieces.PIECES) - 1):   # wherever the end-of-sequence id lies
        pieces = list(Pieces.PIECES)
        pieces.insert(eos, pieces.pop())          # the empty piece is end-of-sequence
        tok = type("Tok", (), {"decode": lambda self, ids: "".join(pieces[i] for i in ids)})()
        extendable = RegexConstraint(r"ab[0-9]+", tok, len(pieces), eos)
        assert not extendable.finished("ab") and not extendable.finished("ab1")
        assert RegexConstraint(r"ab1", tok, len(pieces), eos).finished("ab1")


def test_greedy_decoding_under_a_pattern_matches_it_and_unconstrained_does_not():
    model, tok = model_and_tokenizer()
    pattern = r'\{"name": "[a-z_]{1,12}", "line": [0-9]{1,4}\}'
    c = RegexConstraint(pattern, tok, model.config.vocab_size, tok.eos_token_id)
    prompt = tok.encode("# where the function starts, as JSON\nrecord = ")
    out = constrained_generate(model, prompt, c, 40)
    assert out["matches"] and c.complete(tok.decode(out["tokens"]))
    assert len(out["mask_s"]) >= len(out["tokens"]) and all(s > 0 for s in out["mask_s"])
    free = constrained_generate(model, prompt, None, len(out["tokens"]))
    assert not c.complete(tok.decode(free["tokens"]))
