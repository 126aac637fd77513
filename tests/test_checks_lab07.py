"""Every Lab 7 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that says what went wrong and hints at why."""

import math

from check_contract import contract, hints
from inferlab.analysis import request_time
from inferlab.course.checks import lab07
from inferlab.serving.request import Status
from inferlab.serving.scheduler import Step, chunked_policy
from inferlab.serving.metrics import SLO
from inferlab.sim import goodput


# -- planted bugs in the chunked policy ---------------------------------------------------------
def _decode_phase(sched, step):
    for seq in list(sched.running):
        if seq.status is not Status.RUNNING or sched.is_prefilling(seq):
            continue
        while not sched.can_append(seq):
            victim = sched.running[-1]
            sched.preempt(victim)
            step.preempted.append(victim)
            if victim is seq:
                break
        else:
            sched.append_slot(seq)
            step.decodes.append(seq)


def budget_ignores_decodes(sched, now):
    """Gives the prefills the whole budget, as if decodes were free."""
    step = Step()
    begun = [s for s in sched.running if sched.is_prefilling(s)]
    _decode_phase(sched, step)
    budget = sched.token_budget
    for seq in begun:
        if seq.status is Status.RUNNING and budget > 0:
            n = min(seq.num_uncomputed, budget)
            step.prefill(seq, n)
            budget -= n
    while not step.preempted and budget > 0 and sched.waiting and sched.can_admit(sched.waiting[0]):
        seq = sched.waiting[0]
        sched.admit(seq)
        n = min(seq.num_uncomputed, budget)
        step.prefill(seq, n)
        budget -= n
    return step


def new_prompts_before_begun_ones(sched, now):
    """Admits waiting requests before continuing the prompts already begun."""
    step = Step()
    begun = [s for s in sched.running if sched.is_prefilling(s)]
    _decode_phase(sched, step)
    budget = sched.token_budget - len(step.decodes)
    while not step.preempted and budget > 0 and sched.waiting and sched.can_admit(sched.waiting[0]):
        seq = sched.waiting[0]
        sched.admit(seq)
        n = min(seq.num_uncomputed, budget)
        step.prefill(seq, n)
        budget -= n
    for seq in begun:
        if seq.status is Status.RUNNING and budget > 0:
            n = min(seq.num_uncomputed, budget)
            step.prefill(seq, n)
            budget -= n
    return step


def whole_prompts_only(sched, now):
    """Never splits a prompt: one that does not fit the budget left waits."""
    step = Step()
    begun = [s for s in sched.running if sched.is_prefilling(s)]
    _decode_phase(sched, step)
    budget = sched.token_budget - len(step.decodes)
    for seq in begun:
        if seq.status is Status.RUNNING and budget > 0:
            n = min(seq.num_uncomputed, budget)
            step.prefill(seq, n)
            budget -= n
    while not step.preempted and sched.waiting and sched.can_admit(sched.waiting[0]) \
            and (sched.waiting[0].num_uncomputed <= budget or not step.scheduled):
        seq = sched.waiting[0]
        sched.admit(seq)
        n = min(seq.num_uncomputed, budget)
        step.prefill(seq, n)
        budget -= n
    return step


def prefills_stall_decodes(sched, now):
    """While a prompt is being prefilled nobody decodes: the stall chunking exists to remove."""
    begun = [s for s in sched.running if sched.is_prefilling(s)]
    if begun or (sched.waiting and sched.can_admit(sched.waiting[0])):
        step = Step()
        budget = sched.token_budget
        for seq in begun:
            n = min(seq.num_uncomputed, budget)
            step.prefill(seq, n)
            budget -= n
        while budget > 0 and sched.waiting and sched.can_admit(sched.waiting[0]):
            seq = sched.waiting[0]
            sched.admit(seq)
            n = min(seq.num_uncomputed, budget)
            step.prefill(seq, n)
            budget -= n
        return step
    return chunked_policy(sched, now)


# -- planted bugs in the transfer time and the attainment curve ---------------------------------
def query_heads(config, tokens, bw, dtype="bfloat16"):
    from inferlab.device import bytes_per_element
    return 2 * config.n_layers * config.n_heads * config.head_dim * bytes_per_element(dtype) \
        * tokens / bw


def keys_only(config, tokens, bw, dtype="bfloat16"):
    return request_time.swap_time(config, tokens, bw, dtype) / 2


def bits_per_second(config, tokens, bw, dtype="bfloat16"):
    return request_time.swap_time(config, tokens, bw, dtype) / 8


def one_token_answers_miss(timings, ttft_s, bounds):
    return [sum(t.ttft <= ttft_s and t.tpot <= b for t in timings) / len(timings) for b in bounds]


def counts_not_shares(timings, ttft_s, bounds):
    return [float(sum(SLO(ttft_s, b).met_by(t) for t in timings)) for b in bounds]


def tpot_only(timings, ttft_s, bounds):
    return [sum(math.isnan(t.tpot) or t.tpot <= b for t in timings) / len(timings)
            for b in bounds]


CASES = {
    "chunked_policy": (chunked_policy, [budget_ignores_decodes, new_prompts_before_begun_ones,
                                        whole_prompts_only, prefills_stall_decodes]),
    "kv_transfer_seconds": (request_time.swap_time, [query_heads, keys_only, bits_per_second]),
    "attainment_curve": (goodput.attainment_curve, [one_token_answers_miss, counts_not_shares,
                                                    tpot_only]),
}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab07, CASES, 7,
    lent_as={n: r for n, (r, _) in CASES.items() if n != "kv_transfer_seconds"})  # a wrapper


test_specific_hints = hints(lab07, CASES, [
    (budget_ignores_decodes, "one per decode"),
    (new_prompts_before_begun_ones, "prompts begun in earlier steps"),
    (whole_prompts_only, "a chunk of what is left"),
    (prefills_stall_decodes, "every running sequence decodes"),
    (query_heads, "KV heads"),
    (keys_only, "keys AND values"),
    (bits_per_second, "no bits"),
    (one_token_answers_miss, "one-token answer"),
    (counts_not_shares, "a fraction"),
])


def test_the_replayed_traces_chunk_prompts_and_preempt():
    chunked = preempted = 0
    for trace in lab07._TRACES:
        log, sched = lab07._replay(chunked_policy, trace)
        chunked += sum(1 for prefills, _, _ in log for _, n in prefills if n > 1)
        preempted += sched.num_preemptions
    assert chunked and preempted
