"""Where a batch-1 decode step of the engine spends its time, against the bandwidth floor.

    python -m inferlab.benchmarks.decode_profile                 # 'small', float32, 1 thread
    python -m inferlab.benchmarks.decode_profile --model tiny --context 256

Times the engine's one forward (``inferlab.serving.runner.ModelRunner.forward``) on one decode
row, then runs it under ``torch.profiler`` and sorts each operator's own CPU time into:

- the linear layers (the weight matrix-vector products: projections, MLP, LM head), with each
  weight shape's time and the bandwidth it reached (its bytes over its time);
- attention over the paged cache (the K/V store and the in-place read, its softmax);
- sampling (argmax, the check that the logits are finite);
- every other operator (norms, rotary embeddings, activations, copies, the metadata);
- the rest of the wall time: Python and operator dispatch, which the profiler does not see as
  any operator's own time.

The floor is the weights' bytes over the bandwidth measured here (``measure_bandwidth``), as in
``inferlab.benchmarks.roofline``. The profiler adds its own overhead, so its shares are read
against its own total; the step's time is measured without it. One thread by default: on a
CPU that other programs share, more threads wait at every operator's barrier.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from inferlab.analysis import formulas
from inferlab.analysis.hardware import measure_bandwidth
from inferlab.model.llama import build_model
from inferlab.serving.block_manager import blocks_for
from inferlab.serving.config import ServingConfig
from inferlab.serving.paged_int8 import pool_for
from inferlab.serving.request import Request, Sequence
from inferlab.serving.runner import ModelRunner

LINEAR = {"aten::addmm", "aten::mm", "aten::mv", "aten::addmv", "aten::bmm"}
ATTENTION = {"aten::embedding_bag", "aten::_embedding_bag", "aten::_embedding_bag_forward_only",
             "aten::_softmax", "aten::index_put_", "aten::_index_put_impl_", "aten::masked_fill_",
             "aten::_scaled_dot_product_flash_attention_for_cpu"}
SAMPLING = {"aten::argmax", "aten::isfinite", "aten::all", "aten::_local_scalar_dense"}


def decode_step(model, context: int):
    """A function of no arguments running one decode row of a sequence holding ``context``
    tokens through the engine's runner (the same slot is rewritten each call)."""
    config = ServingConfig(num_blocks=blocks_for(context, 16) + 1)
    runner = ModelRunner(model, pool_for(model, config))
    seq = Sequence.of(0, Request(tuple(range(1, context)), max_new_tokens=2))
    seq.table = runner.cache.new_table()
    seq.table.append(context)
    seq.output.append(1)
    seq.num_computed = context - 1  # its newest token is the one to run
    rows = [(seq, 1)]
    return lambda: runner.forward(rows)


def breakdown(step, calls: int = 20) -> tuple[dict[str, float], dict[tuple, tuple[float, int]]]:
    """Seconds per call of each group of operators (the profiler's own-time), and of the linear
    layers by (input, weight) shape: (seconds, calls per step)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(calls):
            step()
    groups: dict[str, float] = defaultdict(float)
    shapes: dict[tuple, list] = defaultdict(lambda: [0.0, 0])
    for event in prof.key_averages(group_by_input_shape=True):
        seconds = event.self_cpu_time_total * 1e-6 / calls
        if event.key in LINEAR:
            group = "linear layers"
            key = tuple(tuple(s) for s in event.input_shapes[:3] if s)
            shapes[key][0] += seconds
            shapes[key][1] += event.count // calls
        elif event.key in ATTENTION:
            group = "attention (K/V store, paged read, softmax)"
        elif event.key in SAMPLING:
            group = "sampling"
        else:
            group = "other operators"
        groups[group] += seconds
    return dict(groups), {k: (s, n) for k, (s, n) in shapes.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.decode_profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", help="a row of data/models.csv")
    parser.add_argument("--context", type=int, default=33, help="tokens in the sequence")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = build_model(args.model, seed=0, dtype=torch.float32)
    step = decode_step(model, args.context)
    for _ in range(3):
        step()
    walls = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step()
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    bandwidth = measure_bandwidth("cpu", num_threads=args.threads).value
    step_bytes = formulas.decode_bytes_per_step(model.config, torch.float32)
    floor = step_bytes / bandwidth
    print(f"'{model.config.name}' float32, {args.threads} thread(s), torch {torch.__version__}: "
          f"{step_bytes / 1e6:,.0f} MB of weights a step; bandwidth {bandwidth / 1e9:.1f} GB/s; "
          f"floor {floor * 1e3:.2f} ms")
    print(f"engine decode step (batch 1, {args.context} tokens): median {wall * 1e3:.2f} ms, "
          f"{floor / wall:.0%} of the floor")
    groups, shapes = breakdown(step)
    profiled = sum(groups.values())
    rest = max(0.0, wall - profiled)
    print("where the time goes (operators' own time; the rest of the wall time is Python and "
          "dispatch):")
    if rest > 0:
        groups = {**groups, "Python and dispatch (wall - operators)": rest}
    for name, seconds in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {name:45s} {seconds * 1e3:7.2f} ms  {seconds / max(wall, profiled):6.1%}")
    if rest == 0:
        print("  (the operators' time under the profiler exceeds the step's: Python and dispatch "
              "are within the profiler's own overhead)")
    print("linear layers by shape: ms a step, calls a step, GB/s of weights read")
    for key, (seconds, n) in sorted(shapes.items(), key=lambda kv: -kv[1][0]):
        weight = [s for s in key if len(s) == 2 and s[0] > 1 and s[1] > 1]
        gbs = (weight[-1][0] * weight[-1][1] * 4 * n / seconds / 1e9) if weight and seconds else 0
        print(f"  {str(key):45s} {seconds * 1e3:7.2f} ms {n:4d}x  {gbs:6.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
