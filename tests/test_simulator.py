"""The discrete-event simulator: hand-computed timelines, cost-model fits, roofline extrapolation."""

from dataclasses import dataclass

import pytest
import torch

from inferlab.analysis import formulas
from inferlab.analysis.capacity import kv_blocks_for_device
from inferlab.analysis.hardware import get_device_spec
from inferlab.model.config import ModelConfig
from inferlab.model.llama import build_model
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine
from inferlab.analysis.formulas import static_slot_utilisation
from inferlab.serving.request import Request
from inferlab.analysis.step_time import StepModel
from inferlab.sim.simulator import FittedCosts, simulate
from inferlab.sim.traces import TraceRow
from inferlab.sim.workloads import trace_requests


def serving(num_blocks, block_size=16, max_batch=32, policy="continuous"):
    return ServingConfig(block_size=block_size, num_blocks=num_blocks, max_batch=max_batch,
                         policy=policy)


@dataclass(frozen=True)
class Flat:
    """Prefill 1 s, decode 0.5 s, whatever the size: timelines by hand."""

    def prefill_s(self, n_tokens):
        return 1.0

    def decode_s(self, batch, context_tokens):
        return 0.5


def reqs(*specs):
    return [Request((0,) * p, n, t) for p, n, t in specs]


def test_a_timeline_computed_by_hand():
    # A (3 tokens) and B (2 tokens) arrive at 0; C (1 token) at 10 s, when the engine is idle.
    result = simulate(reqs((4, 3, 0.0), (4, 2, 0.0), (4, 1, 10.0)), Flat(),
                      serving(num_blocks=16, block_size=4, max_batch=4))
    a, b, c = result.timings
    assert a.token_times_s == (1.0, 2.5, 3.0)  # prefill A, prefill B, decode, decode
    assert b.token_times_s == (2.0, 2.5)
    assert c.token_times_s == (11.0,)          # the idle gap is skipped to its arrival
    assert result.summary().n_tokens == 6


def test_static_batching_timeline_and_padding():
    # max_batch 2: A and B form a batch; C arrives at 0 too but waits for the batch to end.
    result = simulate(reqs((4, 3, 0.0), (4, 1, 0.0), (4, 1, 0.0)), Flat(), serving(16, 4, 2, "static"))
    a, b, c = result.timings
    assert a.token_times_s == (1.0, 2.5, 3.0) and b.token_times_s == (2.0,)
    assert c.token_times_s == (4.0,)
    assert [it.padding_ids for it in result.iterations if it.decode_ids] == [(1,), (1,)]


def test_continuous_beats_static_on_a_skewed_trace():
    rows = [TraceRow(i, 8, 2 if i % 4 else 40) for i in range(32)]
    requests = trace_requests(rows, [0.0] * len(rows))
    costs = FittedCosts((1e-3, 0.0, 0.0), (2e-3, 1e-5, 0.0))
    cont = simulate(requests, costs, serving(400, 16, 8, "continuous")).summary()
    stat = simulate(requests, costs, serving(400, 16, 8, "static")).summary()
    assert cont.throughput > 1.5 * stat.throughput
    assert cont.ttft.p99 < stat.ttft.p99


def test_fit_recovers_known_coefficients():
    truth = FittedCosts((1e-3, 2e-5, 3e-8), (4e-3, 5e-5, 6e-7))
    prefills = [(t, truth.prefill_s(t)) for t in (4, 16, 64, 256)]
    decodes = [(n, n * c, truth.decode_s(n, n * c)) for n in (1, 4, 16) for c in (10, 100)]
    fit = FittedCosts.fit(prefills, decodes)
    for got, want in zip(fit.prefill + fit.decode, truth.prefill + truth.decode):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    with pytest.raises(ValueError, match="3 or more"):
        FittedCosts.fit(prefills[:2], decodes)


