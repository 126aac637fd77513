"""Every Lab 4 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that says what went wrong and hints at why."""

import math

from check_contract import contract, hints
from inferlab.course.checks import lab04
from inferlab.analysis import formulas
from inferlab.serving import metrics
from inferlab.serving.request import Status
from inferlab.serving.scheduler import (Step, continuous_policy, make_static_policy,
    static_policy)


# -- planted bugs in the policies -------------------------------------------------------------
def static_without_padding(sched, now):
    return make_static_policy(pad=False)(sched, now)


def static_without_padding_rows(sched, now):
    """Holds its finished members but does not list them as padding rows."""
    step = static_policy(sched, now)
    step.padding = []
    return step


def static_that_lets_newcomers_join(sched, now):
    step = static_policy(sched, now)
    if step.decodes:  # admit more while the batch is in flight
        while sched.waiting and sched.can_admit(sched.waiting[0]):
            seq = sched.waiting[0]
            sched.admit(seq)
            step.prefills.append(seq)
    return step


def static_ignoring_max_batch(sched, now):
    old = sched.max_batch
    sched.max_batch = 10**6
    try:
        return static_policy(sched, now)
    finally:
        sched.max_batch = old


def preempts_the_next_arrival(sched, now):
    """Preempts the earliest arrival after the growing sequence, not the latest."""
    step = Step()
    for seq in list(sched.running):
        if seq.status is not Status.RUNNING:
            continue
        while not sched.can_append(seq):
            later = [s for s in sched.running if s.order > seq.order]
            victim = later[0] if later else seq
            sched.preempt(victim)
            step.preempted.append(victim)
            if victim is seq:
                break
        else:
            sched.append_slot(seq)
            step.decodes.append(seq)
    while sched.waiting and sched.can_admit(sched.waiting[0]) and not step.preempted:
        seq = sched.waiting[0]
        sched.admit(seq)
        step.prefills.append(seq)
    return step


def skips_ahead(sched, now):
    step = continuous_policy(sched, now)
    if not step.preempted:
        for seq in list(sched.waiting):  # not FCFS: anyone who fits
            if sched.can_admit(seq):
                sched.admit(seq)
                step.prefills.append(seq)
    return step


def never_preempts(sched, now):
    step = Step()
    for seq in list(sched.running):
        if sched.can_append(seq):
            sched.append_slot(seq)
            step.decodes.append(seq)
    while sched.waiting and sched.can_admit(sched.waiting[0]):
        seq = sched.waiting[0]
        sched.admit(seq)
        step.prefills.append(seq)
    return step


def grows_without_asking(sched, now):
    step = Step()
    for seq in list(sched.running):
        sched.append_slot(seq)
        step.decodes.append(seq)
    while sched.waiting and sched.can_admit(sched.waiting[0]):
        seq = sched.waiting[0]
        sched.admit(seq)
        step.prefills.append(seq)
    return step


# -- planted bugs in the metrics and the prediction -------------------------------------------
def metrics_reference(a, t):
    return metrics.ttft(a, t), metrics.tpot(t), metrics.latency(a, t)


def tpot_over_n(a, t):
    return t[0] - a, (t[-1] - t[0]) / len(t), t[-1] - a


def latency_from_first_token(a, t):
    return t[0] - a, metrics.tpot(t), t[-1] - t[0]


def tpot_zero_for_one_token(a, t):
    return t[0] - a, (t[-1] - t[0]) / max(len(t) - 1, 1), t[-1] - a


def nearest_rank(values, q):
    xs = sorted(values)
    return xs[round(q / 100 * (len(xs) - 1))]


def unsorted_percentile(values, q):
    rank = q / 100 * (len(values) - 1)
    lo, hi = math.floor(rank), math.ceil(rank)
    return values[lo] + (values[hi] - values[lo]) * (rank - lo)


def global_max_utilisation(lens, b):
    return sum(lens) / (len(lens) * max(lens))


def utilisation_full_last_group(lens, b):
    useful = reserved = 0
    for i in range(0, len(lens), b):
        group = lens[i:i + b]
        useful += sum(group)
        reserved += b * max(group)
    return useful / reserved


def overlap_hides_the_longer(host_s, device_s):
    return host_s + device_s, min(host_s, device_s)


def overlap_sums_both_ways(host_s, device_s):
    return host_s + device_s, host_s + device_s


CASES = {
    "static_policy": (static_policy, [static_without_padding, static_without_padding_rows,
                                      static_that_lets_newcomers_join,
                                      static_ignoring_max_batch, continuous_policy]),
    "continuous_policy": (continuous_policy, [preempts_the_next_arrival, skips_ahead, never_preempts, grows_without_asking,
                                              static_policy]),
    "request_metrics": (metrics_reference, [tpot_over_n, latency_from_first_token,
                                            tpot_zero_for_one_token]),
    "percentile": (metrics.percentile, [nearest_rank, unsorted_percentile]),
    "static_slot_utilisation": (formulas.static_slot_utilisation,
                                [global_max_utilisation, utilisation_full_last_group]),
    "overlapped_step_s": (formulas.overlapped_step_s, [overlap_hides_the_longer,
                                                      overlap_sums_both_ways]),
}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab04, CASES, 4,
    lent_as={n: r for n, (r, _) in CASES.items() if n != "request_metrics"})  # that one: a wrapper


test_specific_hints = hints(lab04, CASES, [
    (static_without_padding, "hold each member"),
    (static_without_padding_rows, "step.padding"),
    (static_that_lets_newcomers_join, "join a batch in flight"),
    (preempts_the_next_arrival, "LATEST-arrived"),
    (skips_ahead, "first come, first served"),
    (tpot_over_n, "n - 1 gaps"),
    (nearest_rank, "nearest rank"),
    (global_max_utilisation, "ITS longest"),
    (overlap_hides_the_longer, "not the shorter"),
])
