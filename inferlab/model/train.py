"""Train the course's own model pair on the CPU: a BPE tokenizer, then a target and a draft.

    python -m inferlab.model.train                 # tokenizer, course-target, course-draft
    python -m inferlab.model.train --check         # only compare the local stdlib with the record
    python -m inferlab.model.train --jobs 1        # one model after the other, not side by side
    python -m inferlab.model.train --models course-moe   # the mixture of experts (Chapter 10)

The corpus is the Python standard library (``inferlab.model.corpus``); the tokenizer is
``inferlab.model.bpe``; the two shapes are the ``course-target`` and ``course-draft`` rows of
``data/models.csv`` and share the tokenizer, so Chapter 6 can use them for speculative decoding.
``course-moe`` (``inferlab.model.moe.course_moe_config``) is the target with Mixtral-style experts,
trained by the same loop with the routers' load-balancing loss added (``MOE_AUX_WEIGHT``).
Training is next-token cross-entropy on random windows of the tokenized training split, with
AdamW (Loshchilov and Hutter 2019), a linear warm-up and a cosine decay of the learning rate,
and gradient clipping: the recipe of nanoGPT, at a scale that takes minutes on two CPU cores.

The two models train side by side, each in its own process on one thread: on two cores that
halves the wall time, and on a machine shared with other work it keeps both models' steps
steady. Everything random comes from generators seeded by ``TrainConfig.seed``, so the same
seed, the same corpus and the same thread count give the same checkpoint, bit for bit. The
weights are rounded to bfloat16 at the end and stored that way (half the bytes); the rounded
model is the one that is evaluated and saved, so a loaded checkpoint gives identical logits.
Outputs go to ``data/``: the checkpoints (``models/course-*/``, Hugging Face layout), the loss
curve (``models/training_log.csv``), the training split's token counts (the unigram baseline of
``inferlab.model.quality``) and the run's times and machine load (``measurements/``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from inferlab.model import bpe, corpus
from inferlab.model.config import ModelConfig
from inferlab.model.llama import Llama, build_model
from inferlab.model.moe import (COURSE_MOE, MoEModelConfig, build_moe_model, course_moe_config,
                                load_balancing_loss, router_logits)
from inferlab.model.weights import save_checkpoint

MODELS = ("course-target", "course-draft")
TRAINABLE = (*MODELS, COURSE_MOE)
# Weight of the load-balancing loss beside the cross-entropy: our choice, small enough that the
# language-model loss leads, large enough that no expert starves in a short run.
MOE_AUX_WEIGHT = 0.01
STORAGE_DTYPE = torch.bfloat16


@dataclass(frozen=True)
class TrainConfig:
    """How one model is trained. A step sees ``batch`` windows of ``seq_len + 1`` tokens."""

    steps: int
    batch: int = 4
    seq_len: int = 512
    lr: float = 3e-3
    warmup: int = 20
    final_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 50
    eval_windows: int = 24
    seed: int = 0


# At this budget a two-layer model learns more per CPU-second than a six-layer one: trained as
# long, the draft would overtake its target. It gets fewer steps, as real drafts get less
# training than their targets; the target gets as many as fit in the time limit.
# The MoE gets what two shared CPU cores allow in about twenty minutes; it is compared with the
# target's validation loss at the same step (data/models/training_log.csv), not at the end.
PLANS = {"course-target": TrainConfig(steps=2400), "course-draft": TrainConfig(steps=1000),
         COURSE_MOE: TrainConfig(steps=1500)}


def model_config(name: str) -> ModelConfig:
    """The shape trained under ``name``: a row of data/models.csv, or the course's MoE."""
    return course_moe_config() if name == COURSE_MOE else ModelConfig.from_name(name)


def build(config: ModelConfig, seed: int = 0) -> Llama:
    """A fresh model of ``config``: dense, or a mixture of experts for an ``MoEModelConfig``."""
    if isinstance(config, MoEModelConfig):
        return build_moe_model(config, seed=seed)
    return build_model(config, seed=seed)


def learning_rate(step: int, plan: TrainConfig) -> float:
    """Linear warm-up to ``lr``, then a cosine down to ``final_lr_ratio * lr`` at the last step."""
    if step < plan.warmup:
        return plan.lr * (step + 1) / plan.warmup
    progress = (step - plan.warmup) / max(1, plan.steps - plan.warmup)
    return plan.lr * (plan.final_lr_ratio + (1 - plan.final_lr_ratio)
                      * 0.5 * (1 + math.cos(math.pi * progress)))


def token_stream(tokenizer, files: list[corpus.Document]) -> torch.Tensor:
    """All documents of ``files``, each followed by the end-of-sequence id, as one 1-D tensor."""
    ids = bpe.encode_documents(tokenizer, corpus.documents(files))
    return torch.tensor([t for doc in ids for t in doc], dtype=torch.long)


