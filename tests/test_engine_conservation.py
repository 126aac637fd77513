"""The engine conserves work: every forward's tokens, counted through the runner, are exactly the
prompt tokens once plus one row per fed-back output token, and the recomputes that preemption
forces, which the run reports (``Run.num_preemptions``, ``Run.recomputed_tokens``).

A request that generates ``n`` tokens from a ``p``-token prompt feeds ``p + n - 1`` tokens
through the model (``longest_tokens``: the last token is returned, never fed back), less what
arrived with its K/V already (a disaggregated decode instance receives requests so). A
preemption throws away the K/V a sequence held; those tokens are computed again, and only those.
Padding rows (static batching's finished members) are computed too; they are counted apart.
"""

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.request import Sequence, longest_tokens
from inferlab.serving.scheduler import Scheduler, make_static_policy

from conftest import alone, random_requests, tiny_model


class Counting:
    """Wraps a runner; counts the tokens every forward pass computes, padding rows apart."""

    def __init__(self, runner):
        self.runner, self.computed, self.padding, self.forwards = runner, 0, 0, 0

    def forward(self, rows):
        self.forwards += 1
        for row in rows:
            if not row.prefill and not row.emits:  # a finished member's padding row
                self.padding += row.new
            else:
                self.computed += row.new
        return self.runner.forward(rows)


class Stand_in:
    """A model stand-in on a virtual clock: a token that says how far along its sequence is."""

    def __init__(self, clock: VirtualClock):
        self.clock = clock

    def forward(self, rows):
        self.clock.advance(1e-3)
        return [len(r.seq.output) + 1 for r in rows]


def fed_back(seqs, arrived: dict[int, int]) -> int:
    """Tokens the sequences feed through the model, at least: prompt and all outputs but the
    last, less what arrived with its K/V (``arrived``, by sequence id)."""
    return sum(longest_tokens(len(s.prompt), len(s.output)) - arrived[s.seq_id] for s in seqs)


@st.composite
def setups(draw):
    policy = draw(st.sampled_from(["continuous", "chunked", "static"]))
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_batch = draw(st.integers(1, 6))
    budget = draw(st.integers(max_batch, 4 * max_batch + 8)) if policy == "chunked" else None
    return policy, block_size, max_batch, budget


@given(st.data(), setups())
@settings(max_examples=150, deadline=None)
def test_every_forward_computes_each_token_once_but_for_counted_recomputes(data, setup):
    policy, block_size, max_batch, budget = setup
    requests = random_requests(data, max_prompt=40, max_new=20, n=(1, 12))
    longest = max(longest_tokens(len(r.prompt), r.max_new_tokens) for r in requests)
    need = -(-longest // block_size)
    num_blocks = data.draw(st.integers(need, 3 * need), label="num_blocks")  # tight memory
    config = ServingConfig(block_size=block_size, num_blocks=num_blocks, max_batch=max_batch,
                           token_budget=budget,
                           policy=make_static_policy() if policy == "static" else policy)
    sched, clock = Scheduler(config, check=True), VirtualClock()
    runner = Counting(Stand_in(clock))
    loop = StepLoop(sched, runner, clock)
    seqs, arrived = [], {}
    for i, r in enumerate(requests):  # some arrive with tokens generated and K/V computed
        carried = data.draw(st.integers(0, min(3, r.max_new_tokens - 1)), label="carried")
        arrived[i] = longest_tokens(len(r.prompt), carried) if carried else 0  # all but newest
        seqs.append(Sequence(i, r, output=list(range(1, carried + 1)), num_computed=arrived[i]))
        loop.submit(seqs[-1])
    finished = []
    while not loop.done:
        finished += loop.step()
    event(f"{policy}: preempted" if sched.num_preemptions else f"{policy}: no preemption")
    event("some arrived with their cache" if any(arrived.values()) else "all fresh")
    assert sorted(s.seq_id for s in finished) == list(range(len(requests)))
    assert all(s.output == list(range(1, s.max_new_tokens + 1)) for s in finished)
    assert runner.computed == fed_back(seqs, arrived) + sched.recomputed_tokens
    assert (sched.recomputed_tokens > 0) == (sched.num_preemptions > 0)
    if policy == "static":
        assert sched.num_preemptions == 0, "static batching reserves its blocks"
    else:
        assert runner.padding == 0


@given(st.data(), st.sampled_from([2, 4]), st.integers(1, 4),
       st.sampled_from(["continuous", "chunked"]))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_model_s_runner_computes_what_the_run_reports(data, block_size, max_batch, policy):
    requests = random_requests(data, max_prompt=20, max_new=12, n=(1, 6))
    longest = max(longest_tokens(len(r.prompt), r.max_new_tokens) for r in requests)
    need = -(-longest // block_size)
    num_blocks = data.draw(st.integers(need, 2 * need), label="num_blocks")
    budget = max_batch + data.draw(st.integers(0, 16), label="budget")
    engine = Engine(tiny_model(256), ServingConfig(
        block_size=block_size, num_blocks=num_blocks, max_batch=max_batch,
        policy=policy, token_budget=budget if policy == "chunked" else None))
    engine.runner = counting = Counting(engine.runner)
    run = engine.run(requests)
    event("preempted" if run.num_preemptions else "no preemption")
    for request, result in zip(requests, run.results):
        assert result.tokens == alone(request.prompt, request.max_new_tokens)
    fed = sum(longest_tokens(len(r.prompt), r.max_new_tokens) for r in requests)
    assert counting.computed == fed + run.recomputed_tokens
    assert run.num_preemptions == sum(r.num_preemptions for r in run.results)
    logged = sum(row.new for it in run.iterations for row in it.rows)
    assert logged == counting.computed  # the iteration log counts what the runner ran


def test_a_preemption_recomputes_exactly_the_tokens_it_threw_away():
    # two requests in 4 blocks of 2 tokens: the later one is preempted once it cannot grow
    from inferlab.serving.request import Request

    requests = [Request((1, 2, 3), 4, 0.0), Request((4, 5, 6), 4, 0.001)]
    config = ServingConfig(block_size=2, num_blocks=4, max_batch=2)
    sched, clock = Scheduler(config), VirtualClock()
    runner = Counting(Stand_in(clock))
    loop = StepLoop(sched, runner, clock)
    thrown = []
    real = sched.preempt
    sched.preempt = lambda seq: (thrown.append(seq.num_computed), real(seq))
    run = loop.run(requests)
    assert run.num_preemptions == len(thrown) >= 1
    assert run.recomputed_tokens == sum(thrown) > 0
    assert runner.computed == 2 * longest_tokens(3, 4) + sum(thrown)


@pytest.mark.parametrize("carried", [1, 3])
def test_a_sequence_that_arrives_with_its_cache_is_not_prefilled_again(carried):
    config = ServingConfig(block_size=4, num_blocks=64, max_batch=4)
    from inferlab.serving.request import Request

    sched, clock = Scheduler(config), VirtualClock()
    runner = Counting(Stand_in(clock))
    loop = StepLoop(sched, runner, clock)
    prompt = tuple(range(1, 101))
    loop.submit(Sequence(0, Request(prompt, 8), output=list(range(1, carried + 1)),
                         num_computed=len(prompt) + carried - 1))
    while not loop.done:
        loop.step()
    assert runner.computed == 8 - carried  # one decode row per token still to come
