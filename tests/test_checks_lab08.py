"""Every Lab 8 check passes a correct answer, lends the reference to an unattempted one, and
fails a planted bug with a message that names the call, the expected value and a hint."""

import math

import pytest

from check_contract import contract, stub
from inferlab.analysis import agent_cost, chips
from inferlab.course.checks import CheckFailed, lab08
from inferlab.sim import token_cost


def busy_split(w, price, wrong=None):
    busy = w.prefill_s + w.decode_s
    return (price / 3600 * w.prefill_s / busy / w.achieved_in_tok_s * 1e6,
            price / 3600 * w.decode_s / busy / w.achieved_out_tok_s * 1e6)


def task(calls, price, cached_rate=True, write_rate=True, output=True):
    usd = 0.0
    for c in calls:
        usd += c.cached * (price.usd_per_m_cached_input if cached_rate else price.usd_per_m_input)
        usd += c.uncached * (price.usd_per_m_cache_write if write_rate else price.usd_per_m_input)
        usd += c.output * price.usd_per_m_output if output else 0.0
    return usd / 1e6


CASES = {
    "usd_per_million": (lambda p, r: p / 3600 / r * 1e6, [
        lambda p, r: p / r * 1e6,            # per hour taken as per second
        lambda p, r: p / 3600 / r,           # one token, not a million
        lambda p, r: r / p]),
    "decode_floor_cost": (lambda w, kv, bw, b, c, p: p / 3600 * (w + b * c * kv) / bw / b * 1e6, [
        lambda w, kv, bw, b, c, p: p / 3600 * w / bw / b * 1e6,               # no K/V reads
        lambda w, kv, bw, b, c, p: p / 3600 * (w + b * c * kv) / bw * 1e6,    # not per token
        lambda w, kv, bw, b, c, p: p / 3600 * b * (w + c * kv) / bw / b * 1e6,  # weights per row
    ]),
    "window_cost": (busy_split, [
        lambda w, p: (0.0, p / 3600 / w.achieved_out_tok_s * 1e6),   # all to output
        lambda w, p: (p / 3600 * w.prefill_s / w.duration_s / w.achieved_in_tok_s * 1e6,
                      p / 3600 * w.decode_s / w.duration_s / w.achieved_out_tok_s * 1e6),  # idle free
        lambda w, p: busy_split(w, p)[::-1]]),
    "break_even_price": (lambda p, f, s: p * s / f, [lambda p, f, s: p * f / s,
                                                       lambda p, f, s: p]),
    "task_usd": (task, [
        lambda calls, price: task(calls, price, cached_rate=False),
        lambda calls, price: task(calls, price, write_rate=False),
        lambda calls, price: task(calls, price, output=False)]),
    "chips_needed": (lambda w, kv, s: math.ceil((w + kv) / s), [
        lambda w, kv, s: math.floor((w + kv) / s),
        lambda w, kv, s: math.ceil(w / s),
        lambda w, kv, s: (w + kv) / s]),
}

REFERENCES = {"usd_per_million": token_cost.usd_per_million,
              "decode_floor_cost": token_cost.bandwidth_floor_usd_per_m,
              "window_cost": token_cost.window_costs,
              "break_even_price": token_cost.break_even_price,
              "chips_needed": chips.chips_for_bytes}


(test_correct_answer_passes_and_is_returned, test_unattempted_exercise_gets_the_reference,
 test_planted_bug_fails_with_an_actionable_message,
 test_planted_bug_in_a_notebook_reports_and_lends_the_reference) = contract(
    lab08, CASES, 8, words=("returned", "expected", "Hint:"), lent_as=REFERENCES)


def test_the_lent_task_cost_names_agent_cost():
    assert agent_cost.task_cost in lab08.task_usd(stub).same_as  # a wrapper, lent by name


def test_specific_hints():
    with pytest.raises(CheckFailed, match="divide the price by 3600"):
        lab08.usd_per_million(CASES["usd_per_million"][1][0])
    with pytest.raises(CheckFailed, match="left out the K/V"):
        lab08.decode_floor_cost(CASES["decode_floor_cost"][1][0])
    with pytest.raises(CheckFailed, match="whole price went to output"):
        lab08.window_cost(CASES["window_cost"][1][0])
    with pytest.raises(CheckFailed, match="upside down"):
        lab08.break_even_price(CASES["break_even_price"][1][0])
    with pytest.raises(CheckFailed, match="priced every input token in full"):
        lab08.task_usd(lambda calls, price: agent_cost.task_cost(calls, price).usd_uncached)
    with pytest.raises(CheckFailed, match="rounded down"):
        lab08.chips_needed(CASES["chips_needed"][1][0])
