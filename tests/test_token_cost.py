"""The cost of a token (inferlab.sim.token_cost, cost_calculator) and the stored simulations.

The calculator's roofline floor is checked against two computations done by hand from the
published model shapes and the datasheet numbers; the stored simulations against the tables
they came from and against recomputation.
"""

import json
from dataclasses import replace

import pytest

from inferlab.sim import cost_limits, token_cost as tc
from inferlab.sim.steady_state import MEETS, MISSES, OVERLOADED, UNDECIDED
from inferlab.sim.cost_calculator import calculate, plot_calculation
from inferlab.analysis.figures import figure_problems
from inferlab.analysis.hardware import get_device_spec
from inferlab.model.config import ModelConfig
from inferlab.sim.steady_state import Workload, measure, simulated


def test_floor_matches_a_hand_computation_llama2_7b_on_a100_batch_1():
    # Llama-2-7B: 32 layers, d 4096, FFN 11008, 32 heads of 128, vocabulary 32000, untied.
    layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    params = 32 * layer + 4096 + 2 * 32000 * 4096
    assert params == 6_738_415_616                       # the published count
    read = (params - 32000 * 4096) * 2                   # all but the input embedding, 2 B each
    kv = 2 * 32 * 32 * 128 * 2                           # K and V, layers, KV heads, dim, 2 B
    bandwidth, peak, price = 2039e9, 312e12, 4.00        # A100 80GB SXM; $4/h, given
    # batch 1 at 100 + 100/2 tokens of context: every kernel reads memory (the linear layers
    # and the LM head their weights, attention 150 cached tokens and writes one)
    step = (read + 151 * kv) / bandwidth
    assert 2 * read / 2 / peak < step                    # memory-bound: the FLOPs would take less
    out = price / 3600 * step / 1 * 1e6
    # a prefill of 100: the matmuls still read-bound at 100 tokens, attention reads and writes
    # the prompt's K/V, the LM head reads its weights for the one position sampled
    linear = read / 2 - 32000 * 4096
    assert 2 * linear * 100 / peak < linear * 2 / bandwidth
    prefill = (read + 200 * kv) / bandwidth
    inp = price / 3600 * prefill / 100 * 1e6
    floor = tc.CostCase("llama-2-7b", "A100 80GB SXM", prompt=100, output=100).floor(1, price)
    assert floor.usd_per_m_output == pytest.approx(out, rel=1e-9)
    assert floor.usd_per_m_input == pytest.approx(inp, rel=1e-9)
    assert floor.usd_per_m_output == pytest.approx(7.24, abs=0.01)   # about $7 per million


def test_floor_matches_a_hand_computation_llama3_8b_on_h100_batch_64():
    # Llama-3-8B: 32 layers, d 4096, FFN 14336, 32 query and 8 KV heads of 128, vocab 128256.
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    params = 32 * layer + 4096 + 2 * 128256 * 4096
    assert params == 8_030_261_248
    read = (params - 128256 * 4096) * 2
    linear, head = read / 2 - 128256 * 4096, 128256 * 4096
    kv = 2 * 32 * 8 * 128 * 2
    bandwidth, peak, price = 3350e9, 989e12, 6.88        # H100 SXM; the AWS row of prices.csv
    context = 1000 + 250 / 2
    # batch 64 (below the ridge, 295): each kernel memory-bound, summed
    step = (read + (64 * context + 64) * kv) / bandwidth
    out = price / 3600 * step / 64 * 1e6
    # a 1,000-token prefill: matmuls and attention compute-bound, the LM head a read
    prefill = ((2 * linear * 1000 + 4 * 32 * 32 * 128 * 1000 * 1001 / 2) / peak
               + head * 2 / bandwidth)
    inp = price / 3600 * prefill / 1000 * 1e6
    floor = tc.CostCase().floor(64, price)
    assert floor.usd_per_m_output == pytest.approx(out, rel=1e-9)
    assert floor.usd_per_m_input == pytest.approx(inp, rel=1e-9)


def test_no_8_or_4_bit_format_computes_at_the_16_bit_peak():
    """FP8 is W8A8 at the FP8 peak, NVFP4 and MXFP4 W4A4 at the FP4 peak; only the weight-only
    formats, which dequantise into 16-bit arithmetic, use the 16-bit peak."""
    h100, b200 = get_device_spec("H100 SXM"), get_device_spec("B200")
    for case in tc.chapter_cases():
        costs, spec = case.costs(), case.spec()
        p = tc.cost_precision(case.precision)
        if case.precision in ("fp8", "nvfp4", "mxfp4"):
            assert costs.peak_flops == spec.peak_flops(p.compute) > spec.peak_flops("bfloat16")
            assert p.bytes_per_kv == 1
        else:
            assert costs.peak_flops == spec.peak_flops("bfloat16"), case
    assert tc.CostCase(precision="fp8").costs().peak_flops == h100.peak_fp8
    assert h100.peak_fp8 == pytest.approx(2 * h100.peak_bf16, rel=1e-3)   # 1,979 against 989
    assert tc.CostCase(device="B200", precision="nvfp4").costs().peak_flops == b200.peak_fp4
    assert tc.NVFP4.bytes_per_weight == pytest.approx(4.5 / 8)
    assert tc.MXFP4.bytes_per_weight == pytest.approx(4.25 / 8)
    assert "fp8 weights and KV" not in tc.PRECISIONS     # the row that ran 8 bits at 16 bits
    # Hopper has no FP4 arithmetic: a case that asks for it is refused, not priced at 16 bits
    with pytest.raises(ValueError, match="no fp4 peak"):
        tc.CostCase(precision="nvfp4").costs()


