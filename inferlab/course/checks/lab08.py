"""Checks for Lab 8, "What a token costs, and on which chip".

Oracles that need no solution: the cost formulas of ``inferlab.sim.token_cost``
(``usd_per_million``, ``bandwidth_floor_usd_per_m``, ``window_costs``, ``break_even_price``),
the task pricing of ``inferlab.analysis.agent_cost`` and ``inferlab.analysis.chips``'s
``chips_for_bytes``, each evaluated on cases the check builds itself (prices, model sizes, a
steady-state window, an agent's calls).
"""

from __future__ import annotations

import math

from inferlab.analysis import agent_cost, chips
from inferlab.analysis.prices import TokenPrice
from inferlab.course.checks import CheckFailed, expect_close, lends, run_check
from inferlab.serving.metrics import Percentiles
from inferlab.sim import token_cost
from inferlab.sim.steady_state import Window

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"8.1": 1, "8.2": 1, "8.3": 2, "8.4": 2, "8.5": 2, "8.6": 1}


def _number(got, what: str) -> float:
    try:
        return float(got)
    except (TypeError, ValueError):
        raise CheckFailed(f"{what} returned {got!r}, expected a number.") from None


def usd_per_million(fn):
    """Exercise 8.1: ``usd_per_million(usd_per_hour, tokens_per_s)``: dollars per million tokens."""
    def cases(f):
        for price, rate in [(6.88, 5000.0), (2.70, 120.0), (100.0, 1e6)]:
            expected = token_cost.usd_per_million(price, rate)
            got = _number(f(price, rate), f"usd_per_million({price}, {rate})")
            hint = "dollars per second (the hourly price / 3600) divided by tokens per second, " \
                   "times one million."
            if math.isclose(got, expected * 3600, rel_tol=1e-6):
                hint = "the price is per hour and the rate per second: divide the price by 3600."
            elif math.isclose(got, expected / 1e6, rel_tol=1e-6):
                hint = "that is the price of one token; multiply by a million."
            expect_close(f"usd_per_million({price}, {rate})", got, expected, rel=1e-9,
                         unit=" $/M", hint=hint)
    return run_check("8.1", "usd_per_million", fn, token_cost.usd_per_million, cases,
                     success="an H100 at $6.88/h serving 5,000 tokens/s: $0.38 per million.")


def decode_floor_cost(fn):
    """Exercise 8.2: ``decode_floor_cost(weight_bytes, kv_bytes_per_token, bandwidth, batch,
    context, usd_per_hour)``: dollars per million output tokens at the bandwidth floor."""
    cases_ = [(15.0e9, 131072, 3.35e12, 1, 1125, 6.88), (15.0e9, 131072, 3.35e12, 64, 1125, 6.88),
              (141e9, 327680, 13.4e12, 200, 4000, 27.5), (3e9, 0, 1e12, 8, 100, 1.0)]

    def cases(f):
        for args in cases_:
            w, kv, bw, b, c, price = args
            expected = token_cost.bandwidth_floor_usd_per_m(*args)
            got = _number(f(*args), f"decode_floor_cost{args}")
            hint = ("one step reads the weights once and every sequence's K/V "
                    "(batch x context x kv_bytes_per_token), takes bytes / bandwidth seconds, "
                    "and yields `batch` tokens.")
            if kv and math.isclose(got, token_cost.bandwidth_floor_usd_per_m(w, 0, bw, b, c, price),
                                   rel_tol=1e-6):
                hint = "you left out the K/V reads: each sequence reads its own cache every step."
            elif b > 1 and math.isclose(got, expected * b, rel_tol=1e-6):
                hint = "a step yields `batch` tokens: divide its cost by the batch."
            expect_close(f"decode_floor_cost{args}", got, expected, rel=1e-9, unit=" $/M",
                         hint=hint)
    return run_check("8.2", "decode_floor_cost", fn, token_cost.bandwidth_floor_usd_per_m,
                     cases)


def _window(prefill_s, decode_s, duration, in_tok_s, out_tok_s) -> Window:
    p = Percentiles(1.0, 1.0, 1.0, 1.0)
    return Window(n_requests=1000, window_requests=700, duration_s=duration, offered_req_s=20.0,
                  offered_in_tok_s=in_tok_s, offered_out_tok_s=out_tok_s, achieved_req_s=20.0,
                  achieved_in_tok_s=in_tok_s, achieved_out_tok_s=out_tok_s, ttft=p, tpot=p, gap=p,
                  latency=p, slo_attainment=1.0, goodput_req_s=20.0, mean_batch=50.0,
                  prefill_s=prefill_s, decode_s=decode_s, preemptions=0)


