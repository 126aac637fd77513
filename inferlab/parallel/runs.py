"""Rank programs: what each process does in a tensor- or expert-parallel run.

Each function here runs inside one rank started by ``inferlab.parallel.launch.run_ranks`` and
returns plain tensors and numbers, which the parent compares with one process's results. They
live at a module's top level because the spawn start method finds them by name.
"""

from __future__ import annotations

import torch

from inferlab.model.generate import generate
from inferlab.model.llama import build_model
from inferlab.model.weights import load_checkpoint
from inferlab.parallel.tensor import AllReduce, shard_model


def _model(source, dtype=torch.float32):
    """A checkpoint directory (str or Path), or a (ModelConfig, seed) pair for a random model."""
    if isinstance(source, tuple):
        config, seed = source
        return build_model(config, seed=seed, dtype=dtype)
    return load_checkpoint(source, dtype=dtype)


@torch.inference_mode()
def tensor_parallel_run(rank: int, world_size: int, jobs: list) -> list[dict]:
    """For each job ``(source, prompt, max_new_tokens)``: rank ``rank``'s shard of the model
    runs ``prompt`` (B, T); returns its logits and greedy continuation.

    Each result also holds the all-reduce counters of the forward pass alone (calls, bytes),
    the rank's parameter count and its KV heads, so the parent can check the traffic and split.
    """
    out = []
    for source, prompt, max_new_tokens in jobs:
        full = _model(source)
        counter = AllReduce()
        part = shard_model(full, rank, world_size, counter)
        del full
        logits = part(prompt)
        calls, nbytes = counter.calls, counter.bytes
        tokens = generate(part, prompt, max_new_tokens)  # greedy, with the rank's own KV cache
        out.append({"logits": logits, "tokens": tokens, "calls": calls, "bytes": nbytes,
                    "params": sum(p.numel() for p in part.parameters()),
                    "kv_heads": part.config.n_kv_heads})
    return out

def fail_on_rank(rank: int, world_size: int, bad_rank: int) -> int:
    """Rank ``bad_rank`` raises; the others wait for it at a barrier that never completes.

    The failure a launcher must survive: a dead rank and live peers blocked in a collective.
    """
    import torch.distributed as dist

    if rank == bad_rank:
        raise RuntimeError(f"rank {rank} fails on purpose")
    dist.barrier()
    return rank


@torch.inference_mode()
def expert_parallel_run(rank: int, world_size: int, jobs: list) -> list[dict]:
    """For each job ``(source, prompts, max_new_tokens)``: rank ``rank`` of an expert-parallel MoE
    runs its own prompt ``prompts[rank]`` (B, T_r).

    ``source``: a Mixtral-layout checkpoint directory, or (MoEModelConfig, seed). Each result
    holds the logits, the greedy continuation (every rank generates the same number of tokens,
    so the ranks' all-to-alls stay in step) and the dispatch counters of the forward pass alone.
    """
    from inferlab.model.moe import build_moe_model
    from inferlab.model.weights import load_moe_checkpoint
    from inferlab.parallel.expert import DispatchCounter, shard_experts

    out = []
    for source, prompts, max_new_tokens in jobs:
        if isinstance(source, tuple):
            model = build_moe_model(source[0], seed=source[1])
        else:
            model = load_moe_checkpoint(source, dtype=torch.float32)
        counter = DispatchCounter()
        shard_experts(model, rank, world_size, counter)
        prompt = prompts[rank]
        logits = model(prompt)
        counts = dict(vars(counter))
        tokens = generate(model, prompt, max_new_tokens)
        out.append({"logits": logits, "tokens": tokens, **counts,
                    "experts_held": len(model.model.layers[0].block_sparse_moe.experts)})
    return out