def windows(stream: torch.Tensor, count: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """``count`` windows of ``length`` consecutive tokens at random offsets: (count, length)."""
    if stream.numel() <= length:
        raise ValueError(f"the token stream has {stream.numel()} tokens; a window needs "
                         f"{length + 1}")
    starts = torch.randint(0, stream.numel() - length, (count,), generator=gen)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def window_loss(model: Llama, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of a (B, T + 1) batch of windows."""
    logits = model(batch[:, :-1])  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def training_loss(model: Llama, batch: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The loss minimised on one batch and its cross-entropy part (nats per token).

    A mixture of experts adds ``MOE_AUX_WEIGHT`` times its routers' load-balancing loss.
    """
    if not isinstance(model.config, MoEModelConfig):
        loss = window_loss(model, batch)
        return loss, float(loss.detach())
    with router_logits(model) as logits:
        ce = window_loss(model, batch)
    aux = load_balancing_loss(logits, model.config.experts_per_token)
    return ce + MOE_AUX_WEIGHT * aux, float(ce.detach())


@torch.no_grad()
def round_weights(model: Llama, dtype: torch.dtype = STORAGE_DTYPE) -> Llama:
    """Round every weight to ``dtype`` and back, in place: the values a ``dtype`` file holds."""
    for p in model.parameters():
        p.copy_(p.to(dtype).to(p.dtype))
    return model


def _optimizer(model: Llama, plan: TrainConfig) -> torch.optim.AdamW:
    # Weight decay on matrices only (nanoGPT): norms' gains are not decayed towards zero.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": plan.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=plan.lr, betas=(0.9, 0.95), eps=1e-8)


def train_model(config: ModelConfig, stream: torch.Tensor, val_stream: torch.Tensor,
                plan: TrainConfig, progress: bool = True, position: int = 0
                ) -> tuple[Llama, list[dict]]:
    """Train a fresh ``config`` model on ``stream``; the rounded model and its loss curve.

    Each row of the curve: step, tokens seen, learning rate, the mean training loss since the
    last row and the validation loss on fixed windows of ``val_stream`` (nats per token).
    """
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(plan.seed)
    val = windows(val_stream, plan.eval_windows, plan.seq_len + 1,
                  torch.Generator().manual_seed(plan.seed + 1))
    model = build(config, seed=plan.seed).train()
    optimizer = _optimizer(model, plan)
    rows, running, start = [], [], time.perf_counter()

    def record(step: int) -> None:
        model.eval()
        with torch.no_grad():
            val_loss = float(window_loss(model, val))
        model.train()
        rows.append({"step": step, "tokens": step * plan.batch * plan.seq_len,
                     "lr": learning_rate(max(step - 1, 0), plan),
                     "train_loss": sum(running) / len(running) if running else float("nan"),
                     "val_loss": val_loss, "seconds": time.perf_counter() - start})
        running.clear()

    record(0)
    bar = tqdm(range(plan.steps), desc=config.name, disable=not progress, mininterval=2,
               position=position)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, plan)
        loss, ce = training_loss(model, windows(stream, plan.batch, plan.seq_len + 1, gen))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), plan.grad_clip)
        optimizer.step()
        running.append(ce)
        if (step + 1) % plan.eval_every == 0 or step + 1 == plan.steps:
            record(step + 1)
            bar.set_postfix(train=f"{rows[-1]['train_loss']:.3f}",
                            val=f"{rows[-1]['val_loss']:.3f}")
    round_weights(model.eval())
    return model, rows


def save_course_model(model: Llama, tokenizer, path: str | Path) -> Path:
    """The Hugging Face layout: config.json, model.safetensors (bfloat16), tokenizer files.

    config.json asks for float32 (``torch_dtype``): the stored bfloat16 values load exactly
    into float32, the dtype the CPU computes fastest in, so the loaded model is the saved one.
    """
    path = save_checkpoint(model, path, dtype=STORAGE_DTYPE)
    eos = tokenizer.token_to_id(bpe.EOS_TOKEN)
    config = path / "config.json"
    hf = json.loads(config.read_text(encoding="utf-8"))
    hf.update({"torch_dtype": "float32", "eos_token_id": eos, "bos_token_id": eos})
    config.write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    bpe.save_tokenizer(tokenizer, path)
    return path


