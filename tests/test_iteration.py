"""One ``Iteration`` shape for every policy: forwards of rows (new tokens, cached tokens, prompt
work or a decode) and each forward's seconds. A chunked run's time then splits between prompt
and output tokens exactly as a run of whole prompts does."""

from __future__ import annotations

import pytest

from inferlab.serving.config import ServingConfig
from inferlab.serving.request import Request
from inferlab.sim.simulator import simulate

A = 1e-3  # seconds per token through the model, whatever its phase


class PerToken:
    """Every forward costs A per token it runs: a prompt token and a decode row alike."""

    def prefill_s(self, n_tokens):
        return A * n_tokens

    def decode_s(self, batch, context_tokens):
        return A * batch

    def step_s(self, chunks, batch, context_tokens):
        return A * (sum(n for n, _ in chunks) + batch)


REQUESTS = [Request((7,) * (5 + 9 * i % 26), 3 + i % 4, 0.002 * i, i) for i in range(9)]
CONFIGS = {"whole prompts": ServingConfig(num_blocks=200, block_size=4, max_batch=4),
           "chunked, budget 8": ServingConfig(num_blocks=200, block_size=4, max_batch=4,
                                              token_budget=8)}


@pytest.mark.parametrize("name", CONFIGS)
def test_each_forward_s_time_splits_by_the_phase_of_its_tokens(name):
    run = simulate(REQUESTS, PerToken(), CONFIGS[name])
    assert run.num_preemptions == 0 and all(r.ok for r in run.results)
    forwards = [f for it in run.iterations for f in it.forwards]
    prefill_s = sum(f.prefill_share * f.seconds for f in forwards)
    decode_s = sum((1 - f.prefill_share) * f.seconds for f in forwards)
    input_tokens = sum(len(r.prompt) for r in REQUESTS)
    # the first output token comes from the prompt's forward; the others from decode rows
    output_rows = sum(r.max_new_tokens - 1 for r in REQUESTS)
    assert prefill_s / input_tokens == pytest.approx(A, rel=1e-12)  # cost per input token
    assert decode_s / output_rows == pytest.approx(A, rel=1e-12)
    rows = [row for f in forwards for row in f.rows]
    for i, r in enumerate(REQUESTS):  # every prompt token and every decode row is logged once
        assert sum(x.new for x in rows if x.seq_id == i and x.prefill) == len(r.prompt)
        assert sum(1 for x in rows if x.seq_id == i and not x.prefill) == r.max_new_tokens - 1
    if CONFIGS[name].token_budget:
        assert all(len(it.forwards) == 1 for it in run.iterations)  # one forward a step
        assert any(x.prefill and x.cached > 0 for x in rows)  # a prompt was split
        assert all(sum(x.new for x in f.rows) <= 8 for f in forwards)
    else:
        assert all(len(f.rows) == 1 for f in forwards if f.rows[0].prefill)  # a prompt alone
