"""Lab 6's checks pass the right answers, lend the reference to an unattempted exercise, and fail
each planted bug with a hint that names the mistake."""

import pytest
import torch

from check_contract import contract, hints
from inferlab.analysis import speculation
from inferlab.course.checks import lab06
from inferlab.model import speculative
from inferlab.serving.paged_cache import blocks_for


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def stub(*args):
    raise NotImplementedError


# Planted bugs, one mistake each.

def judged_by_the_next_row(logits, drafted):
    choice = logits.argmax(-1).tolist()
    out = []
    for i, d in enumerate(drafted.tolist()):
        if d != choice[min(i + 1, len(choice) - 1)]:
            break
        out.append(d)
    return out + [choice[len(out)]]


def judged_by_the_next_row_loop_from_one(logits, drafted):
    """The slip as a learner writes it: d_1 .. d_k against rows 1 .. k."""
    choice = logits.argmax(-1)
    out = []
    for i in range(1, len(drafted) + 1):
        if drafted[i - 1] != choice[i]:
            break
        out.append(int(drafted[i - 1]))
    return out + [int(choice[len(out)])]


def every_row_one_late(logits, drafted):
    choice = logits.argmax(-1).tolist()
    out = []
    for i, d in enumerate(drafted.tolist()):
        if d != choice[i + 1]:
            break
        out.append(d)
    return out + [choice[min(len(out) + 1, len(drafted))]]


def correction_from_the_next_row(logits, drafted):
    choice = logits.argmax(-1).tolist()
    out = []
    for i, d in enumerate(drafted.tolist()):
        if d != choice[i]:
            return out + [choice[i + 1]]
        out.append(d)
    return out + [choice[len(drafted)]]


def judged_by_the_previous_row(logits, drafted):
    choice = logits.argmax(-1).tolist()
    out = []
    for i, d in enumerate(drafted.tolist()):
        if d != choice[i - 1]:
            break
        out.append(d)
    return out + [choice[len(out)]]


def no_bonus(logits, drafted):
    out = speculative.greedy_verify(logits, drafted)
    return out[:-1] if len(out) == len(drafted) + 1 and len(drafted) else out


def keeps_matches_after_a_mismatch(logits, drafted):
    choice = logits.argmax(-1).tolist()
    out = [d if d == choice[i] else choice[i] for i, d in enumerate(drafted.tolist())]
    return out + [choice[len(drafted)]]


def always_accept(p, q, drafted, generator):
    return drafted.tolist() + [int(torch.multinomial(p[len(drafted)], 1, generator=generator))]


def resample_from_p(p, q, drafted, generator):
    out = []
    for i, d in enumerate(drafted.tolist()):
        if float(torch.rand((), generator=generator)) * float(q[i, d]) < float(p[i, d]):
            out.append(d)
            continue
        return out + [int(torch.multinomial(p[i], 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(drafted)], 1, generator=generator))]


def accept_if_more_likely(p, q, drafted, generator):
    out = []
    for i, d in enumerate(drafted.tolist()):
        if p[i, d] >= q[i, d]:
            out.append(d)
            continue
        residual = (p[i] - q[i]).clamp(min=0)
        return out + [int(torch.multinomial(residual, 1, generator=generator))]
    return out + [int(torch.multinomial(p[len(drafted)], 1, generator=generator))]


def k_not_k_plus_one(a, k):
    return k + 1.0 if a == 1 else (1 - a ** k) / (1 - a)


def divides_by_zero(a, k):
    return (1 - a ** (k + 1)) / (1 - a)


def earliest_match(tokens, k, max_ngram=3):
    T = len(tokens)
    for n in range(min(max_ngram, T - 1), 0, -1):
        for start in range(0, T - n):
            if tokens[start:start + n] == tokens[T - n:]:
                return tokens[start + n:start + n + k]
    return []


def no_copy_past_the_end(tokens, k, max_ngram=3):
    T = len(tokens)
    for n in range(min(max_ngram, T - 1), 0, -1):
        for start in range(T - n - 1, -1, -1):
            if tokens[start:start + n] == tokens[T - n:]:
                return tokens[start + n:start + n + k]
    return []


def leaks(table, num_tokens):
    table.num_tokens = num_tokens


def drops_the_partial_block(table, num_tokens):
    keep = num_tokens // table.block_size
    for block in reversed(table.blocks[keep:]):
        table.allocator.free(block)
    del table.blocks[keep:]
    table.num_tokens = num_tokens


def forgets_the_count(table, num_tokens):
    keep = blocks_for(num_tokens, table.block_size)
    for block in reversed(table.blocks[keep:]):
        table.allocator.free(block)
    del table.blocks[keep:]


CASES = {
    "greedy_verify": (speculative.greedy_verify, [
        judged_by_the_next_row, judged_by_the_next_row_loop_from_one, every_row_one_late,
        correction_from_the_next_row, judged_by_the_previous_row, no_bonus,
        keeps_matches_after_a_mismatch]),
    "sampling_verify": (speculative.sampling_verify, [always_accept, resample_from_p,
                                                      accept_if_more_likely]),
    "expected_tokens": (speculation.expected_tokens, [k_not_k_plus_one, divides_by_zero]),
    "prompt_lookup": (speculative.prompt_lookup, [earliest_match, no_copy_past_the_end]),
    "truncate": (lambda t, n: t.truncate(n), [leaks, drops_the_partial_block, forgets_the_count]),
}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab06, CASES, 6, words=(("Hint:", "raised"),))


test_specific_hints = hints(lab06, CASES, [
    (judged_by_the_next_row, "judged by the row after its own"),
    (judged_by_the_next_row_loop_from_one, "judged by the row after its own"),
    (every_row_one_late, "one too late"),
    (correction_from_the_next_row, "that same position"),
    (judged_by_the_previous_row, "row -1"),
    (no_bonus, "one more token"),
    (keeps_matches_after_a_mismatch, "stop at the first mismatch"),
    (always_accept, "follow the draft's q"),
    (resample_from_p, "residual"),
    (k_not_k_plus_one, "bonus token counts"),
    (divides_by_zero, "k \\+ 1 tokens"),
    (earliest_match, "LATEST"),
    (no_copy_past_the_end, "copy on past"),
    (leaks, "leak"),
    (drops_the_partial_block, "partly"),
    (forgets_the_count, "num_tokens"),
])


def test_chi_square_false_alarm_rate_is_as_stated():
    """Correct samples fail the test about FALSE_ALARM of the time (here: 400 seeded samples of
    a fair 6-sided die at a 5% level, so the count of false alarms is not zero)."""
    p = torch.full((6,), 1 / 6, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    alarms = sum(lab06.chi_square(torch.bincount(torch.multinomial(p, 300, True, generator=gen),
                                                 minlength=6), p)[2] < 0.05 for _ in range(400))
    assert 8 <= alarms <= 36  # 5% of 400 is 20; the binomial's 99.9% range is about 6..37