def test_the_simulator_makes_the_engine_s_decisions():
    """Same scheduler, same trace (all at t=0): the same iterations, whatever the step times."""
    config = ModelConfig.from_name("tiny").scaled(n_layers=1, max_seq_len=128)
    model = build_model(config, seed=0)
    rows = [TraceRow(i, 3 + 5 * (i % 3), 1 + 7 * (i % 4)) for i in range(10)]
    requests = trace_requests(rows, [0.0] * 10, config.vocab_size, seed=0)
    engine = Engine(model, serving(num_blocks=12, block_size=4, max_batch=4))
    run = engine.run(requests)
    assert run.num_preemptions > 0
    sim = simulate(requests, Flat(), serving(12, 4, 4))
    shape = lambda its: [([r.seq_id for r in it.prefill_rows], it.decode_ids, it.preempted) for it in its]  # noqa: E731
    assert shape(sim.iterations) == shape(run.iterations)
    assert sim.num_preemptions == run.num_preemptions
    fit = FittedCosts.from_iterations(run.iterations)
    assert min(fit.prefill + fit.decode) >= 0 and fit.decode_s(4, 100) > 0


def test_the_simulators_table_costs_are_the_step_time_model():
    """The simulator's CostModel on a table device is ``step_time.StepModel`` (its kernels are
    checked by hand in tests/test_step_time.py); here, what the simulator relies on."""
    llama = ModelConfig.from_name("llama-2-7b")
    h100 = get_device_spec("H100 SXM")
    costs = StepModel.for_device(llama, h100)
    weights = formulas.decode_bytes_per_step(llama, "bfloat16")
    kv = formulas.kv_bytes_per_token(llama, "bfloat16")
    # batch 1: the weights, the context read and the new token's K/V written, at the bandwidth
    assert costs.decode_s(1, 1000) == pytest.approx((weights + 1001 * kv) / h100.bandwidth)
    # a decode step is a chunked step without chunks
    assert costs.step_s((), 8, 4000) == costs.decode_s(8, 4000)
    # far past the critical batch the matmuls are compute-bound: at least their FLOPs
    assert costs.decode_s(4096, 0) > 4096 * formulas.flops_per_token(llama) / h100.peak_bf16 * 0.99
    # a long prompt costs at least 2 x params x T FLOPs
    assert costs.prefill_s(2048) > 2048 * 2 * formulas.param_count(llama, False) / h100.peak_bf16
    slow = StepModel.for_device(llama, h100, efficiency=0.5, overhead_s=1e-3)
    assert slow.decode_s(1, 0) == pytest.approx(2 * costs.decode_s(1, 0) + 1e-3)
    with pytest.raises(ValueError, match="no bfloat16 peak"):
        StepModel.for_device(llama, get_device_spec("T4"))


def test_kv_blocks_for_a_table_device():
    llama = ModelConfig.from_name("llama-2-13b")
    a100 = get_device_spec("A100 40GB SXM")
    blocks = kv_blocks_for_device(llama, a100, block_size=16)
    budget = a100.memory - formulas.weight_bytes(llama, "bfloat16")
    assert blocks == int(budget // formulas.kv_bytes_per_token(llama)) // 16
    with pytest.raises(ValueError, match="do not fit"):
        kv_blocks_for_device(ModelConfig.from_name("llama-2-70b"), a100)


def test_static_slot_utilisation():
    assert static_slot_utilisation([1, 3], 2) == pytest.approx(4 / 6)
    assert static_slot_utilisation([5, 5, 5], 2) == 1.0
    assert static_slot_utilisation([1, 3, 2], 1) == 1.0
    with pytest.raises(ValueError):
        static_slot_utilisation([], 2)


def test_trace_requests():
    rows = [TraceRow(7, 3, 2)]
    (r,) = trace_requests(rows, [1.5])
    assert r.prompt == (0, 0, 0) and r.max_new_tokens == 2 and r.arrival_s == 1.5
    assert r.request_id == 7
    (r,) = trace_requests(rows, [0.0], vocab_size=10, seed=1)
    assert len(r.prompt) == 3 and all(0 <= t < 10 for t in r.prompt)
    with pytest.raises(ValueError):
        trace_requests(rows, [])
    assert torch.is_tensor(torch.tensor(r.prompt))