def window_cost(fn):
    """Exercise 8.3: ``window_cost(window, usd_per_hour)``: dollars per million (input, output)
    tokens, the hour split between prefill and decode time."""
    windows = [_window(30.0, 60.0, 100.0, 20000.0, 5000.0),
               _window(10.0, 90.0, 100.0, 4000.0, 8000.0),
               _window(50.0, 50.0, 100.0, 1000.0, 1000.0)]

    def cases(f):
        for w in windows:
            for price in (6.88, 2.0):
                expected = token_cost.window_costs(w, price)
                call = (f"window_cost(window with prefill {w.prefill_s:g} s, decode {w.decode_s:g}"
                        f" s of {w.duration_s:g} s, {w.achieved_in_tok_s:g} in and "
                        f"{w.achieved_out_tok_s:g} out tokens/s, {price})")
                got = f(w, price)
                if not (isinstance(got, (tuple, list)) and len(got) == 2):
                    raise CheckFailed(f"{call} returned {got!r}; expected a pair "
                                      "(dollars per million input, per million output).")
                whole = token_cost.usd_per_million(price, w.achieved_out_tok_s)
                hint = ("share the price by busy time: input gets prefill_s / (prefill_s + "
                        "decode_s) of it, output the rest; divide each share by the tokens/s it "
                        "served.")
                if math.isclose(_number(got[1], call), whole, rel_tol=1e-6):
                    hint = "the whole price went to output tokens: prefill time is paid for too."
                expect_close(call + "[0] (input)", got[0], expected[0], rel=1e-9, hint=hint)
                expect_close(call + "[1] (output)", got[1], expected[1], rel=1e-9, hint=hint)
    return run_check("8.3", "window_cost", fn, token_cost.window_costs, cases)


def break_even_price(fn):
    """Exercise 8.4: ``break_even_price(fast_usd_per_hour, fast_tokens_per_s, slow_tokens_per_s)``."""
    def cases(f):
        for args in [(6.88, 7000.0, 3000.0), (8.60, 10000.0, 9000.0), (1.0, 50.0, 5.0)]:
            expected = token_cost.break_even_price(*args)
            got = _number(f(*args), f"break_even_price{args}")
            hint = "equal cost per token: price_slow / tokens_slow = price_fast / tokens_fast."
            if math.isclose(got, args[0] * args[1] / args[2], rel_tol=1e-6):
                hint = "the ratio is upside down: the slower device must be cheaper."
            expect_close(f"break_even_price{args}", got, expected, rel=1e-9, unit=" $/h",
                         hint=hint)
    return run_check("8.4", "break_even_price", fn, token_cost.break_even_price, cases)


_PRICE = TokenPrice("test", "model", 3.0, 0.3, 3.75, 15.0, "2025-01-01", "check", "secondary")
_FREE_WRITES = TokenPrice("test", "model", 2.5, 1.25, 2.5, 10.0, "2024-10-01", "check",
                          "secondary")


def task_usd(fn):
    """Exercise 8.5: ``task_usd(calls, price)``: dollars for an agent's calls with the prefix
    cache (cached input at the cached rate, the rest at the cache-write rate, output at its own)."""
    tasks = [agent_cost.agent_calls(5, 1000, 200, 100),
             agent_cost.agent_calls(12, 3000, 800, 400, seed=1),
             [agent_cost.Call(100, 0, 10)]]

    def reference(calls, price):
        return agent_cost.task_cost(calls, price).usd

    def cases(f):
        for calls in tasks:
            for price in (_PRICE, _FREE_WRITES):
                expected = reference(calls, price)
                call = (f"task_usd({len(calls)} calls of {calls[0].prompt} to {calls[-1].prompt} "
                        f"prompt tokens, a price of ${price.usd_per_m_input}/M in, "
                        f"${price.usd_per_m_cached_input}/M cached, ${price.usd_per_m_cache_write}"
                        f"/M written, ${price.usd_per_m_output}/M out)")
                got = _number(f(calls, price), call)
                hint = ("for each call: cached tokens x cached rate + (prompt - cached) x "
                        "cache-write rate + output x output rate, all per million.")
                if math.isclose(got, agent_cost.task_cost(calls, price).usd_uncached,
                                rel_tol=1e-6) and got != expected:
                    hint = "you priced every input token in full: cached ones cost the cached rate."
                expect_close(call, got, expected, rel=1e-9, unit=" $", hint=hint)
    return run_check("8.5", "task_usd", fn, lends(reference, agent_cost.task_cost), cases)


def chips_needed(fn):
    """Exercise 8.6: ``chips_needed(weight_bytes, kv_bytes, chip_bytes)``: chips that hold it all."""
    def cases(f):
        for args in [(141.1e9, 0.0, 0.22e9), (141.1e9, 32.8e9, 80e9), (16e9, 4e9, 44e9),
                     (80e9, 0.0, 80e9)]:
            expected = chips.chips_for_bytes(*args)
            got = f(*args)
            hint = "the chips' capacity together must hold weights and K/V: round up."
            if isinstance(got, (int, float)) and got == math.floor((args[0] + args[1]) / args[2]) \
                    and got != expected:
                hint = "rounded down: a part of the model would have no chip."
            elif args[1] and got == chips.chips_for_bytes(args[0], 0.0, args[2]) != expected:
                hint = "the K/V cache needs room too."
            if got != expected or isinstance(got, bool):
                raise CheckFailed(f"chips_needed{args} returned {got!r}, expected {expected}."
                                  f"\n  Hint: {hint}")
    return run_check("8.6", "chips_needed", fn, chips.chips_for_bytes, cases,
                     success="a 70B model in 16-bit needs over 600 Groq chips to sit in SRAM.")
