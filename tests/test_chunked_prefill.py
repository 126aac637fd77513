"""Chunked prefill (a token budget per step, Sarathi-Serve) and the packed forward it runs.

The properties: every output is identical to unchunked serving and to generating the request
alone, also under memory pressure and preemption; no step runs more tokens than the budget;
decodes never wait for a prompt; no block leaks. And the pieces: packed (ragged) attention
against contiguous attention, the cost of a chunked step in both cost models, the fit to a
chunked run's log.
"""


import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from inferlab.analysis.hardware import get_device_spec
from inferlab.model.config import ModelConfig
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine, serve
from inferlab.serving.loop import StepLoop, VirtualClock
from inferlab.serving.paged_attention import prepare
from inferlab.serving.paged_cache import BlockManager, PagedKVCache
from inferlab.serving.request import Request, Sequence, Status
from inferlab.serving.scheduler import Scheduler, SchedulingError, Step, chunked_policy
from inferlab.analysis.step_time import StepModel
from inferlab.sim.simulator import FittedCosts, chunk_pairs, simulate

from conftest import alone, random_requests, run_loop, sequence, tiny_model


def model():  # float64, so that batching and chunking never flip a greedy choice
    return tiny_model(256)


# -- the engine: chunked outputs equal unchunked ones, preemption included ----------------------
@given(st.data(), st.sampled_from([2, 4, 8]), st.integers(1, 4))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_chunked_outputs_equal_unchunked_and_generating_alone(data, block_size, max_batch):
    requests = random_requests(data, max_prompt=40, max_new=12, n=(1, 7))
    longest = max(len(r.prompt) + r.max_new_tokens - 1 for r in requests)
    need = -(-longest // block_size)
    num_blocks = data.draw(st.integers(need, 2 * need), label="num_blocks")  # tight: preemption
    budget = data.draw(st.integers(max_batch, max_batch + 24), label="token_budget")
    base = ServingConfig(block_size=block_size, num_blocks=num_blocks, max_batch=max_batch)
    chunked = base.replace(policy="chunked", token_budget=budget)
    engine = Engine(model(), chunked)
    run = engine.run(requests)
    plain = Engine(model(), base).run(requests)
    event("preempted" if run.num_preemptions else "no preemption")
    continued = any(c > 0 for it in run.iterations for _, _, c, _ in it.prefill_rows)
    event("a prompt spanned several steps" if continued else "no prompt was split")
    for request, chunked_result, plain_result in zip(requests, run.results, plain.results):
        assert chunked_result.ok, chunked_result.error
        assert chunked_result.tokens == plain_result.tokens
        assert chunked_result.tokens == alone(request.prompt, request.max_new_tokens)
        assert chunked_result.timing.n_tokens == request.max_new_tokens
    assert engine.cache.memory.num_free == num_blocks
    for it in run.iterations:
        assert len(it.decode_ids) + sum(n for _, n, _, _ in it.prefill_rows) <= budget


def test_a_long_prompt_is_split_and_its_first_token_comes_with_its_last_chunk():
    prompt = tuple(range(1, 101))
    short = Request((5, 6, 7), 30, 0.0, "short")
    long_ = Request(prompt, 3, 0.0005, "long")
    config = ServingConfig(block_size=8, max_batch=4, policy="chunked", token_budget=24)
    run = serve(model(), [short, long_], config)
    chunks = [(n, c) for it in run.iterations for sid, n, c, _ in it.prefill_rows if sid == 1]
    assert sum(n for n, _ in chunks) == len(prompt) and len(chunks) >= 5
    assert [c for _, c in chunks] == [sum(n for n, _ in chunks[:i]) for i in range(len(chunks))]
    # every step that carried a chunk of the long prompt also decoded the short request
    steps = [it for it in run.iterations if any(sid == 1 for sid, _, _, _ in it.prefill_rows)]
    assert all(0 in it.decode_ids for it in steps[1:])
    assert run.results[1].tokens == alone(prompt, 3)
    assert run.results[1].timing.token_times_s[0] >= steps[-1].start_s


# -- the scheduler alone: budget, decodes first, no leaks ---------------------------------------
class ChunkRunner:
    """Stands in for the model in a chunked run; checks every step's shape."""

    def __init__(self, sched: Scheduler, clock: VirtualClock):
        self.sched, self.clock = sched, clock

    def forward(self, rows):
        d = next((i for i, r in enumerate(rows) if r.prefill), len(rows))
        decodes, chunks = [r.seq for r in rows[:d]], rows[d:]  # the loop puts decodes first
        sched = self.sched
        assert len(decodes) + sum(r.new for r in chunks) <= sched.token_budget
        decoding = [s for s in sched.running if not sched.is_prefilling(s) or s in decodes]
        assert {id(s) for s in decoding} >= {id(s) for s in decodes}
        for seq, n, *_ in chunks:
            assert 0 < n <= seq.num_uncomputed and seq.table.num_tokens == seq.num_tokens
        held = [b for s in sched.running for b in s.table.blocks]
        assert len(held) == len(set(held)) and len(held) + sched.memory.num_free == \
            sched.memory.num_blocks
        self.clock.advance(1e-3)
        return [len(r.seq.output) + 1 for r in rows]


@given(st.data(), st.sampled_from([1, 2, 4]), st.integers(1, 6))
@settings(max_examples=150, deadline=None)
def test_chunked_scheduler_invariants_under_random_traces(data, block_size, max_batch):
    requests = random_requests(data, max_prompt=60, max_new=30, n=(1, 14))
    longest = max(len(r.prompt) + r.max_new_tokens - 1 for r in requests)
    need = -(-longest // block_size)
    num_blocks = data.draw(st.integers(need, 3 * need), label="num_blocks")
    budget = data.draw(st.integers(max_batch, 4 * max_batch + 8), label="token_budget")
    sched = Scheduler(ServingConfig(block_size=block_size, num_blocks=num_blocks,
                                    max_batch=max_batch, policy="chunked", token_budget=budget),
                      check=True)
    clock = VirtualClock()
    loop = StepLoop(sched, ChunkRunner(sched, clock), clock)
    finished = run_loop(loop, requests)
    event("preempted" if sched.num_preemptions else "no preemption")
    assert sorted(s.seq_id for s in finished) == list(range(len(requests)))
    for seq in finished:
        assert seq.output == list(range(1, seq.max_new_tokens + 1))
        assert len(seq.token_times) == seq.max_new_tokens
    assert sched.memory.num_free == num_blocks, "blocks leaked"


def test_chunked_policy_rules_one_by_one():
    sched = Scheduler(ServingConfig(block_size=4, num_blocks=100, max_batch=4,
                                    policy="chunked", token_budget=10))
    a = sequence(0, range(1, 5), 5, 0.0)
    b = sequence(1, range(1, 31), 2, 1.0)
    sched.add(a), sched.add(b)
    step = sched.schedule()
    assert step.prefills == [a, b] and step.chunks == {b: 6} and step.num_tokens == 10
    sched.update(step, [9, 9])
    assert a.output == [9] and b.output == [] and b.num_computed == 6
    step = sched.schedule()  # a decodes first, b's prompt continues with what is left
    assert step.decodes == [a] and step.prefills == [b] and step.chunks == {b: 9}
    sched.update(step, [9, 9])
    for _ in range(2):
        step = sched.schedule()
        sched.update(step, [9] * len(step.scheduled))
    assert b.num_computed == 30 and b.output == [9]  # its first token came with its last chunk


@pytest.mark.parametrize("make, message", [
    (lambda s, now: Step(prefills=list(s.waiting), chunks={s.waiting[0]: 3}), "not running"),
    (lambda s, now: _admit_all(s, 40), "token budget is 10"),
])
def test_chunked_steps_that_break_the_rules_are_stopped(make, message):
    sched = Scheduler(ServingConfig(block_size=4, num_blocks=100, max_batch=4,
                                    policy=make, token_budget=10))
    sched.add(sequence(0, range(1, 41), 2, 0.0))
    with pytest.raises(SchedulingError, match=message):
        sched.schedule()


def _admit_all(sched, n):
    step = Step()
    for seq in list(sched.waiting):
        sched.admit(seq)
        step.prefill(seq, n)
    return step


def test_chunks_need_a_token_budget():
    def chunks_without_budget(sched, now):
        step = Step()
        seq = sched.waiting[0]
        sched.admit(seq)
        step.prefill(seq, 2)
        return step

    sched = Scheduler(ServingConfig(block_size=4, num_blocks=10, policy=chunks_without_budget))
    sched.add(sequence(0, (1, 2, 3, 4, 5), 2, 0.0))
    with pytest.raises(SchedulingError, match="needs config.token_budget"):
        sched.schedule()


@pytest.mark.parametrize("kwargs, message", [
    (dict(policy="chunked"), "needs token_budget"),
    (dict(policy="continuous", token_budget=64), "policy='chunked'"),
    (dict(policy="chunked", token_budget=8, max_batch=16), "below max_batch"),
    (dict(policy="chunked", token_budget=64, max_prefill_tokens=64), "not both"),
])
def test_config_refuses_inconsistent_budgets(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServingConfig(**kwargs)


# -- the packed forward: its attention equals contiguous attention ------------------------------
@pytest.mark.parametrize("rows", [
    [(3, 1), (5, 1), (0, 7), (4, 6)],        # decodes, a fresh prompt, a continued prompt
    [(0, 9), (12, 4), (2, 1), (0, 1)],       # no decodes first; one-token rows as segments
    [(17, 1), (1, 1), (31, 2)],
])
def test_packed_attention_equals_contiguous_attention(rows):
    torch.manual_seed(0)
    H, K, D, S = 4, 2, 8, 4
    cache = PagedKVCache(1, K, D, BlockManager(64, S), torch.float64, n_heads=H)
    tables, keys, values, qs, starts, tokens = [], [], [], [], [], []
    for cached, new in rows:
        table = cache.new_table()
        table.append(cached + new)
        total = cached + new
        k, v = torch.randn(1, K, total, D, dtype=torch.float64), torch.randn(
            1, K, total, D, dtype=torch.float64)
        _write(cache, table, k[:, :, :cached], v[:, :, :cached], 0)  # the cached part
        tables.append(table), keys.append(k), values.append(v)
        qs.append(torch.randn(1, H, new, D, dtype=torch.float64))
        starts.append(cached), tokens.append([0] * new)
    _, _, meta = prepare(tables, tokens, starts, cache)
    q = torch.cat(qs, dim=2)
    k_new = torch.cat([k[:, :, c:] for k, (c, _) in zip(keys, rows)], dim=2)
    v_new = torch.cat([v[:, :, c:] for v, (c, _) in zip(values, rows)], dim=2)
    out = meta.attend(0, q, k_new, v_new)
    offset = 0
    for (cached, new), q_b, k, v in zip(rows, qs, keys, values):
        key_pos = torch.arange(cached + new)
        mask = key_pos <= (cached + torch.arange(new)).view(-1, 1)
        want = F.scaled_dot_product_attention(q_b, k, v, attn_mask=mask, enable_gqa=True)
        torch.testing.assert_close(out[:, :, offset:offset + new], want)
        offset += new


def _write(cache, table, k, v, start):
    """Write k, v (1, K, n, D) at positions start.. of ``table`` straight into the pool."""
    for i in range(k.shape[2]):
        p = start + i
        block, off = table.blocks[p // cache.block_size], p % cache.block_size
        cache.k[0, block, :, :, off] = k[0, :, i]
        cache.v[0, block, :, off] = v[0, :, i]


def test_a_packed_forward_refuses_positions_beyond_the_table():
    cache = PagedKVCache(1, 2, 8, BlockManager(8, 4), torch.float64)
    table = cache.new_table()
    table.append(3)
    with pytest.raises(ValueError, match="append to the table first"):
        prepare([table], [[1, 2]], [2], cache)


# -- cost models and the simulator --------------------------------------------------------------
def test_roofline_chunked_step_reduces_to_prefill_and_decode():
    costs = StepModel.for_device(ModelConfig.from_name("llama-2-7b"),
                                     get_device_spec("A100 80GB SXM"))
    assert costs.step_s([(512, 0)], 0, 0) == pytest.approx(costs.prefill_s(512))
    assert costs.step_s([], 32, 16000) == pytest.approx(costs.decode_s(32, 16000))
    # a chunk rides along a decode step for less than its own prefill (the weights are read
    # once for both), but not for free: past the ridge its tokens' arithmetic adds its own time,
    # which the attention reads of the decodes do not hide
    extra = costs.step_s([(256, 0)], 32, 16000) - costs.decode_s(32, 16000)
    assert 0.3 * costs.prefill_s(256) < extra < costs.prefill_s(256)
    assert chunk_pairs([(2, 3)]) == 2 * 3 + 3  # token 1 sees 4 keys, token 2 sees 5


def test_fitted_chunked_costs_recover_known_coefficients_and_fit_a_chunked_log():
    a, b, c, d = 2e-3, 3e-5, 4e-8, 5e-7  # a + b tokens + c pairs + d context
    truth = FittedCosts((a, b + c / 2, c / 2), (a, b, d), mixed=(a, b, c, d))
    shapes = [([(64, 0)], 4, 400), ([(32, 96)], 8, 900), ([(128, 0), (16, 40)], 2, 100),
              ([(8, 8)], 16, 4000), ([(200, 300)], 0, 0)]
    samples = [(tuple(ch), n, c, truth.step_s(ch, n, c)) for ch, n, c in shapes]
    fitted = FittedCosts.fit([], [], mixed=samples)
    assert fitted.mixed == pytest.approx(truth.mixed, rel=1e-6)
    assert fitted.prefill_s(100) == pytest.approx(truth.step_s([(100, 0)], 0, 0))
    assert fitted.decode_s(8, 800) == pytest.approx(truth.step_s([], 8, 800))
    # a simulated chunked run logs its steps; costs fitted to the log predict it again
    requests = [Request((0,) * (20 + 13 * i), 6 + i, 0.002 * i) for i in range(8)]
    config = ServingConfig(block_size=8, num_blocks=200, max_batch=4, policy="chunked",
                           token_budget=32)
    run = simulate(requests, truth, config)
    assert any(it.prefill_rows for it in run.iterations)
    refit = FittedCosts.from_iterations(run.iterations)
    again = simulate(requests, refit, config)
    assert again.summary().duration_s == pytest.approx(run.summary().duration_s, rel=1e-6)
    with pytest.raises(ValueError, match="no fit for chunked steps"):
        FittedCosts((1e-3, 0, 0), (1e-3, 0, 0)).step_s([(4, 0)], 1, 10)


def test_simulated_chunking_bounds_the_stall_a_long_prompt_causes():
    costs = StepModel.for_device(ModelConfig.from_name("llama-2-7b"),
                                     get_device_spec("A100 80GB SXM"))
    decodes = [Request((0,) * 100, 200, 0.0) for _ in range(16)]
    long_ = [Request((0,) * 4000, 4, 0.05 * (i + 1)) for i in range(3)]
    stalls = {}
    for name, extra in [("whole", {}), ("chunked", dict(policy="chunked", token_budget=256))]:
        run = simulate(decodes + long_, costs, ServingConfig(num_blocks=4000, max_batch=32,
                                                             **extra))
        gaps = [b - a for r in run.results[:16] for a, b in zip(r.timing.token_times_s,
                                                                  r.timing.token_times_s[1:])]
        stalls[name] = max(gaps)
    assert stalls["chunked"] * 3 < stalls["whole"]
    assert stalls["whole"] >= costs.prefill_s(4000)


def test_waiting_sequences_see_unchanged_status():
    sched = Scheduler(ServingConfig(block_size=4, num_blocks=3, max_batch=2, policy="chunked",
                                    token_budget=4))
    a, b = sequence(0, range(1, 9), 4, 0.0), sequence(1, range(1, 5), 4, 1.0)
    sched.add(a), sched.add(b)
    step = sched.schedule()  # a takes 2 of the 3 blocks and the whole budget
    assert step.prefills == [a] and step.chunks == {a: 4} and b.status is Status.WAITING
