"""Every Lab 9 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that names the call and gives a hint."""

import statistics

import torch

from check_contract import contract, hints
from inferlab.course.checks import lab09
from inferlab.model.constrained import allowed_tokens
from inferlab.serving.prefix_cache import block_hashes


def timing(sent, t, first=None, tpot_n=None, itl_first=False):
    n = len(t) - 1 if tpot_n is None else tpot_n(len(t))
    itl = [b - a for a, b in zip(t, t[1:])]
    return {"ttft": t[0] - (sent if first is None else first(t)), "tpot": (t[-1] - t[0]) / n,
            "e2e": t[-1] - sent, "itl": ([t[0] - sent] if itl_first else []) + itl}


def hashes(tokens, size, salt, chained=True, salted=True, partial=False):
    out, parent = [], ("s", salt) if salted else None
    n = -(-len(tokens) // size) if partial else len(tokens) // size
    for i in range(n):
        block = tuple(tokens[i * size:(i + 1) * size])
        h = hash((parent, block)) if chained else hash((("s", salt) if salted else None, block))
        out.append(h)
        parent = h
    return out


def accuracy(t, s, h, m, centre=statistics.median, invert=False, count=False):
    cut = (centre(h) + centre(m)) / 2
    right = sum(((x < cut) != invert) == bool(y) for x, y in zip(t, s))
    return right if count else right / len(s)


def mask(pattern, pieces, text, eos, test=None, eos_rule=None, skip_empty=True):
    """The mask, with one rule changed: ``test(pattern, text, piece)`` for a token, ``eos_rule``
    for end-of-sequence, ``skip_empty`` for tokens with no text."""
    test = test or (lambda p, t, piece: p.fullmatch(t + piece, partial=True) is not None)
    ok = torch.zeros(len(pieces), dtype=torch.bool)
    for i, piece in enumerate(pieces):
        if i != eos and (piece or not skip_empty) and test(pattern, text, piece):
            ok[i] = True
    ok[eos] = (eos_rule or (lambda p, t: p.fullmatch(t) is not None))(pattern, text)
    return ok


def eos_always(p, s, t, e):
    return mask(p, s, t, e, eos_rule=lambda p, t: True)


def eos_never(p, s, t, e):
    return mask(p, s, t, e, eos_rule=lambda p, t: False)


def empty_allowed(p, s, t, e):
    return mask(p, s, t, e, skip_empty=False)


def whole_matches_only(p, s, t, e):
    return mask(p, s, t, e, test=lambda p, t, piece: p.fullmatch(t + piece) is not None)


def piece_alone(p, s, t, e):
    return mask(p, s, t, e, test=lambda p, t, piece: p.fullmatch(piece, partial=True) is not None)


def match_not_fullmatch(p, s, t, e):
    return mask(p, s, t, e, test=lambda p, t, piece: p.match(t + piece, partial=True) is not None)


def a_list(p, s, t, e):
    return allowed_tokens(p, s, t, e).tolist()


CASES = {
    "stream_timing": (timing, [
        lambda s, t: timing(s, t, first=lambda t: 0.0 if s == 0 else t[0] - 0.01),  # not from sent
        lambda s, t: timing(s, t, tpot_n=lambda n: n),                              # n, not n - 1
        lambda s, t: {**timing(s, t), "e2e": t[-1] - t[0]},                         # from first
        lambda s, t: timing(s, t, itl_first=True),                                  # TTFT as a gap
    ]),
    "salted_block_hashes": (hashes, [
        lambda t, n, salt: hashes(t, n, salt, salted=False),   # salt ignored
        lambda t, n, salt: hashes(t, n, salt, chained=False),  # blocks hashed alone
        lambda t, n, salt: hashes(t, n, salt, partial=True),   # the partial block too
        lambda t, n, salt: [hash(x) for x in block_hashes(t, n)] if salt is None
        else block_hashes(t, n),                                 # salt changes nothing
    ]),
    "attack_accuracy": (accuracy, [
        lambda t, s, h, m: accuracy(t, s, h, m, centre=statistics.mean),  # the slow hit drags
        lambda t, s, h, m: accuracy(t, s, h, m, invert=True),
        lambda t, s, h, m: accuracy(t, s, h, m, count=True),
    ]),
    "allowed_tokens": (allowed_tokens, [eos_always, eos_never, empty_allowed,
                                        whole_matches_only, piece_alone, match_not_fullmatch,
                                        a_list]),
}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab09, CASES, 9)

test_specific_hints = hints(lab09, CASES, [
    (eos_always, "FULL match"), (eos_never, "FULL match"), (empty_allowed, "adds no text"),
    (whole_matches_only, "partial=True"), (piece_alone, "WITH the token appended"),
    (match_not_fullmatch, "fullmatch, not match"), (a_list, "bool tensor of shape")])


def test_the_engine_s_course_mask_is_the_reference_the_check_lends():
    from check_contract import stub
    assert lab09.allowed_tokens(stub) is allowed_tokens