def test_precision_moves_bytes_and_groups_hold_the_model():
    config = ModelConfig.from_name("llama-3-70b")
    bf16 = tc.weight_bytes(config, "bf16")
    assert tc.weight_bytes(config, "int8 weights") == pytest.approx(bf16 / 2)
    assert tc.weight_bytes(config, "int4 weights") == pytest.approx(bf16 / 4)
    assert tc.kv_bytes_per_token(config, "fp8") == 320 * 2**10 / 2
    assert tc.weight_bytes(config, "nvfp4") == pytest.approx(bf16 * 4.5 / 16)
    assert tc.group_size(config, "H100 SXM") == 4       # 141 GB: 2 x 80 GB leaves too little
    assert tc.group_size(config, "B200") == 2
    assert tc.group_size(config, "H100 SXM", "int4 weights") == 1
    costs = tc.CostCase(model="llama-3-70b").costs()
    assert costs.devices == 4 and costs.link.name == "NVLink H100"   # split over NVLink
    assert costs.link.bandwidth == 450e9
    # the memory a program can have on each H100 (nvidia-smi total less the driver's reserve)
    case = tc.CostCase(model="llama-3-70b")
    assert case.spec().memory == (81559 - 454) * 2**20 and case.spec().bandwidth == 3350e9
    with pytest.raises(ValueError, match="unknown precision"):
        tc.precision("int3")


def test_the_hour_is_split_between_input_and_output_without_loss():
    case = tc.CostCase(prompt=400, output=100)
    w = measure(Workload.fixed(400, 100).requests(600, 10.0),
                simulated(case.costs(), case.serving()), case.slo)
    usd_in, usd_out = tc.window_costs(w, 3.6)
    busy = (w.prefill_s + w.decode_s) / w.duration_s
    spent = (usd_in * w.achieved_in_tok_s + usd_out * w.achieved_out_tok_s) / 1e6  # $ per s
    assert spent == pytest.approx(3.6 / 3600, rel=1e-9)
    assert 0 < busy <= 1 and usd_out > usd_in


def test_break_even_makes_the_costs_equal():
    slow = tc.break_even_price(6.88, 5000.0, 2000.0)
    assert tc.usd_per_million(slow, 2000.0) == pytest.approx(tc.usd_per_million(6.88, 5000.0))
    assert tc.usd_per_million(3600.0, 1e6) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        tc.usd_per_million(1.0, 0.0)


# --- The stored simulations of Chapter 8 -------------------------------------------------------

@pytest.fixture(scope="module")
def stored():
    return tc.stored()


def test_every_chapter_case_is_stored_and_computed_from_todays_tables(stored):
    for case in tc.chapter_cases():
        key = tc.case_key(case)
        assert key in stored, f"{case} is not stored: run python -m inferlab.sim.token_cost --write"
        assert json.loads(json.dumps(tc.inputs(case))) == stored[key].inputs, \
            f"{case}: the tables changed; run python -m inferlab.sim.token_cost --write"


def test_recomputing_a_stored_probe_gives_the_stored_window(stored):
    case, capacity = stored[tc.case_key(tc.CostCase())].case, stored[tc.case_key(tc.CostCase())].capacity
    first = capacity.probes[0].history[0]
    again = measure(Workload.fixed(case.prompt, case.output).requests(first.n_requests,
                                                                      capacity.probes[0].rate),
                    simulated(case.costs(), case.serving()), case.slo)
    assert again == first, "run python -m inferlab.sim.token_cost --write"


def test_the_stored_costs_make_physical_sense(stored):
    price = 6.88
    for case in tc.chapter_cases():
        sim = tc.stored_cost(case, price)
        assert sim.ok, case
        assert sim.usd_per_m_output > sim.usd_per_m_input, case   # output dearer than input
        # no dearer than the roofline at the batch it ran: its steps are timed by that model,
        # and a chunked step charges its decodes only their tokens' share of it (so output can
        # come out below the full-memory floor, which prices pure decode steps); and no token,
        # input or output, cheaper than a prompt token at the roofline: every token passes
        # through every weight's arithmetic once
        calc = calculate(case, price)
        assert sim.usd_per_m_output <= 1.05 * calc.at_simulated_batch.usd_per_m_output, case
        w = sim.window
        blended = tc.usd_per_million(sim.usd_per_hour, w.achieved_in_tok_s + w.achieved_out_tok_s)
        assert blended >= 0.95 * calc.at_full_memory.usd_per_m_input, case
        assert sim.window.slo_attainment >= case.target
    bounds = [tc.CostCase(device="H100 SXM", tpot_s=t) for t in tc.TPOT_BOUNDS]
    out = [tc.stored_cost(c, price).usd_per_m_output for c in bounds]
    assert out[0] >= out[-1]   # a tighter TPOT bound costs at least as much per token