def write_table(rows: list[dict], path: Path) -> Path:
    """``rows`` as CSV; the columns are every row's keys in first-seen order (rows kept from an
    older log may lack a newer column, which is left empty)."""
    fields = list(dict.fromkeys(key for row in rows for key in row))
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def _format(row: dict) -> dict:
    return {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare the local standard library with the record, then stop")
    parser.add_argument("--allow-mismatch", action="store_true",
                        help="train even where the local standard library differs from the record")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=TRAINABLE)
    parser.add_argument("--steps", type=int, help="override both plans' step counts (quick runs)")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads per model (default 1: the committed checkpoints were "
                             "trained so, and another count rounds differently)")
    parser.add_argument("--jobs", type=int, default=2, choices=(1, 2),
                        help="models trained at once, each in its own process (default 2)")
    parser.add_argument("--out", type=Path, default=None, help="default: the course's data/")
    args = parser.parse_args(argv)
    problems = corpus.check_local_stdlib()
    if problems:
        print(f"The local standard library differs from the recorded corpus "
              f"(data/corpus/manifest.csv) in {len(problems)} ways, e.g.:", file=sys.stderr)
        print("\n".join(f"  {p}" for p in problems[:10]), file=sys.stderr)
        if args.check or not args.allow_mismatch:
            print("Training here would not reproduce the committed checkpoints. Train with the "
                  "recorded Python, or pass --allow-mismatch to train on this one anyway "
                  "(python -m inferlab.model.corpus re-records the corpus).", file=sys.stderr)
            return 1
        print("--allow-mismatch: training on this machine's files anyway.", file=sys.stderr)
    elif args.check:
        print(f"The local standard library matches the recorded corpus (Python "
              f"{corpus.recorded_version()}).")
        return 0
    return run(args)


def _train_one(name: str, plan: TrainConfig, stream, val_stream, threads: int, position: int):
    """One model in a worker process: its weights, loss curve, wall and CPU seconds."""
    torch.set_num_threads(threads)
    wall, cpu = time.perf_counter(), time.process_time()
    model, rows = train_model(model_config(name), stream, val_stream, plan,
                              position=position)
    return model.state_dict(), rows, time.perf_counter() - wall, time.process_time() - cpu


def run(args) -> int:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from inferlab.device import DeviceInfo, cpu_name
    from inferlab.measurements import write_record

    torch.set_num_threads(args.threads)
    data = args.out or corpus.corpus_dir().parent
    (data / "models").mkdir(parents=True, exist_ok=True)
    load = {"loadavg_start": os.getloadavg()}
    start = time.perf_counter()
    train_files = corpus.read_split("train")
    tokenizer = bpe.train_tokenizer(corpus.documents(train_files),
                                    ModelConfig.from_name(MODELS[0]).vocab_size)
    stream = token_stream(tokenizer, train_files)
    val_stream = token_stream(tokenizer, corpus.held_out("validation"))
    seconds = {"tokenizer": time.perf_counter() - start}
    counts = torch.bincount(stream, minlength=tokenizer.get_vocab_size())
    source = "python -m inferlab.model.train: the train split of data/corpus/manifest.csv"
    write_table([{"token_id": i, "count": int(c), "source": source} for i, c in enumerate(counts)],
                data / "models" / "train_token_counts.csv")
    plans = {name: PLANS[name] if args.steps is None else
             TrainConfig(**{**PLANS[name].__dict__, "steps": args.steps}) for name in args.models}
    with ProcessPoolExecutor(max_workers=args.jobs, mp_context=get_context("spawn")) as pool:
        jobs = {name: pool.submit(_train_one, name, plans[name], stream, val_stream,
                                  args.threads, i) for i, name in enumerate(args.models)}
        results = {name: job.result() for name, job in jobs.items()}
    log, summary = [], {}
    for name, (state, rows, wall, cpu) in results.items():
        model = build(model_config(name))
        model.load_state_dict(state)
        save_course_model(model, tokenizer, data / "models" / name)
        log += [_format({"model": name, **row, "source": "python -m inferlab.model.train"})
                for row in rows]
        seconds[name] = wall
        summary[name] = {"parameters": sum(p.numel() for p in model.parameters()),
                         "steps": plans[name].steps, "tokens": rows[-1]["tokens"],
                         "final_val_loss": rows[-1]["val_loss"], "seconds": wall,
                         "cpu_seconds": cpu}
        print(f"{name}: {summary[name]}", flush=True)
    log_path = data / "models" / "training_log.csv"
    if log_path.is_file():  # keep the curves of the models not retrained this time
        with open(log_path, newline="", encoding="utf-8") as f:
            kept = [row for row in csv.DictReader(f) if row["model"] not in results]
        log = kept + log
    write_table(log, log_path)
    load["loadavg_end"] = os.getloadavg()
    record = {"benchmark": "course_models_training", "model": ",".join(args.models),
              "seconds": seconds, "total_seconds": time.perf_counter() - start,
              "models": summary, "train_tokens": int(stream.numel()), "jobs": args.jobs,
              "cpu_cores": os.cpu_count(), "machine_load": load,
              "command": "python -m inferlab.model.train " + " ".join(sys.argv[1:])}
    out = None if args.out is None else args.out / "measurements" / "course_models_training.json"
    print(f"record: {write_record(record, DeviceInfo.of('cpu', cpu_name()), out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
