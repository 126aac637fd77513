"""Where a batch-1 decode step of the engine spends its time, against the bandwidth floor.

    python -m inferlab.benchmarks.decode_profile                 # 'small', float32, 1 thread
    python -m inferlab.benchmarks.decode_profile --model tiny --context 256
    python -m inferlab.benchmarks.decode_profile --write         # a record in data/measurements

Times the engine's one forward (``inferlab.serving.paged_attention.ModelRunner.forward``) on
one decode row, then runs it under ``torch.profiler`` and sorts each operator's own CPU time into:

- the linear layers (the weight matrix-vector products: projections, MLP, LM head), with each
  weight shape's time and the bandwidth it reached (its bytes over its time);
- attention over the paged cache (the K/V store and the in-place read, its softmax);
- sampling (argmax, the check that the logits are finite);
- every other operator (norms, rotary embeddings, activations, copies, the metadata);
- the rest of the wall time: Python and operator dispatch, which the profiler does not see as
  any operator's own time.

The floor is the weights' bytes over the bandwidth measured here (``measure_bandwidth``'s, from
its two streams, ``stream_rates``), as in
``inferlab.benchmarks.roofline``. The profiler adds its own overhead, so its shares are read
against its own total; the step's time is measured without it. One thread by default: on a
CPU that other programs share, more threads wait at every operator's barrier.

Then it separates the kernel from the engine, each timed alone on the same thread:

- the memory itself: the bandwidth probe's read-only stream (a sum) and copy, over a buffer
  larger than the caches, each rate reported;
- the matrix-vector kernel alone: every weight matrix of the model multiplied by one vector, in
  the model's order, as the model stores them ((out, in), what ``F.linear`` reads), and the same
  bytes stored the other way round ((in, out), ``x @ W``), each its fastest run as the memory
  probe's are: if the kernel reached the read stream's rate, the two would take the same time;
- the bare model's decode step over a contiguous cache (``inferlab.model.kv_cache``), which is
  the engine's step without its scheduler, block tables, metadata and sampling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from inferlab.analysis import formulas
from inferlab.analysis.hardware import detect_device, stream_rates
from inferlab.measurements import write_record
from inferlab.model.kv_cache import KVCache
from inferlab.model.llama import build_model
from inferlab.serving.paged_cache import blocks_for
from inferlab.serving.config import ServingConfig
from inferlab.serving.paged_int8 import pool_for
from inferlab.serving.request import Request, Sequence, Span
from inferlab.serving.paged_attention import ModelRunner
from inferlab.timing import time_fn

COMMAND = "python -m inferlab.benchmarks.decode_profile"

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
    seq = Sequence(0, Request(tuple(range(1, context)), max_new_tokens=2))
    seq.table = runner.cache.new_table()
    seq.table.append(context)
    seq.output.append(1)
    seq.num_computed = context - 1  # its newest token is the one to run
    rows = [Span(seq, 1, context - 1, prefill=False, emits=True)]
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


def bare_step(model, context: int):
    """One decode step of the model alone over a contiguous cache holding ``context`` tokens
    (the same slot rewritten each call): the engine's step without the engine."""
    cache = KVCache.for_model(model, 1, max_len=context + 1)
    cache.length = context
    token = torch.ones(1, 1, dtype=torch.long)
    position = torch.tensor([context])

    @torch.inference_mode()
    def step():
        cache.length = context
        return model(token, position, cache)[:, -1].argmax(-1)
    return step


def gemv_rates(model, min_run_time: float = 1.0) -> dict[str, float]:
    """Bytes per second of the matrix-vector kernel over the model's own weights, stored (out, in)
    as the model holds them and (in, out); the fastest run, as the memory probe takes its."""
    weights = [m.weight.detach() for m in model.modules() if isinstance(m, torch.nn.Linear)]
    total = sum(w.numel() * w.element_size() for w in weights)
    xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in weights}
    flipped = [w.t().contiguous() for w in weights]

    def stored():
        for w in weights:
            F.linear(xs[w.shape[1]], w)

    def other_way():
        for w in flipped:
            xs[w.shape[0]] @ w
    with torch.inference_mode():
        return {"gemv_as_stored": total / time_fn(stored, min_run_time=min_run_time).min_s,
                "gemv_in_out_layout": total / time_fn(other_way, min_run_time=min_run_time).min_s}


def measure(model_name: str = "small", context: int = 33, threads: int = 1,
            repeats: int = 30) -> tuple[dict, dict, dict]:
    """The step, the floor, the kernel probes and the profile: (record, groups, shapes)."""
    torch.set_num_threads(threads)
    model = build_model(model_name, seed=0, dtype=torch.float32)

    step = decode_step(model, context)
    steps = (step, bare_step(model, context))
    walls: tuple[list, list] = ([], [])
    for i in range(3 + repeats):  # alternating, so that a change of load treats both alike
        for fn, times in zip(steps, walls):
            t0 = time.perf_counter()
            fn()
            if i >= 3:  # three warm-up calls each
                times.append(time.perf_counter() - t0)
    wall, bare = (statistics.median(times) for times in walls)
    _, streams = stream_rates("cpu", num_threads=threads)  # measure_bandwidth's two streams
    bandwidth = max(rate for rate, _ in streams.values())  # and its choice: the faster
    step_bytes = formulas.decode_bytes_per_step(model.config, torch.float32)
    groups, shapes = breakdown(step)
    profiled = sum(groups.values())
    record = {"benchmark": "decode_profile", "model": model.config.name, "dtype": "float32",
              "context": context, "weight_bytes": step_bytes, "probe_bandwidth": bandwidth,
              "floor_s": step_bytes / bandwidth, "engine_step_s": wall, "bare_model_step_s": bare,
              "fraction_of_floor": step_bytes / bandwidth / wall,
              "kernel_bytes_per_s": {"read_stream": streams["read"][0],
                                     "copy": streams["copy"][0], **gemv_rates(model)},
              "profile_shares": {name: seconds / profiled for name, seconds in groups.items()}}
    return record, groups, shapes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.decode_profile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="small", help="a row of data/models.csv")
    parser.add_argument("--context", type=int, default=33, help="tokens in the sequence")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls")
    parser.add_argument("--write", action="store_true",
                        help="write a record to data/measurements/")
    args = parser.parse_args(argv)
    record, groups, shapes = measure(args.model, args.context, args.threads, args.repeats)
    wall, floor, bandwidth = record["engine_step_s"], record["floor_s"], record["probe_bandwidth"]
    print(f"'{record['model']}' float32, {args.threads} thread(s), torch {torch.__version__}: "
          f"{record['weight_bytes'] / 1e6:,.0f} MB of weights a step; bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s; floor {floor * 1e3:.2f} ms")
    print(f"engine decode step (batch 1, {args.context} tokens): median {wall * 1e3:.2f} ms, "
          f"{floor / wall:.0%} of the floor; the bare model's step "
          f"{record['bare_model_step_s'] * 1e3:.2f} ms")
    rates = record["kernel_bytes_per_s"]
    print("one thread's rates (GB/s): read stream {read_stream:.1f}, copy {copy:.1f}; the "
          "matrix-vector kernel over the model's weights {gemv_as_stored:.1f} as stored "
          "(out, in), {gemv_in_out_layout:.1f} stored (in, out)".format(
              **{k: v / 1e9 for k, v in rates.items()}))
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
    if args.write:
        record["command"] = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
        print(f"written to {write_record(record, detect_device('cpu'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