def test_cost_table_and_calculator(stored, capsys):
    text = tc.cost_table()
    for name in tc.TABLE_MODELS + tc.TABLE_DEVICES:
        assert name in text
    calc = calculate(tc.CostCase())
    assert calc.stored and "simulated within the SLO" in str(calc) and "kernel time" in str(calc)
    assert calc.at_batch_1.usd_per_m_output > calc.simulated.usd_per_m_output
    assert calc.simulated.usd_per_m_output <= 1.05 * calc.at_simulated_batch.usd_per_m_output
    ax = plot_calculation(calc)
    assert figure_problems(ax.figure) == []
    unstored = calculate(tc.CostCase(prompt=123))
    assert unstored.simulated is None and "not stored" in str(unstored)


def test_a_chunked_run_splits_its_forwards_between_prefill_and_decode():
    """A chunked step is one forward, split between the phases by the tokens each put through
    it: every busy second is counted once, and input tokens cost about what a whole-prompt
    prefill makes them cost."""
    from inferlab.serving.config import ServingConfig
    from inferlab.sim.simulator import simulate

    case = tc.CostCase(prompt=400, output=100)
    requests = Workload.fixed(400, 100).requests(600, 10.0)
    whole = measure(requests, simulated(case.costs(), case.serving()), case.slo)
    config = ServingConfig(num_blocks=case.serving().num_blocks, max_batch=256,
                           policy="chunked", token_budget=256)
    chunked = measure(requests, simulated(case.costs(), config), case.slo)   # warm-up 0.2, cool-down 0.1
    end = max(r.arrival_s for r in requests)
    busy = sum(it.end_s - it.start_s for it in simulate(requests, case.costs(), config).iterations
               if 0.2 * end <= it.start_s < 0.9 * end)
    assert any(it.prefill_rows for it in simulate(requests, case.costs(), config).iterations)
    assert chunked.prefill_s > 0 and chunked.decode_s > 0
    assert chunked.prefill_s + chunked.decode_s == pytest.approx(busy, rel=1e-9)
    # the input tokens' price is the prefill's in both designs (up to the chunks' re-reads and
    # the weight reads they share with the decodes)
    in_whole, in_chunked = tc.window_costs(whole, 3.6)[0], tc.window_costs(chunked, 3.6)[0]
    assert 0.5 * in_whole < in_chunked < 2 * in_whole


def test_two_capacities_within_the_searchs_resolution_are_indistinguishable():
    rtol = tc.SEARCH["rtol"]
    assert tc.compare_rates(30.0, 30.0 * (1 + rtol)) == "indistinguishable"
    assert tc.compare_rates(30.0 * (1 + rtol), 30.0) == "indistinguishable"
    assert tc.compare_rates(30.0 * (1 + 2 * rtol), 30.0) == "higher"
    assert tc.compare_rates(30.0, 30.0 * (1 + 2 * rtol)) == "lower"


def test_what_held_each_batch_is_read_from_the_searchs_own_verdicts(stored):
    """Every rate tried above a capacity was a miss or undecided (the search is consistent),
    and each reason matches the numbers it was read from: a cap at the cap, the device's time
    only where the next rate fell behind or its queue grew, the SLO only where it kept up and
    its longest trace missed, "cannot tell" only where that trace still met the target."""
    for case in tc.chapter_cases():
        cap = stored[tc.case_key(case)].capacity
        limit = case.limit(cap)
        assert limit.reason in cost_limits.REASONS, case
        assert all(cap.verdict(p) != MEETS for p in cap.probes if p.rate > cap.rate), case
        above = min((p for p in cap.probes if p.rate > cap.rate), key=lambda p: p.rate)
        if limit.reason == "max batch":
            assert limit.mean_batch >= cost_limits.AT_CAP * case.max_batch, case
        elif limit.reason == "device time":
            a, b = above.history[-2:]
            assert (above.status == OVERLOADED or above.window.saturated
                    or cap.criterion.queue_growing(a, b)), case
        elif limit.reason in ("TTFT bound", "TPOT bound"):
            assert limit.slo_binds and not above.window.saturated, case
            assert above.window.slo_attainment < cap.target, case  # its longest trace missed
            a, b = above.history[-2:]
            if cap.criterion.queue_growing(a, b):  # the bound's only if a looser one passes it
                looser = [stored[tc.case_key(replace(case, tpot_s=t))].capacity
                          for t in tc.TPOT_BOUNDS if t > case.tpot_s
                          and tc.case_key(replace(case, tpot_s=t)) in stored]
                assert limit.reason == "TPOT bound", case
                assert any(c.rate >= above.rate for c in looser), case
        elif limit.reason == "cannot tell":
            assert cap.verdict(above) == UNDECIDED, case
            assert above.window.slo_attainment >= cap.target, case
