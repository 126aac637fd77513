"""The course's trained mixture of experts on real text: quality, routing, and decode-step bytes.

    python -m inferlab.parallel.bench_moe --out data/measurements/course_moe_cpu.json

Four measurements of ``course-moe`` (``inferlab.model.moe.course_moe_config``), each beside its
reference, on the held-out test split of the course corpus:

1. **Quality.** Perplexity of ``course-moe`` and of the dense ``course-target`` on the test split,
   and the validation loss at equal tokens seen: the MoE's checkpoint on the training script's own
   validation windows (``inferlab.model.train``: same seed, same windows), beside the target's at
   the same step in ``data/models/training_log.csv`` (the target trained on for longer).
2. **Router load.** Tokens per expert in every layer over ``--windows`` windows of text, and the
   imbalance (busiest expert over the mean, ``inferlab.model.routing``).
3. **Distinct experts against batch.** A decode step of B sequences routes B tokens, one from
   each; groups of B tokens drawn from B random places in the text give the experts touched per
   layer, against E [1 - (1 - k/E)^B] (``inferlab.analysis.moe.expected_experts``).
4. **Decode-step bytes.** B real sequences are prefilled and one decode step runs; forward hooks
   on the experts count which ones actually ran, and the step's weight bytes (bfloat16, the
   checkpoint's storage) are set beside ``MoEConfig.decode_bytes_per_step``'s uniform-routing
   prediction for the same shape.

Counts, not times: nothing here depends on the machine's speed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from inferlab.analysis.moe import MoEConfig, expected_experts
from inferlab.device import bytes_per_element
from inferlab.model import corpus
from inferlab.model.generate import decode_one_token, prefill
from inferlab.model.kv_cache import KVCache
from inferlab.model.moe import COURSE_MOE, MoEModelConfig
from inferlab.model.quality import perplexity, token_ids
from inferlab.model.routing import distinct_experts, expert_load, imbalance, record_routing

BATCHES = (1, 2, 4, 8, 16, 32, 64)
STORAGE = "bfloat16"


def analysis_shape(config: MoEModelConfig) -> MoEConfig:
    """The runnable model's shape as ``inferlab.analysis.moe`` counts bytes for it."""
    return MoEConfig(name=config.name, n_layers=config.n_layers, dense_layers=0,
                     d_model=config.d_model, vocab_size=config.vocab_size,
                     tie_embeddings=config.tie_embeddings, n_heads=config.n_heads,
                     n_experts=config.n_experts, n_shared_experts=0,
                     experts_per_token=config.experts_per_token, expert_ffn_dim=config.ffn_dim,
                     n_kv_heads=config.n_kv_heads, head_dim=config.head_dim,
                     max_seq_len=config.max_seq_len)


@torch.inference_mode()
def validation_loss(model, checkpoint: Path, steps: int) -> float:
    """``model``'s loss on the validation windows ``inferlab.model.train`` evaluates on."""
    from tokenizers import Tokenizer

    from inferlab.model import train

    plan = train.PLANS[COURSE_MOE]
    stream = train.token_stream(Tokenizer.from_file(str(checkpoint / "tokenizer.json")),
                                corpus.held_out("validation"))
    val = train.windows(stream, plan.eval_windows, plan.seq_len + 1,
                        torch.Generator().manual_seed(plan.seed + 1))
    return float(train.window_loss(model, val))


def validation_loss_at(step: int, log_rows: list[dict], model: str) -> float:
    """A model's validation loss at ``step`` in training_log.csv's rows."""
    for row in log_rows:
        if row["model"] == model and int(row["step"]) == step:
            return float(row["val_loss"])
    raise ValueError(f"{model} has no validation loss at step {step} in the training log")


def distinct_by_batch(experts: torch.Tensor, batch: int, groups: int, gen) -> list[float]:
    """Mean distinct experts per layer over ``groups`` random sets of ``batch`` tokens.

    ``experts`` (L, N, k): the routing of N tokens of text. Tokens are drawn without replacement
    within a set, as the B sequences of a decode step are different sequences.
    """
    L, N, _ = experts.shape
    counts = torch.zeros(L)
    for _ in range(groups):
        pick = torch.randperm(N, generator=gen)[:batch]
        counts += torch.tensor([distinct_experts(experts[layer, pick]) for layer in range(L)],
                               dtype=torch.float32)
    return (counts / groups).tolist()


@torch.inference_mode()
def decode_step_experts(model, prompts: torch.Tensor) -> int:
    """Experts that ran, summed over layers, in one decode step after prefilling ``prompts``."""
    cache = KVCache.for_model(model, prompts.shape[0], max_len=prompts.shape[1] + 1)
    token = prefill(model, prompts, cache).argmax(dim=-1)  # (B,)
    ran = []
    handles = [expert.register_forward_hook(lambda m, i, o: ran.append(m))
               for layer in model.model.layers for expert in layer.block_sparse_moe.experts]
    try:
        decode_one_token(model, token, cache)
    finally:
        for h in handles:
            h.remove()
    return len(ran)


