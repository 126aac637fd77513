"""Where a decode step's time goes: the model's forward against the host's work around it.

    python -m inferlab.benchmarks.host_time                 # batch 1 and batch 32, course model
    python -m inferlab.benchmarks.host_time --batches 1 8 64 --threads 1
    python -m inferlab.benchmarks.host_time --threads 1 --overlap --write  # and with lookahead

Each engine step is host work (Python) around one forward pass: the scheduler lays the step
out (``Scheduler.schedule``), the runner builds the attention metadata (``prepare``), the model
runs, the logits are sampled (``sample``), and the scheduler records the tokens
(``Scheduler.update``). A GPU runs the forward while the host waits; the host's share is time
the accelerator idles, which is why engines overlap the next step's scheduling with the current
forward (SGLang's overlap scheduler, vLLM's async scheduling). This command serves ``--batch``
requests of ``--prompt`` tokens, greedy, ``--tokens`` each, with the engine unchanged, timing
each of the five phases with ``time.perf_counter`` around the engine's own functions, and
prints the seconds per step (the fastest of ``--repeats`` runs after a warm-up): the forward,
and the host work that could hide behind it.

With ``--overlap`` it then serves the same requests with and without overlap scheduling
(``ServingConfig.overlap``, ``inferlab.serving.overlap``) and prints the wall time per step of
each (the best of ``--repeats`` runs, taken in turn), the saving, and the saving the phases
predict if all of the host's work but the sampling hid behind the forward: a step of
max(host, forward + sampling) instead of host + forward + sampling. ``--write`` records it in
``data/measurements/host_time_<device>_<date>.json``. Times are this machine's; nothing asserts
them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from inferlab.analysis.formulas import overlapped_step_s
from inferlab.analysis.hardware import detect_device
from inferlab.measurements import write_record
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


def workload(model, batch: int, prompt: int = 32, tokens: int = 32, overlap: bool = False):
    """The config and the ``batch`` requests (``prompt`` tokens, ``tokens`` out, greedy, no end
    token) every measurement here serves."""
    config = ServingConfig(num_blocks=batch * ((prompt + tokens) // 16 + 2), max_batch=batch,
                           overlap=overlap)
    g = torch.Generator().manual_seed(0)
    return config, [Request(tuple(torch.randint(3, model.config.vocab_size, (prompt,),
                                                generator=g).tolist()), tokens)
                    for _ in range(batch)]


def measure(model, batch: int, prompt: int = 32, tokens: int = 32, repeats: int = 3) -> dict:
    """Seconds of each phase per step of a run serving ``batch`` requests (its one prefill step
    and its decode steps, as ``step_seconds`` counts them), from the fastest of ``repeats`` runs
    after one untimed warm-up run."""
    config, requests = workload(model, batch, prompt, tokens)
    engine = Engine(model, config)
    best = None
    with torch.inference_mode():
        engine.run(requests)  # warm-up: first calls allocate and load what later ones reuse
        for _ in range(repeats):
            with timed_phases(model) as (seconds, calls):
                steps = len(engine.run(requests).iterations)
            per_step = {phase: s / steps for phase, s in seconds.items()}
            if best is None or sum(per_step.values()) < sum(best.values()):
                best = per_step
    best["host"] = sum(v for k, v in best.items() if k != "forward")
    best["steps"] = steps
    return best


def step_seconds(model, batch: int, repeats: int = 3, prompt: int = 32,
                 tokens: int = 32) -> dict:
    """Wall seconds per step serving ``batch`` requests without and with overlap scheduling,
    each the best of ``repeats`` runs (the two taken in turn, so that a change in the
    machine's load falls on both); the tokens of the two are checked equal."""
    best, outputs = {False: float("inf"), True: float("inf")}, {}
    engines = {o: Engine(model, workload(model, batch, prompt, tokens, o)[0]) for o in best}
    requests = workload(model, batch, prompt, tokens)[1]
    with torch.inference_mode():
        for engine in engines.values():
            engine.run(requests)  # warm-up, untimed, as in ``measure``
        for _ in range(repeats):
            for overlap, engine in engines.items():
                start = time.perf_counter()
                run = engine.run(requests)
                best[overlap] = min(best[overlap],
                                    (time.perf_counter() - start) / len(run.iterations))
                outputs[overlap] = [r.tokens for r in run.results]
    if outputs[True] != outputs[False]:
        raise AssertionError("overlap scheduling changed the tokens")
    return {"plain_s": best[False], "overlap_s": best[True],
            "saving": 1 - best[True] / best[False]}


def predicted_saving(phases: dict) -> float:
    """The saving if every host phase but sampling hid behind the forward: a step of
    max(host, forward + sampling) against host + forward + sampling."""
    plain, ahead = overlapped_step_s(phases["host"] - phases["sample"],
                                     phases["forward"] + phases["sample"])
    return 1 - ahead / plain


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="course-target", help="checkpoint (default course-target)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32],
                   help="sequences decoding together (default 1 32)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--overlap", action="store_true",
                   help="also time steps with and without overlap scheduling")
    p.add_argument("--repeats", type=int, default=3, help="runs of each, the best kept")
    p.add_argument("--write", action="store_true",
                   help="record the overlap table in data/measurements/")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_checkpoint(checkpoint_path(args.model))
    print(f"{args.model}, {torch.get_num_threads()} threads; ms per step (fastest run of "
          f"{args.repeats})")
    print(f"{'batch':>6} {'forward':>8} {'schedule':>9} {'metadata':>9} {'sample':>7} "
          f"{'update':>7} {'host':>6} {'host share':>10}")
    phases = {}
    for b in args.batches:
        r = phases[b] = measure(model, b, repeats=args.repeats)
        ms = {k: v * 1e3 for k, v in r.items() if k != "steps"}
        print(f"{b:>6} {ms['forward']:>8.2f} {ms['schedule']:>9.2f} {ms['metadata']:>9.2f} "
              f"{ms['sample']:>7.2f} {ms['update']:>7.2f} {ms['host']:>6.2f} "
              f"{ms['host'] / (ms['host'] + ms['forward']):>10.0%}")
    if not args.overlap:
        return
    load = os.getloadavg()
    print(f"\nwall ms per step without and with overlap scheduling (best of {args.repeats}); "
          f"load average {load[0]:.2f}")
    print(f"{'batch':>6} {'plain':>8} {'overlap':>8} {'saving':>7} {'predicted':>9}")
    rows = []
    for b in args.batches:
        r = step_seconds(model, b, args.repeats)
        rows.append({"batch": b, "forward_ms": phases[b]["forward"] * 1e3,
                     "sample_ms": phases[b]["sample"] * 1e3, "host_ms": phases[b]["host"] * 1e3,
                     "plain_ms": r["plain_s"] * 1e3, "overlap_ms": r["overlap_s"] * 1e3,
                     "saving": r["saving"], "predicted_saving": predicted_saving(phases[b])})
        print(f"{b:>6} {rows[-1]['plain_ms']:>8.2f} {rows[-1]['overlap_ms']:>8.2f} "
              f"{r['saving']:>7.1%} {rows[-1]['predicted_saving']:>9.1%}")
    impossible = [r["batch"] for r in rows if r["plain_ms"] < r["forward_ms"]]
    if args.write and impossible:  # a whole step shorter than its own forward: the load moved
        print(f"not written: at batch {impossible} a step measured shorter than its forward "
              "alone, so the machine's load changed between the two measurements; run again "
              "on a quieter machine")
    elif args.write:
        record = {"benchmark": "host_time", "model": args.model, "rows": rows,
                  "load_average_1min": load[0], "repeats": args.repeats,
                  "command": " ".join(["python -m inferlab.benchmarks.host_time",
                                       *(argv if argv is not None else sys.argv[1:])])}
        print(f"written to {write_record(record, detect_device('cpu'))}")


if __name__ == "__main__":
    main()
