"""The scheduler under random traces and memory pressure (hypothesis), and its rules one by one.

The properties the course promises: no request lost or duplicated; every output identical to
generating that request alone (greedy), also after preemption; no block leaked when all finish;
preemption takes the latest-arrived running request first (Kwon et al. 2023, Sec. 4.5).
"""


import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferlab.serving.paged_cache import OutOfBlocksError
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.request import Request, Sequence, Status
from inferlab.serving.scheduler import (Scheduler, SchedulingError, Step, continuous_policy,
    make_static_policy, static_policy)

from conftest import alone, random_requests, run_loop, sequence, tiny_model


def scheduler(num_blocks, block_size=16, max_batch=32, policy=continuous_policy,
              max_prefill_tokens=None):
    return Scheduler(ServingConfig(block_size=block_size, num_blocks=num_blocks,
                                   max_batch=max_batch, policy=policy,
                                   max_prefill_tokens=max_prefill_tokens), check=True)


# -- a model small enough for many examples; float64 so that batching never flips an argmax --
def model():
    return tiny_model(256)


# -- scheduler-only runs: a runner that checks the invariants at every step -----------------
class CheckingRunner:
    """Stands in for the model; asserts block accounting and the preemption rule each step."""

    def __init__(self, sched: Scheduler, clock: VirtualClock):
        self.sched, self.clock, self.steps = sched, clock, 0

    def _check(self):
        held = [b for s in self.sched.running for b in s.table.blocks]
        assert len(held) == len(set(held)), "a block is owned twice"
        assert len(held) + self.sched.memory.num_free == self.sched.memory.num_blocks
        assert all(s.status is Status.WAITING and s.table is None for s in self.sched.waiting)
        assert not {id(s) for s in self.sched.waiting} & {id(s) for s in self.sched.running}
        assert len(self.sched.running) <= self.sched.max_batch

    def forward(self, rows):
        self._check()
        self.steps += not any(r.prefill for r in rows)  # decode batches
        self.clock.advance(1e-3)
        return [len(r.seq.output) + 1 for r in rows]  # a token that says how far along it is


