"""Where a decode step's time goes: the model's forward against the host's work around it.

    python -m inferlab.benchmarks.host_time                 # batch 1 and batch 32, course model
    python -m inferlab.benchmarks.host_time --batches 1 8 64 --threads 1

Each engine step is host work (Python) around one forward pass: the scheduler lays the step
out (``Scheduler.schedule``), the runner builds the attention metadata (``prepare``), the model
runs, the logits are sampled (``sample``), and the scheduler records the tokens
(``Scheduler.update``). A GPU runs the forward while the host waits; the host's share is time
the accelerator idles, which is why engines overlap the next step's scheduling with the current
forward (SGLang's overlap scheduler, vLLM's async scheduling). This command serves ``--batch``
requests of ``--prompt`` tokens, greedy, ``--tokens`` each, with the engine unchanged, timing
each of the five phases with ``time.perf_counter`` around the engine's own functions, and
prints the mean per decode step: the forward, and the host work that could hide behind it.
Times are this machine's; nothing asserts them.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from inferlab.model.weights import checkpoint_path, load_checkpoint
from inferlab.serving import paged_attention as runner_module
from inferlab.serving.config import ServingConfig
from inferlab.serving.engine import Engine
from inferlab.serving.request import Request
from inferlab.serving.scheduler import Scheduler


@contextmanager
def timed_phases(model):
    """Wrap the engine's phases with timers; yields the dict of seconds per phase."""
    seconds: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    def wrap(owner, name, phase):
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                seconds[phase] += time.perf_counter() - start
                calls[phase] += 1
        setattr(owner, name, timed)
        return original

    saved = [(Scheduler, "schedule", wrap(Scheduler, "schedule", "schedule")),
             (Scheduler, "update", wrap(Scheduler, "update", "update")),
             (runner_module, "prepare", wrap(runner_module, "prepare", "metadata")),
             (runner_module, "sample", wrap(runner_module, "sample", "sample"))]
    forward = model.forward

    def timed_forward(*args, **kwargs):
        start = time.perf_counter()
        try:
            return forward(*args, **kwargs)
        finally:
            seconds["forward"] += time.perf_counter() - start
            calls["forward"] += 1
    model.forward = timed_forward
    try:
        yield seconds, calls
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
        del model.forward


def measure(model, batch: int, prompt: int = 32, tokens: int = 32) -> dict:
    """Mean seconds per step of each phase while ``batch`` sequences decode together."""
    config = ServingConfig(num_blocks=batch * ((prompt + tokens) // 16 + 2), max_batch=batch)
    g = torch.Generator().manual_seed(0)
    requests = [Request(tuple(torch.randint(3, model.config.vocab_size, (prompt,),
                                            generator=g).tolist()), tokens)  # no end token
                for _ in range(batch)]
    engine = Engine(model, config)
    with torch.inference_mode(), timed_phases(model) as (seconds, calls):
        engine.run(requests)
    steps = calls["schedule"]
    per_step = {phase: s / steps for phase, s in seconds.items()}
    per_step["host"] = sum(v for k, v in per_step.items() if k != "forward")
    per_step["steps"] = steps
    return per_step


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="course-target", help="checkpoint (default course-target)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32],
                   help="sequences decoding together (default 1 32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_checkpoint(checkpoint_path(args.model))
    print(f"{args.model}, {torch.get_num_threads()} threads; ms per step (means)")
    print(f"{'batch':>6} {'forward':>8} {'schedule':>9} {'metadata':>9} {'sample':>7} "
          f"{'update':>7} {'host':>6} {'host share':>10}")
    for b in args.batches:
        r = measure(model, b)
        ms = {k: v * 1e3 for k, v in r.items() if k != "steps"}
        print(f"{b:>6} {ms['forward']:>8.2f} {ms['schedule']:>9.2f} {ms['metadata']:>9.2f} "
              f"{ms['sample']:>7.2f} {ms['update']:>7.2f} {ms['host']:>6.2f} "
              f"{ms['host'] / (ms['host'] + ms['forward']):>10.0%}")


if __name__ == "__main__":
    main()
