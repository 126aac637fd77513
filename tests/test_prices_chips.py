"""Prices (dated, sourced rows), chips on the roofline, and what an agent's task costs."""

import math

import pytest

from inferlab.analysis import agent_cost, chips, prices
from inferlab.analysis.hardware import get_device_spec, load_hardware
from inferlab.sim.token_cost import weight_bytes
from inferlab.data import read_table
from inferlab.model.config import ModelConfig


@pytest.mark.parametrize("file", ["prices.csv", "chips_2026.csv", "api_prices_2026.csv",
                                  "cost_inputs_2026.csv"])
def test_every_price_row_has_a_source_a_date_and_a_status(file):
    rows = read_table(file)
    assert rows
    for row in rows:
        assert row["source"].strip(), row
        prices.parse_date(row["date"])
        assert row["status"] in prices.STATUSES, row


def test_a_row_without_a_source_or_a_date_is_refused(monkeypatch):
    good = dict(read_table("prices.csv")[0])
    for broken in ({**good, "source": " "}, {**good, "date": ""}, {**good, "date": "last year"},
                   {**good, "status": "trust me"}):
        monkeypatch.setattr(prices, "read_table", lambda name, row=broken: [row])
        with pytest.raises(ValueError):
            prices.device_prices()


def test_every_priced_device_is_in_the_hardware_table_and_the_newest_row_wins():
    for p in prices.device_prices():
        get_device_spec(p.device)
        assert p.usd_per_hour > 0
    newest = prices.device_price("H100 SXM", "AWS")
    assert newest.date == max(p.date for p in prices.device_prices()
                              if p.device == "H100 SXM" and p.provider == "AWS")
    assert newest.usd_per_hour == pytest.approx(55.04 / 8, abs=0.005)  # FACTS.md
    with pytest.raises(ValueError, match="no price for"):
        prices.device_price("T4")


def test_api_prices_match_their_sources():
    table = {(p.provider, p.model): p for p in prices.token_prices()}
    # platform.claude.com/docs/.../models/opus-5-5/overview, 'Pricing'
    opus = table[("Anthropic", "Claude Opus 5.5")]
    assert (opus.usd_per_m_input, opus.usd_per_m_cache_write, opus.usd_per_m_cached_input,
            opus.usd_per_m_output, opus.batch_discount) == (4.00, 5.00, 0.20, 20.00, 0.5)
    # developers.openai.com/api/docs/models/gpt-5.4, 'Pricing'
    gpt = table[("OpenAI", "GPT-5.4")]
    assert (gpt.usd_per_m_input, gpt.usd_per_m_cached_input, gpt.usd_per_m_output) == \
        (2.50, 0.25, 15.00)
    assert opus.output_over_input == 5 and gpt.output_over_input == 6
    assert opus.cached_discount == pytest.approx(0.95) and gpt.cached_discount == pytest.approx(0.9)
    # a price the source did not give stays None, and the rows that need it are filtered
    gemini = next(p for p in table.values() if p.provider == "Google")
    assert gemini.usd_per_m_cached_input is None and not gemini.has_cache_prices
    with pytest.raises(ValueError, match="no cached-input price"):
        gemini.cached_discount
    cached = prices.token_prices(with_cache_prices=True)
    assert gemini not in cached and opus in cached and all(p.has_cache_prices for p in cached)


def test_the_first_chapters_see_the_same_devices_as_before():
    assert set(load_hardware()) == {"T4", "L4", "A100 40GB SXM", "A100 80GB SXM", "H100 SXM",
                                    "H100 PCIe", "H200 SXM", "B200", "MI300X",
                                    # rows added so device detection matches these exactly
                                    "A100 80GB PCIe", "L40S", "GH200", "GB200", "Apple M4",
                                    "Apple M4 Pro", "Apple M4 Max", "DDR5-4800 dual channel"}
    every = load_hardware(kinds=None)
    for name in ("TPU v5e", "TPU v6e", "Groq LPU", "Cerebras WSE-3"):
        assert name in every and every[name].source.strip()
    assert {every[n].memory_kind for n in ("Groq LPU", "Cerebras WSE-3")} == {"SRAM"}
    assert every["TPU v6e"].bandwidth == 1638e9 and every["TPU v6e"].peak_bf16 == 918e12
    assert every["Cerebras WSE-3"].memory == 44e9 and every["Cerebras WSE-3"].bandwidth == 21e15


