"""Checks for Lab 1, "Measure your own roofline". Oracles: the formulas in ``inferlab.analysis.formulas``."""

from __future__ import annotations

from inferlab.analysis import formulas
from inferlab.course.checks import expect_close, run_check

# Points per exercise for the grader's score (inferlab.course.grade; an instructor's
# --weights file overrides them): more for the exercises that are more code.
WEIGHTS = {"1.1a": 1, "1.1b": 1, "1.2": 1, "1.3": 1, "1.4": 1}

# (peak FLOP/s, bandwidth bytes/s) pairs: an H100 SXM, a T4, and a CPU-like machine.
_ROOFS = [(989e12, 3.35e12), (65e12, 320e9), (200e9, 36e9)]


def ridge_point(fn):
    """Exercise 1.1a: ``ridge_point(peak_flops, bandwidth)`` in FLOP/byte."""
    def cases(f):
        for peak, bw in _ROOFS:
            expect_close(f"ridge_point({peak:g}, {bw:g})", f(peak, bw),
                         formulas.ridge_point(peak, bw), rel=1e-9, unit=" FLOP/B",
                         hint="the ridge is where bandwidth x intensity reaches the peak: "
                              "solve bandwidth * I = peak for I.")
    return run_check("1.1a", "ridge_point", fn, formulas.ridge_point, cases,
                     success="an H100 SXM needs about 295 FLOPs per byte to leave the slope.")


def decode_time_floor(fn):
    """Exercise 1.1b: ``decode_time_floor(bytes_per_token, bandwidth)`` in seconds."""
    def cases(f):
        for nbytes, bw in [(140e9, 3.35e12), (13.5e9, 2.039e12), (2.5e8, 36e9)]:
            expect_close(f"decode_time_floor({nbytes:g}, {bw:g})", f(nbytes, bw),
                         formulas.decode_time_floor(nbytes, bw), rel=1e-9, unit=" s",
                         hint="each token must read every byte once; time = bytes / (bytes per second).")
    return run_check("1.1b", "decode_time_floor", fn, formulas.decode_time_floor, cases,
                     success="a 70B model in 16-bit needs at least 42 ms a token on 3.35 TB/s.")


def matmul_intensity(fn):
    """Exercise 1.2: ``matmul_intensity(m, n, k, bytes_per_element)`` in FLOP/byte."""
    shapes = [(1, 4096, 4096, 2), (64, 4096, 4096, 2), (4096, 4096, 4096, 2),
              (8, 1024, 512, 4), (3, 5, 7, 1)]

    def cases(f):
        for m, n, k, b in shapes:
            expected = formulas.matmul_intensity(m, n, k, b)
            got = f(m, n, k, b)
            hint = ("a matmul does 2*m*n*k FLOPs (a multiply and an add per term); it must read "
                    "A (m x k) and B (k x n) and write C (m x n), each element once.")
            try:
                if abs(float(got) - expected / 2) <= 1e-6 * expected:
                    hint = "you are off by exactly 2: count a multiply AND an add per term."
                elif abs(float(got) - 2 * m * n * k / ((m * k + k * n) * b)) <= 1e-6 * expected:
                    hint = "you left out the bytes of the output C (m x n), which must be written."
            except (TypeError, ValueError):
                pass
            expect_close(f"matmul_intensity(m={m}, n={n}, k={k}, bytes_per_element={b})", got,
                         expected, rel=1e-6, unit=" FLOP/B", hint=hint)
    return run_check("1.2", "matmul_intensity", fn, formulas.matmul_intensity, cases,
                     success="a matrix-vector product (m=1) sits near 1 FLOP/B in 16-bit.")


def critical_batch(fn):
    """Exercise 1.3: ``critical_batch(peak_flops, bandwidth, bytes_per_element)``."""
    def cases(f):
        for peak, bw in _ROOFS:
            for b in (2, 4):
                expect_close(f"critical_batch({peak:g}, {bw:g}, {b})", f(peak, bw, b),
                             formulas.critical_batch_size(peak, bw, b), rel=1e-6,
                             hint="at batch B each weight read (bytes_per_element bytes) feeds "
                                  "2*B FLOPs; set that intensity equal to the ridge point.")
    return run_check("1.3", "critical_batch", fn, formulas.critical_batch_size, cases)


def bandwidth_utilisation(fn):
    """Exercise 1.4: ``bandwidth_utilisation(bytes_per_token, seconds_per_token, bandwidth)``."""
    def cases(f):
        for nbytes, secs, bw in [(13.3e9, 1 / 107, 2.0e12), (5e8, 0.03, 36e9), (1e9, 1e-3, 4.8e12)]:
            expect_close(f"bandwidth_utilisation({nbytes:g}, {secs:g}, {bw:g})", f(nbytes, secs, bw),
                         formulas.bandwidth_utilisation(nbytes, secs, bw), rel=1e-6,
                         hint="achieved bandwidth is bytes_per_token / seconds_per_token; return "
                              "it as a fraction of the peak (0.5, not 50).")
    return run_check("1.4", "bandwidth_utilisation", fn, formulas.bandwidth_utilisation, cases)
