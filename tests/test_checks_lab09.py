"""Every Lab 9 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that names the call and gives a hint."""

import statistics

from check_contract import contract
from inferlab.course.checks import lab09
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
}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab09, CASES, 9)