def measure(moe, target, tokenizer, log_rows: list[dict], steps: int, moe_val_loss: float,
            windows: int = 8, window: int = 256, groups: int = 64, seed: int = 0) -> dict:
    c = moe.config
    docs = [doc.text for doc in corpus.held_out("test")]
    gen = torch.Generator().manual_seed(seed)
    stream = torch.tensor(token_ids(tokenizer, docs), dtype=torch.long)
    starts = torch.randint(0, stream.numel() - window, (windows,), generator=gen)
    text = torch.stack([stream[s:s + window] for s in starts.tolist()])  # (W, T)
    experts = record_routing(moe, text)  # (L, W*T, k)
    load = expert_load(experts, c.n_experts)  # (L, E)
    shape = analysis_shape(c)
    per_expert = shape.expert_params * bytes_per_element(STORAGE)
    lookup = 0 if c.tie_embeddings else c.vocab_size * c.d_model
    fixed = (shape.params(0) - lookup) * bytes_per_element(STORAGE)  # all but the routed experts
    rows = []
    for B in BATCHES:
        prompt_starts = torch.randint(0, stream.numel() - 64, (B,), generator=gen)
        prompts = torch.stack([stream[s:s + 64] for s in prompt_starts.tolist()])  # (B, 64)
        ran = decode_step_experts(moe, prompts)
        rows.append({"batch": B,
                     "distinct_experts_text": distinct_by_batch(experts, B, groups, gen),
                     "expected_experts_uniform": expected_experts(B, c.n_experts,
                                                                  c.experts_per_token),
                     "decode_experts_run_per_layer": ran / c.n_layers,
                     "decode_step_bytes": fixed + ran * per_expert,
                     "predicted_step_bytes_uniform": shape.decode_bytes_per_step(B, STORAGE)})
    return {
        "model": c.name, "n_experts": c.n_experts, "experts_per_token": c.experts_per_token,
        "expert_ffn_dim": c.ffn_dim, "dense_ffn_dim": target.config.ffn_dim,
        "total_params": sum(p.numel() for p in moe.parameters()),
        "active_params": shape.active_params(),
        "dense_params": sum(p.numel() for p in target.parameters()),
        "test_perplexity": {c.name: perplexity(moe, tokenizer, docs),
                            target.config.name: perplexity(target, tokenizer, docs)},
        "val_loss_at_equal_steps": {"step": steps,
                                    c.name: moe_val_loss,
                                    target.config.name: validation_loss_at(
                                        steps, log_rows, target.config.name)},
        "routing_tokens": int(text.numel()), "load_per_expert": load.tolist(),
        "imbalance": imbalance(load).tolist(), "groups_per_batch": groups,
        "by_batch": rows}


def main(argv=None) -> int:
    from inferlab.analysis.hardware import detect_device
    from inferlab.data import read_table
    from inferlab.measurements import write_record
    from inferlab.model.train import PLANS
    from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer

    parser = argparse.ArgumentParser(prog="python -m inferlab.parallel.bench_moe",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the results here, with provenance")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    moe = load_checkpoint(checkpoint_path(COURSE_MOE))
    target = load_checkpoint(checkpoint_path("course-target"))
    tokenizer = load_tokenizer(checkpoint_path(COURSE_MOE), model=moe)
    steps = PLANS[COURSE_MOE].steps
    result = measure(moe, target, tokenizer, read_table("models/training_log.csv"), steps,
                     validation_loss(moe, checkpoint_path(COURSE_MOE), steps))
    print(f"test perplexity: {result['test_perplexity']}")
    print(f"validation loss at step {PLANS[COURSE_MOE].steps}: {result['val_loss_at_equal_steps']}")
    print("imbalance per layer: " + ", ".join(f"{x:.2f}" for x in result["imbalance"]))
    for row in result["by_batch"]:
        text = sum(row["distinct_experts_text"]) / len(row["distinct_experts_text"])
        print(f"B={row['batch']:3d}: distinct experts {text:.2f} (uniform "
              f"{row['expected_experts_uniform']:.2f}); decode step ran "
              f"{row['decode_experts_run_per_layer']:.2f} per layer, "
              f"{row['decode_step_bytes'] / 1e6:.2f} MB vs "
              f"{row['predicted_step_bytes_uniform'] / 1e6:.2f} MB predicted")
    if args.out:
        record = {"benchmark": "course_moe", "dtype_counted": STORAGE,
                  "command": " ".join(["python -m inferlab.parallel.bench_moe",
                                       *(argv if argv is not None else sys.argv[1:])]),
                  **result}
        print(f"wrote {write_record(record, detect_device('cpu'), args.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
