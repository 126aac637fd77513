"""Tensor parallelism (inferlab.parallel): the split itself in one process, then 2 real ranks.

The one-process tests add up the ranks' partial outputs of one layer by hand (the all-reduce is
a sum); the distributed test starts 2 gloo ranks on 127.0.0.1 and compares the course's trained
target, split over them, with one process: logits to float tolerance, greedy tokens exactly,
and the all-reduce traffic counted against 2 x layers x d x bytes per element per token.
"""

import multiprocessing

import pytest
import torch

from inferlab.model.config import ModelConfig
from inferlab.model.generate import generate
from inferlab.model.llama import build_model
from inferlab.model.weights import checkpoint_path, load_checkpoint
from inferlab.parallel.launch import RankFailed, backend_for, run_ranks
from inferlab.parallel.runs import fail_on_rank, tensor_parallel_run
from inferlab.parallel.tensor import (HeadSplit, all_reduce_bytes_per_token, local_config,
                                      shard_model, shard_state)

TINY = ModelConfig(n_layers=2, d_model=64, n_heads=8, n_kv_heads=2, ffn_dim=96, vocab_size=101,
                   max_seq_len=64, name="tiny-tp")


def test_head_split_divides_or_replicates_kv_heads():
    split = HeadSplit(world_size=2, n_heads=8, n_kv_heads=2)  # one KV head per rank
    assert [list(split.kv_heads(r)) for r in range(2)] == [[0], [1]] and split.kv_replicas == 1
    split = HeadSplit(world_size=4, n_heads=8, n_kv_heads=2)  # fewer KV heads than ranks
    assert split.kv_replicas == 2
    assert [list(split.kv_heads(r)) for r in range(4)] == [[0], [0], [1], [1]]
    assert [list(split.q_heads(r)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ValueError, match="KV heads"):
        HeadSplit(world_size=3, n_heads=6, n_kv_heads=2)
    with pytest.raises(ValueError, match="query heads"):
        HeadSplit(world_size=4, n_heads=6, n_kv_heads=2)


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_query_head_keeps_its_own_kv_head(world_size):
    """Query head h attends with KV head h // group in the full model; so it must on its rank."""
    split = HeadSplit(world_size, TINY.n_heads, TINY.n_kv_heads)
    group = TINY.n_heads // TINY.n_kv_heads
    for rank in range(world_size):
        local_group = split.heads_per_rank // split.kv_heads_per_rank
        for i, h in enumerate(split.q_heads(rank)):
            assert split.kv_heads(rank)[i // local_group] == h // group


def test_shards_put_back_together_give_the_full_weights():
    model = build_model(TINY, seed=1)
    state = model.state_dict()
    parts = [shard_state(state, TINY, r, 2) for r in range(2)]
    name = "model.layers.0."
    assert torch.equal(torch.cat([p[name + "self_attn.q_proj.weight"] for p in parts]),
                       state[name + "self_attn.q_proj.weight"])
    assert torch.equal(torch.cat([p[name + "self_attn.o_proj.weight"] for p in parts], dim=1),
                       state[name + "self_attn.o_proj.weight"])
    assert torch.equal(torch.cat([p[name + "mlp.down_proj.weight"] for p in parts], dim=1),
                       state[name + "mlp.down_proj.weight"])
    assert torch.equal(parts[1]["lm_head.weight"], state["lm_head.weight"])  # replicated


@pytest.mark.parametrize("world_size,n_kv_heads", [(2, 2), (4, 2), (2, 1)])
@torch.inference_mode()
def test_partial_outputs_sum_to_the_full_layer(world_size, n_kv_heads):
    """Attention and MLP of each rank, added up (what the all-reduce does), equal the full layer;
    (4, 2) and (2, 1) have fewer KV heads than ranks, so KV heads are replicated."""
    config = TINY.with_kv_heads(n_kv_heads)
    model = build_model(config, seed=2)
    parts = [shard_model(model, r, world_size, all_reduce=lambda x: x) for r in range(world_size)]
    x = torch.randn(2, 5, config.d_model, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5)
    full = model.model.layers[1]
    attn = sum(p.model.layers[1].self_attn(x, positions) for p in parts)
    torch.testing.assert_close(attn, full.self_attn(x, positions), rtol=1e-5, atol=1e-5)
    mlp = sum(p.model.layers[1].mlp(x) for p in parts)
    torch.testing.assert_close(mlp, full.mlp(x), rtol=1e-5, atol=1e-5)
    assert parts[0].config.n_kv_heads == max(n_kv_heads // world_size, 1)


def test_local_config_refuses_an_uneven_split():
    with pytest.raises(ValueError, match="ffn_dim"):
        local_config(TINY.scaled(ffn_dim=90), 4)


def test_course_target_on_two_ranks_equals_one_process():
    """The trained target split over 2 gloo ranks: same logits, same greedy tokens; and a random
    MQA model (1 KV head, replicated on both ranks) likewise."""
    path = str(checkpoint_path("course-target"))
    prompt = torch.tensor([[5, 17, 99, 300, 42, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8]])
    mqa = (TINY.with_kv_heads(1), 3)
    jobs = [(path, prompt, 10), (mqa, prompt[:, :4] % TINY.vocab_size, 6)]
    ranks = run_ranks(tensor_parallel_run, 2, jobs, timeout=60)
    for j, (source, tokens, new) in enumerate(jobs):
        model = load_checkpoint(source, dtype=torch.float32) if j == 0 else \
            build_model(source[0], seed=source[1])
        with torch.inference_mode():
            logits, greedy = model(tokens), generate(model, tokens, new)
        config = model.config
        for rank in ranks:
            got = rank[j]
            torch.testing.assert_close(got["logits"], logits, rtol=1e-4, atol=1e-4)
            assert torch.equal(got["tokens"], greedy)
            assert got["calls"] == 2 * config.n_layers
            assert got["bytes"] == tokens.numel() * all_reduce_bytes_per_token(config, 4)
        expected_kv = max(config.n_kv_heads // 2, 1)
        assert [r[j]["kv_heads"] for r in ranks] == [expected_kv, expected_kv]
    # the split layers hold half of the attention and MLP weights each (the rest is replicated)
    full = sum(p.numel() for p in load_checkpoint(path, dtype=torch.float32).parameters())
    c = load_checkpoint(path).config
    split = c.n_layers * (c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
                          + 3 * c.d_model * c.ffn_dim)
    assert ranks[0][0]["params"] == full - split // 2


def test_a_failing_rank_is_reported_and_no_process_is_left():
    with pytest.raises(RankFailed, match="fails on purpose"):
        run_ranks(fail_on_rank, 2, 1, timeout=20)
    assert multiprocessing.active_children() == []


def test_backend_follows_the_device():
    assert backend_for("cpu") == "gloo"
    assert backend_for("cuda") == "nccl" and backend_for(torch.device("cuda", 1)) == "nccl"


def test_overhead_and_bandwidth_fit_recovers_a_known_link():
    from inferlab.parallel.bench import bus_factor, fit_overhead_bandwidth

    rows = [{"bytes_per_call": s, "seconds_per_call": 2e-4 + s / 5e9} for s in (768, 6144, 3e6)]
    overhead, algbw = fit_overhead_bandwidth(rows)
    assert overhead == pytest.approx(2e-4, rel=1e-9) and algbw == pytest.approx(5e9, rel=1e-9)
    assert bus_factor(2) == 1.0 and bus_factor(8) == 1.75
