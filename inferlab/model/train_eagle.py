"""Train the EAGLE-style draft head of ``course-target`` on the course corpus, on the CPU.

    python -m inferlab.model.train_eagle                 # a few minutes on two CPU cores
    python -m inferlab.model.train_eagle --steps 50      # a quick run (not the committed head)

The target is frozen: each step runs it over random windows of the tokenized training split
(``inferlab.model.train.token_stream``, the course tokenizer) to get its features and logits,
and trains only the head (``inferlab.model.eagle``) on them with AdamW, a warm-up and a cosine
decay (the recipe of ``inferlab.model.train``). The features carry a little uniform noise, as in
EAGLE's training, and the head is unrolled on its own predictions for ``unroll`` steps. Every
``eval_every`` steps the head's top-1 agreement with the target is measured on fixed held-out
windows (the validation split). The head is stored in bfloat16 under
``data/models/course-eagle`` and the run's curve, times and machine load in
``data/measurements/eagle_training_<device>_<date>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from inferlab.model import corpus
from inferlab.model.eagle import EagleHead, head_loss, save_head, target_features
from inferlab.model.train import TrainConfig, learning_rate, token_stream, windows
from inferlab.model.weights import checkpoint_path, load_checkpoint

TARGET = "course-target"
OUT_NAME = "course-eagle"


@dataclass(frozen=True)
class HeadPlan(TrainConfig):
    """The target's training schedule (``TrainConfig``: AdamW, warm-up, cosine decay), with
    the head's sizes and its own settings: steps unrolled on its own features, the weight of
    the token loss, and the feature noise."""

    steps: int = 1200
    batch: int = 8
    seq_len: int = 128
    weight_decay: float = 0.0
    eval_every: int = 200
    eval_windows: int = 16
    unroll: int = 2
    w_cls: float = 0.1
    noise: float = 0.2


@torch.no_grad()
def evaluate(head: EagleHead, target, val: torch.Tensor, plan: HeadPlan) -> dict:
    logits, feats = target_features(target, val)
    out = head_loss(head, val, feats, logits, unroll=plan.unroll, w_cls=plan.w_cls)
    return {k: float(v) for k, v in out.items()}


def train_head(target, stream: torch.Tensor, val_stream: torch.Tensor, plan: HeadPlan,
               progress: bool = True) -> tuple[EagleHead, list[dict]]:
    from tqdm.auto import tqdm

    torch.manual_seed(plan.seed)
    gen = torch.Generator().manual_seed(plan.seed)
    noise_gen = torch.Generator().manual_seed(plan.seed + 2)
    val = windows(val_stream, plan.eval_windows, plan.seq_len,
                  torch.Generator().manual_seed(plan.seed + 1))
    for p in target.parameters():
        p.requires_grad_(False)
    head = EagleHead(target.config, target.model.embed_tokens, target.lm_head).train()
    opt = torch.optim.AdamW(head.parameters(), lr=plan.lr, betas=(0.9, 0.95),
                            weight_decay=plan.weight_decay)
    rows, running, start = [], [], time.perf_counter()

    def record(step):
        head.eval()
        ev = evaluate(head, target, val, plan)
        head.train()
        rows.append({"step": step, "train_loss": sum(running) / len(running) if running
                     else float("nan"), "val_loss": ev["loss"],
                     **{f"val_{k}": v for k, v in ev.items() if k.startswith("top1")},
                     "seconds": time.perf_counter() - start})
        running.clear()

    record(0)
    for step in tqdm(range(plan.steps), disable=not progress, mininterval=5, desc="eagle head"):
        for g in opt.param_groups:
            g["lr"] = learning_rate(step, plan)
        batch = windows(stream, plan.batch, plan.seq_len, gen)
        with torch.no_grad():
            logits, feats = target_features(target, batch)
        out = head_loss(head, batch, feats, logits, plan.unroll, plan.w_cls, plan.noise, noise_gen)
        opt.zero_grad(set_to_none=True)
        out["loss"].backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), plan.grad_clip)
        opt.step()
        running.append(float(out["loss"].detach()))
        if (step + 1) % plan.eval_every == 0 or step + 1 == plan.steps:
            record(step + 1)
    with torch.no_grad():  # the stored head is the bfloat16 one: evaluate what is saved
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return head.eval(), rows


def main(argv=None) -> int:
    from inferlab.device import DeviceInfo, cpu_name
    from inferlab.measurements import write_record

    parser = argparse.ArgumentParser(prog="python -m inferlab.model.train_eagle",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=HeadPlan.steps)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="default: data/models/course-eagle")
    parser.add_argument("--record", type=Path, default=None,
                        help="default: data/measurements/eagle_training_<device>_<date>.json")
    args = parser.parse_args(argv)
    problems = corpus.check_local_stdlib()
    if problems:
        print(f"The local standard library differs from the recorded corpus in {len(problems)} "
              "ways; the committed head would not be reproduced here.", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    plan = HeadPlan(steps=args.steps)
    load_start, t0 = os.getloadavg(), time.perf_counter()
    path = checkpoint_path(TARGET)
    target = load_checkpoint(path).eval()
    from tokenizers import Tokenizer  # optional dependency (the hf extra), as for training

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))  # the raw BPE, as train uses
    stream = token_stream(tokenizer, corpus.read_split("train"))
    val_stream = token_stream(tokenizer, corpus.held_out("validation"))
    wall, cpu = time.perf_counter(), time.process_time()
    head, rows = train_head(target, stream, val_stream, plan)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    out = args.out or path.parent / OUT_NAME
    save_head(head, out, TARGET, extra={"trained_by": "python -m inferlab.model.train_eagle"})
    size = sum(f.stat().st_size for f in Path(out).iterdir())
    last = rows[-1]
    print(f"head: {head.n_params:,} parameters, {size / 1e6:.2f} MB on disk at {out}; "
          f"{wall:.0f} s ({cpu:.0f} CPU s); held-out top-1 agreement with the target: "
          + ", ".join(f"{k} {v:.3f}" for k, v in last.items() if k.startswith("val_top1")))
    record = {"benchmark": "eagle_training", "model": f"{OUT_NAME} on {TARGET}",
              "command": "python -m inferlab.model.train_eagle "
                         + " ".join(argv if argv is not None else sys.argv[1:]),
              "plan": asdict(plan), "parameters": head.n_params, "bytes_on_disk": size,
              "train_tokens_available": int(stream.numel()),
              "tokens_seen": plan.steps * plan.batch * plan.seq_len,
              "seconds": wall, "cpu_seconds": cpu, "total_seconds": time.perf_counter() - t0,
              "machine_load": {"loadavg_start": load_start, "loadavg_end": os.getloadavg()},
              "results": rows}
    info = DeviceInfo.of("cpu", cpu_name())
    print(f"record: {write_record(record, info, args.record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
