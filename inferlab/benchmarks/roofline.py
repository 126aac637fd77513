"""Chapter 1's numbers for the machine it runs on: its roofline and batch-1 decode on it.

    python -m inferlab.benchmarks.roofline            # sizes from the device profile
    python -m inferlab.benchmarks.roofline --threads 1  # on a CPU that other programs share
    python -m inferlab.benchmarks.roofline --json out.json

Measures memory bandwidth (a large copy) and peak matmul FLOP/s in the profile's dtype, gives
the ridge point and critical batch size they imply, then times one batch-1 decode step of the
profile's decode model and reports it against the bandwidth floor (weight bytes per step /
measured bandwidth). Lab 1 does the same step by step; this is the one-command version. A GPU run
is recorded in ``data/measurements/``.

On a CPU that other programs share, use ``--threads 1``: every one of the ~100 operations of a
decode step ends at a barrier where its threads meet, and when another program holds one of
the cores the barrier waits a whole scheduler time slice. On the course's 2-core machine under
a load of 3-4, batch-1 decode of 'small' took 97-1,365 ms with 2 threads and 44-52 ms with one,
when the copy probe's floor is 45-63 ms.
"""

from __future__ import annotations

import argparse
import sys

import torch

from inferlab.analysis import formulas
from inferlab.analysis.decode_timing import cached_step_seconds
from inferlab.device import bytes_per_element, choose_profile
from inferlab.analysis.hardware import detect_device, measure_bandwidth, measure_peak_flops
from inferlab.measurements import write_record
from inferlab.model.llama import build_model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferlab.benchmarks.roofline",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=None, help="also write the record here")
    parser.add_argument("--context", type=int, default=32, help="tokens in the cache (default 32)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads, for the "
                        "probes and the decode alike")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    profile = choose_profile()
    info = detect_device(profile.device)
    dtype = str(profile.dtype).removeprefix("torch.")
    print(f"{info.name} ({info.device}, {info.threads} threads, torch {info.torch_version}); "
          f"profile {profile.name}, {dtype}")
    bw = measure_bandwidth(profile.device)
    peak = measure_peak_flops(profile.dtype, profile.device)
    ridge = formulas.ridge_point(peak.value, bw.value)
    critical = formulas.critical_batch_size(peak.value, bw.value, bytes_per_element(profile.dtype))
    print(f"bandwidth {bw.value / 1e9:,.1f} GB/s; peak {peak.value / 1e9:,.1f} GFLOP/s ({dtype}); "
          f"ridge {ridge:.1f} FLOP/B; critical batch {critical:.1f}")
    if info.spec:
        print(f"  datasheet ({info.spec.name}): {bw.value / info.spec.bandwidth:.0%} of its "
              f"bandwidth")

    model = build_model(profile.decode_model, seed=0, device=profile.device, dtype=profile.dtype)
    step_bytes = formulas.decode_bytes_per_step(model.config, profile.dtype)
    seconds = cached_step_seconds(model, args.context + 1, batch=1,
                                  min_run_time=profile.min_run_time)
    floor = formulas.decode_time_floor(step_bytes, bw.value)
    utilisation = formulas.bandwidth_utilisation(step_bytes, seconds, bw.value)
    print(f"batch-1 decode of '{model.config.name}' ({step_bytes / 1e6:,.0f} MB a step): "
          f"{seconds * 1e3:.2f} ms/token; floor {floor * 1e3:.2f} ms; "
          f"{utilisation:.0%} of the measured bandwidth")

    if args.json or profile.device == "cuda":
        record = {"benchmark": "roofline",
                  "command": "python -m inferlab.benchmarks.roofline " + " ".join(
                      argv if argv is not None else sys.argv[1:]),
                  "model": model.config.name, "dtype": dtype,
                  "bandwidth_bytes_per_s": bw.value, "peak_flops": peak.value,
                  "ridge_flop_per_byte": ridge, "critical_batch": critical,
                  "decode_bytes_per_step": step_bytes, "decode_s_per_token": seconds,
                  "decode_floor_s": floor, "bandwidth_utilisation": utilisation}
        print(f"wrote {write_record(record, info, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