@st.composite
def pressure_setup(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    max_batch = draw(st.integers(1, 8))
    return block_size, max_batch


@given(st.data(), pressure_setup(), st.sampled_from(["continuous", "static", "dynamic"]))
@settings(max_examples=150, deadline=None)
def test_scheduler_invariants_under_random_traces(data, setup, policy_name):
    block_size, max_batch = setup
    requests = random_requests(data, max_prompt=40, max_new=40, n=(1, 16))
    longest = max(len(r.prompt) + r.max_new_tokens - 1 for r in requests)
    need = -(-longest // block_size)
    num_blocks = data.draw(st.integers(need, 3 * need), label="num_blocks")  # tight memory
    policy = {"continuous": continuous_policy, "static": static_policy,
              "dynamic": make_static_policy(max_wait_s=0.005)}[policy_name]
    sched = scheduler(num_blocks, block_size, max_batch, policy)
    preemptions = []
    original = sched.preempt

    def preempt(seq):  # record that the victim is the latest arrival among the running
        assert seq is max(sched.running, key=lambda s: s.order)
        preemptions.append(seq.seq_id)
        original(seq)

    sched.preempt = preempt
    clock = VirtualClock()
    loop = StepLoop(sched, CheckingRunner(sched, clock), clock)
    finished = run_loop(loop, requests)
    event(f"{policy_name}: preempted" if preemptions else f"{policy_name}: no preemption")
    # nothing lost, nothing duplicated, every output complete and in order
    assert sorted(s.seq_id for s in finished) == list(range(len(requests)))
    for seq in finished:
        assert seq.status is Status.FINISHED and seq.table is None
        assert seq.output == list(range(1, seq.max_new_tokens + 1))
        assert len(seq.token_times) == seq.max_new_tokens
    assert sched.memory.num_free == num_blocks, "blocks leaked"
    assert not sched.waiting and not sched.running
    if policy_name != "continuous":
        assert not preemptions, "static batching reserves its blocks and never preempts"


# -- engine runs: outputs equal generating alone, also after preemption ---------------------
@given(st.data(), st.sampled_from([2, 4]), st.integers(2, 6), st.sampled_from(["continuous", "static"]))
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_output_equals_generating_it_alone(data, block_size, max_batch, policy):
    requests = random_requests(data, max_prompt=20, max_new=16, n=(1, 8))
    longest = max(len(r.prompt) + r.max_new_tokens - 1 for r in requests)
    need = -(-longest // block_size)
    num_blocks = data.draw(st.integers(need, 2 * need), label="num_blocks")
    engine = Engine(model(), ServingConfig(block_size=block_size, num_blocks=num_blocks,
                                           max_batch=max_batch, policy=policy))
    run = engine.run(requests)
    results = run.results
    event(f"{policy}: preempted" if run.num_preemptions else f"{policy}: no preemption")
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    for request, result in zip(requests, results):
        assert result.ok, result.error
        assert result.tokens == alone(request.prompt, request.max_new_tokens)
        assert result.timing.n_tokens == request.max_new_tokens
        assert result.timing.token_times_s[0] >= request.arrival_s
    assert engine.cache.memory.num_free == num_blocks


def test_preemption_by_recompute_happens_and_keeps_outputs_exact():
    # Six long requests at once in 10 blocks of 4 tokens: they cannot all grow, so the
    # scheduler must preempt, and each preempted request is recomputed from prompt + output.
    gen = torch.Generator().manual_seed(1)
    requests = [Request(tuple(torch.randint(0, 512, (6,), generator=gen).tolist()), 20, 0.0)
                for _ in range(6)]
    engine = Engine(model(), ServingConfig(num_blocks=10, block_size=4, max_batch=6))
    run = engine.run(requests)
    results = run.results
    assert run.num_preemptions > 0
    assert any(r.num_preemptions for r in results)
    assert results[0].num_preemptions == 0  # the oldest is never the victim while others run
    for request, result in zip(requests, results):
        assert result.tokens == alone(request.prompt, request.max_new_tokens)
    victims = [v for it in run.iterations for v in it.preempted]
    assert victims and all(v != 0 for v in victims)


# -- the rules, one by one -------------------------------------------------------------------
def seq(i, prompt_len, new, arrival=0.0):
    return sequence(i, range(1, prompt_len + 1), new, arrival)


def test_latest_arrival_is_preempted_first():
    sched = scheduler(3, block_size=2, max_batch=4)
    a, b, c = seq(0, 2, 5, 0.0), seq(1, 2, 5, 1.0), seq(2, 2, 5, 2.0)
    for s in (c, a, b):  # added out of order: the queue sorts by arrival
        sched.add(s)
    assert sched.waiting == [a, b, c]
    step = sched.schedule()
    assert step.prefills == [a, b, c] and sched.memory.num_free == 0
    sched.update(step, [7, 7, 7])
    step = sched.schedule()  # every sequence needs a third slot: a new block each
    assert step.preempted == [c, b] and step.decodes == [a]
    assert sched.waiting == [b, c] and b.table is None and b.num_preemptions == 1
    assert step.prefills == [], "no admission in a step that had to preempt"


def test_fcfs_admission_does_not_skip_a_request_that_does_not_fit():
    sched = scheduler(4, block_size=4, max_batch=8)
    big, small = seq(0, 12, 2, 0.0), seq(1, 1, 2, 1.0)
    running = seq(2, 4, 8, -1.0)
    for s in (running, big, small):
        sched.add(s)
    sched.admit(running)
    running.output.append(1)  # its decode this step needs a 5th slot: a second block
    step = sched.schedule()
    assert step.decodes == [running] and sched.memory.num_free == 2
    # the big prompt needs 3 blocks and waits; the small one would fit but may not jump the queue
    assert step.prefills == [] and small.status is Status.WAITING


def test_max_batch_and_prefill_budget():
    sched = scheduler(100, block_size=4, max_batch=2, max_prefill_tokens=10)
    for i in range(4):
        sched.add(seq(i, 8, 3, float(i)))
    step = sched.schedule()
    assert len(step.prefills) == 1  # a second 8-token prompt would exceed the 10-token budget
    sched.update(step, [1])
    step = sched.schedule()
    assert len(step.prefills) == 1 and len(sched.running) == 2  # the batch is full now
    sched.update(step, [1, 1])
    assert not sched.schedule().prefills


def test_static_batch_admits_nobody_until_it_is_done_and_pads_finished_rows():
    sched = scheduler(100, block_size=4, max_batch=2, policy=static_policy)
    short, long_, late = seq(0, 3, 1), seq(1, 3, 4), seq(2, 3, 1, 0.5)
    sched.add(short), sched.add(long_)
    step = sched.schedule()
    assert step.prefills == [short, long_]
    sched.update(step, [5, 5])
    assert short.status is Status.RUNNING, "a finished member holds its row (padding)"
    sched.add(late)
    for _ in range(3):
        step = sched.schedule()
        assert step.decodes == [long_] and step.padding == [short] and not step.prefills
        sched.update(step, [5])
    step = sched.schedule()  # the batch is over: it leaves as a whole, the late one starts
    assert step.prefills == [late] and short.status is Status.FINISHED
    assert long_.status is Status.FINISHED


def test_dynamic_batching_waits_for_its_window():
    policy = make_static_policy(max_wait_s=0.5)
    sched = scheduler(100, block_size=4, max_batch=3, policy=policy)
    sched.add(seq(0, 3, 2, 0.0))
    step = sched.schedule(now=0.1)
    assert step.is_empty and step.wake_at_s == pytest.approx(0.5)
    assert sched.schedule(now=0.5).prefills  # the window closed: go with what is there


def test_a_request_that_can_never_fit_is_refused():
    sched = scheduler(2, block_size=4)
    with pytest.raises(ValueError, match="could never finish"):
        sched.add(seq(0, 8, 2))


def test_policies_that_break_the_rules_are_stopped():
    def runs_a_waiting_sequence(sched, now):
        return Step(decodes=list(sched.waiting))

    def forgets_a_running_sequence(sched, now):
        step = continuous_policy(sched, now)
        if step.decodes:
            step.decodes.pop()
        return step

    def no_slot(sched, now):
        step = Step()
        for s in list(sched.running):
            step.decodes.append(s)  # forgot append_slot
        for s in list(sched.waiting):
            sched.admit(s)
            step.prefills.append(s)
        return step

    for policy, message in [(runs_a_waiting_sequence, "not running"),
                            (forgets_a_running_sequence, "got no token"),
                            (no_slot, "block table holds")]:
        sched = scheduler(20, block_size=4, max_batch=4, policy=policy)
        sched.add(seq(0, 3, 4))
        sched.add(seq(1, 3, 4, 0.1))
        with pytest.raises(SchedulingError, match=message):
            step = sched.schedule()
            sched.update(step, [1] * len(step.scheduled))
            sched.schedule()


def test_padding_rows_are_finished_members_the_step_does_not_compute_otherwise():
    def pads_a_live_sequence(sched, now):
        step = continuous_policy(sched, now)
        if len(step.decodes) > 1:
            step.padding = [step.decodes.pop()]
        return step

    def pads_a_decode(sched, now):  # also decodes what it pads: scheduled twice
        step = static_policy(sched, now)
        step.padding += step.decodes
        return step

    def pads_without_decodes(sched, now):
        step = static_policy(sched, now)
        if step.decodes:
            step.decodes.clear()
        return step

    for policy, message in [(pads_a_live_sequence, "not done"),
                            (pads_a_decode, "scheduled twice"),
                            (pads_without_decodes, "ride along with a decode batch")]:
        sched = scheduler(20, block_size=4, max_batch=4, policy=policy)
        for i, new in enumerate((1, 4, 4)):
            sched.add(seq(i, 3, new))
        with pytest.raises(SchedulingError, match=message):
            for _ in range(3):
                step = sched.schedule()
                sched.update(step, [1] * len(step.scheduled))


def test_actions_refuse_wrong_states():
    sched = scheduler(1, block_size=4)
    a, b = seq(0, 4, 1), seq(1, 4, 1)
    sched.add(a), sched.add(b)
    sched.admit(a)
    with pytest.raises(SchedulingError):
        sched.admit(a)
    with pytest.raises(OutOfBlocksError):
        sched.admit(b)
    assert b.status is Status.WAITING and b.table is None and b in sched.waiting
    with pytest.raises(SchedulingError):
        sched.preempt(b)
    with pytest.raises(SchedulingError):
        sched.retire(a)  # not finished yet
    with pytest.raises(ValueError):
        scheduler(1, max_batch=0)


def test_a_sequence_is_done_at_an_end_of_sequence_token():
    sched = scheduler(10, block_size=4)
    s = Sequence(0, Request((1, 2, 3), 10, eos_token_ids=(7, 8)))
    sched.add(s)
    step = sched.schedule()
    assert sched.update(step, [5]) == [] and s.status is Status.RUNNING
    step = sched.schedule()
    assert sched.update(step, [8]) == [s]  # a stop token, long before max_new_tokens
    assert s.status is Status.FINISHED and s.finish_reason == "stop" and s.output == [5, 8]
    assert sched.memory.num_free == 10


def test_the_scheduler_admits_through_a_contiguous_reservation():
    from inferlab.serving.reservation import ContiguousManager

    memory = ContiguousManager(100, "exact", max_len=64)
    sched = Scheduler(ServingConfig(max_batch=8), memory)
    a, b, c = seq(0, 10, 31), seq(1, 20, 31), seq(2, 30, 31)  # regions of 40, 50 and 60 slots
    for s in (a, b, c):
        sched.add(s)
    step = sched.schedule()
    assert step.prefills == [a, b] and memory.num_free == 10  # c's 60 slots do not fit
    assert (a.table.slots_held, b.table.slots_held) == (40, 50)
    with pytest.raises(ValueError, match="never finish"):
        sched.add(seq(3, 60, 10))  # 69 tokens at its longest, beyond max_len


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
def test_a_sequence_that_arrives_with_its_cache_computes_only_its_newest_token(policy):
    # A disaggregated decode instance receives a request whose prompt's K/V were computed and
    # sent by a prefill instance, with the first token sampled there: admission gives it blocks
    # for every token and keeps what it brought, so its first step here is one decode row.
    sched = Scheduler(ServingConfig(block_size=16, num_blocks=64, max_batch=8, policy=policy,
                                    token_budget=64 if policy == "chunked" else None))
    arrived = sequence(0, range(1, 301), 8, output=[7], num_computed=300)
    fresh = sequence(1, range(1, 21), 4)
    for seq in (arrived, fresh):
        sched.add(seq)
    step = sched.schedule()
    assert arrived.table.num_tokens == 301 and arrived.num_computed == 300
    assert step.new_tokens(arrived) == 1 and step.new_tokens(fresh) == 20
    sched.update(step, [5, 6])
    assert arrived.num_computed == 301 and arrived.output == [7, 5]
    # a preempted one loses what it held and is recomputed from its first token (counted)
    sched.preempt(arrived)
    assert arrived.num_computed == 0 and arrived.num_preemptions == 1
    with pytest.raises(SchedulingError, match="newest one is left"):
        sched.add(sequence(2, (1, 2, 3), 4, output=[9], num_computed=4))
