"""Expert parallelism (inferlab.parallel.expert) over 2 gloo ranks, against one process."""

import torch

from inferlab.model.generate import generate
from inferlab.model.moe import MoEModelConfig, build_moe_model
from inferlab.model.weights import load_moe_checkpoint
from inferlab.model.routing import record_routing
from inferlab.model.weights import save_checkpoint
from inferlab.parallel.expert import expected_dispatch_bytes_per_token
from inferlab.parallel.launch import run_ranks
from inferlab.parallel.runs import expert_parallel_run

TINY = MoEModelConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, ffn_dim=48, vocab_size=97,
                      max_seq_len=64, n_experts=4, experts_per_token=2, name="tiny-moe")


def test_expected_dispatch_bytes():
    assert expected_dispatch_bytes_per_token(4096, 2, 2, 2) == 2 * 0.5 * 4096 * 2
    assert expected_dispatch_bytes_per_token(4096, 8, 1, 2) == 0  # one rank sends nothing


def test_two_ranks_equal_one_process_and_count_their_dispatch(tmp_path):
    """Each rank runs its own prompt (of different lengths) with half of the experts; logits and
    greedy tokens equal one process's, and the rows sent away equal the rows whose expert lives
    on the other rank, counted from one process's routing. The second model's routers are all
    zero, so every token picks the same experts: one rank receives nothing (empty splits)."""
    model = build_moe_model(TINY, seed=7)
    lopsided = build_moe_model(TINY, seed=8)
    with torch.no_grad():
        for layer in lopsided.model.layers:
            layer.block_sparse_moe.gate.weight.zero_()
    save_checkpoint(lopsided, tmp_path)
    lopsided = load_moe_checkpoint(tmp_path)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, TINY.vocab_size, (2, 6), generator=gen),
               torch.randint(0, TINY.vocab_size, (1, 9), generator=gen)]
    jobs = [((TINY, 7), prompts, 5), (str(tmp_path), prompts, 3)]
    ranks = run_ranks(expert_parallel_run, 2, jobs, timeout=60)
    per_rank = TINY.n_experts // 2
    for j, (one, (_, _, new)) in enumerate(zip((model, lopsided), jobs)):
        for rank, prompt in enumerate(prompts):
            got = ranks[rank][j]
            with torch.inference_mode():
                logits, greedy = one(prompt), generate(one, prompt, new)
            torch.testing.assert_close(got["logits"], logits, rtol=1e-5, atol=1e-5)
            assert torch.equal(got["tokens"], greedy)
            assert got["experts_held"] == per_rank
            experts = record_routing(one, prompt)               # (L, N, k)
            remote = int((experts // per_rank != rank).sum())   # rows whose expert is elsewhere
            assert got["routed_tokens"] == TINY.n_layers * prompt.numel()
            assert got["dispatch_rows"] == remote
            assert got["dispatch_bytes"] == remote * TINY.d_model * 4
        # what one rank sends back at the combine is what the other sent it at the dispatch
        assert ranks[0][j]["combine_bytes"] == ranks[1][j]["dispatch_bytes"]
        assert ranks[1][j]["combine_bytes"] == ranks[0][j]["dispatch_bytes"]
    # all-equal router logits: every token of every layer picks the same two experts
    picked = record_routing(lopsided, prompts[0])
    assert len(torch.unique(picked)) == 2
    assert min(ranks[0][1]["dispatch_rows"], ranks[1][1]["dispatch_rows"]) == 0