def test_chips_to_hold_a_70b_model():
    config = ModelConfig.from_name("llama-3-70b")
    w = weight_bytes(config, "bf16")
    assert chips.chips_for_bytes(w, 0, 220e6) == math.ceil(w / 220e6)
    assert chips.chips_to_hold(config, "Groq LPU") == math.ceil(
        w / get_device_spec("Groq LPU").memory) > 600
    assert chips.chips_to_hold(config, "Cerebras WSE-3") == 4
    assert chips.chips_to_hold(config, "H100 SXM") == 2
    assert chips.chips_to_hold(config, "H100 SXM", kv_tokens=100_000) == \
        math.ceil((w + 100_000 * 327_680) / (81559 - 454) / 2**20)  # usable MiB (nvidia-smi)
    with pytest.raises(ValueError):
        chips.chips_for_bytes(1.0, 0.0, 0.0)


def test_sram_reads_its_memory_thousands_of_times_more_often_than_hbm():
    # 3.35 TB/s over the 81,105 MiB a program can have (not the datasheet's "80GB")
    assert chips.passes_per_second("H100 SXM") == pytest.approx(3350e9 / (81105 * 2**20))
    assert chips.passes_per_second("Groq LPU") > 1000 * chips.passes_per_second("H100 SXM")


def test_the_trade_between_a_users_speed_and_a_chips_throughput():
    pts = chips.frontier("llama-3-70b", "H100 SXM", 2048, chips=8)
    users = [p.tokens_per_s_per_user for p in pts]
    per_chip = [p.tokens_per_s_per_chip for p in pts]
    assert users == sorted(users, reverse=True) and per_chip == sorted(per_chip)
    assert pts[0].batch == 1 and pts[0].memory_bound
    full = pts[-1]
    assert full.batch == chips.max_batch(ModelConfig.from_name("llama-3-70b"),
                                         get_device_spec("H100 SXM"), 8, 2048)
    # with the memory full, each step reads all of it: a user gets at most about beta / S
    # tokens/s, less once the matmuls' arithmetic (which runs after the reads, not beneath
    # them) adds its own time
    assert full.tokens_per_s_per_user <= 1.02 * chips.passes_per_second("H100 SXM")
    assert full.tokens_per_s_per_user > 0.5 * chips.passes_per_second("H100 SXM")
    with pytest.raises(ValueError, match="no 16-bit peak"):
        chips.serve_point("llama-3-70b", "Cerebras WSE-3", 4, 1, 2048)
    with pytest.raises(ValueError, match="do not fit"):
        chips.serve_point("llama-3-70b", "H100 SXM", 2, 1000, 2048)


def test_an_agents_calls_hit_the_prefix_cache_by_whole_blocks():
    calls = agent_cost.agent_calls(6, first_prompt=1000, tool_tokens=200, output=100)
    assert [c.prompt for c in calls] == [1000 + i * 300 for i in range(6)]
    assert calls[0].cached == 0
    for before, call in zip(calls, calls[1:]):
        # the previous prompt and all but the last output token have K/V: whole blocks of it
        assert call.cached == (before.prompt + before.output - 1) // 16 * 16
    price = prices.token_prices()[0]
    cost = agent_cost.task_cost(calls, price)
    assert cost.input_tokens == sum(c.prompt for c in calls) and cost.output_tokens == 600
    full = (cost.input_tokens * price.usd_per_m_input + 600 * price.usd_per_m_output) / 1e6
    assert cost.usd_uncached == pytest.approx(full)
    assert 0 < cost.saving < 1
