"""The per-kernel step-time model against the course engine's own step times on this CPU.

``StepModel`` (``inferlab.analysis.step_time``) prices a step on a datasheet roofline. A CPU
has no row in ``data/hardware.csv``, so here the roof is the machine's own: the bandwidth and
the matmul throughput the course's probes measure (``measure_bandwidth``,
``measure_peak_flops``, float32). The engine's forward also pays what no roofline sees: Python,
one kernel launch per operation and layer, small matmuls that reach neither roof. So the model
gets two numbers fitted to the engine, and nothing else:

    measured seconds ~= overhead_s + (sum of the kernels' rooflines) / efficiency

``overhead_s`` is a fixed cost per forward and ``efficiency`` the share of the probed roof the
kernels reach (``StepModel``'s own two knobs), fitted by non-negative least squares on half of
the measured shapes; the agreement is reported on the OTHER half, beside the simulator's
``FittedCosts`` (six coefficients of its own, fitted on the same half). The fitted numbers say
how far a small model on a CPU is from its roofline; they are not a property of the model of
time. Timings vary with the machine's load, so nothing here is a pass/fail verdict.

    python -m inferlab.analysis.step_fit        # about a minute on a 2-core CPU
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from inferlab.analysis.step_time import Shape, StepModel
from inferlab.sim.simulator import FittedCosts, _nonnegative_lstsq


@dataclass(frozen=True)
class Sample:
    """One measured step: its shape, as the simulator's cost model sees it, and its seconds."""

    kind: str           # "prefill" (tokens, 0) or "decode" (batch, context tokens)
    a: int
    b: int
    seconds: float

    def shape(self) -> Shape:
        return Shape.of_rows([(self.a, 0)]) if self.kind == "prefill" else \
            Shape.decode(self.a, self.b)


def samples_of(costs: FittedCosts) -> list[Sample]:
    """The measured steps behind a ``measure_costs`` fit."""
    return ([Sample("prefill", t, 0, s) for t, s in costs.prefill_samples]
            + [Sample("decode", n, c, s) for n, c, s in costs.decode_samples])


def fit(roof: StepModel, samples: list[Sample]) -> StepModel:
    """``roof`` with the overhead and efficiency that best fit ``samples`` (non-negative)."""
    base = replace(roof, overhead_s=0.0, efficiency=1.0)
    a, b = _nonnegative_lstsq([[1.0, base.seconds(s.shape())] for s in samples],
                              [s.seconds for s in samples])
    if b <= 0:
        raise ValueError("the measured times do not grow with the modelled ones")
    return replace(roof, overhead_s=a, efficiency=min(1.0, 1.0 / b))


def _predict_fitted(costs: FittedCosts, s: Sample) -> float:
    return costs.prefill_s(s.a) if s.kind == "prefill" else costs.decode_s(s.a, s.b)


@dataclass(frozen=True)
class Agreement:
    """Held-out relative errors of the two fitted models, shape by shape."""

    model: StepModel
    held_out: tuple[Sample, ...]
    step_model_errors: tuple[float, ...]
    fitted_costs_errors: tuple[float, ...]

    @staticmethod
    def _mean(xs) -> float:
        return sum(abs(x) for x in xs) / len(xs)

    @property
    def step_model_mean(self) -> float:
        return self._mean(self.step_model_errors)

    @property
    def fitted_costs_mean(self) -> float:
        return self._mean(self.fitted_costs_errors)

    def table(self) -> str:
        m = self.model
        lines = [f"fitted: overhead {m.overhead_s * 1e3:.2f} ms per forward, efficiency "
                 f"{m.efficiency:.1%} of the probed roof",
                 f"{'step':>22s} {'measured':>10s} {'StepModel':>10s} {'FittedCosts':>12s}"]
        for s, e1, e2 in zip(self.held_out, self.step_model_errors, self.fitted_costs_errors):
            what = f"prefill {s.a}" if s.kind == "prefill" else f"decode {s.a} x {s.b // s.a}"
            lines.append(f"{what:>22s} {s.seconds * 1e3:8.2f}ms {e1:+10.1%} {e2:+12.1%}")
        lines.append(f"mean |error| on held-out shapes: StepModel {self.step_model_mean:.1%}, "
                     f"FittedCosts {self.fitted_costs_mean:.1%}")
        return "\n".join(lines)


def agreement(roof: StepModel, samples: list[Sample]) -> Agreement:
    """Fit both models on every other sample of each kind; compare on the rest."""
    train, test = [], []
    for kind in ("prefill", "decode"):
        mine = [s for s in samples if s.kind == kind]
        train += mine[0::2]
        test += mine[1::2]
    model = fit(roof, train)
    fitted = FittedCosts.fit([(s.a, s.seconds) for s in train if s.kind == "prefill"],
                             [(s.a, s.b, s.seconds) for s in train if s.kind == "decode"])
    err = lambda p, s: p / s.seconds - 1  # noqa: E731
    return Agreement(model, tuple(test),
                     tuple(err(model.seconds(s.shape()), s) for s in test),
                     tuple(err(_predict_fitted(fitted, s), s) for s in test))


def measure(model_name: str = "tiny", prefill_lens=(8, 16, 32, 64, 96, 128),
            batches=(1, 2, 4, 8, 16, 32), contexts=(16, 64, 128), threads: int = 1) -> Agreement:
    """Probe this CPU's roof, time the engine's steps (``measure_costs``) and compare."""
    import torch

    from inferlab.analysis.hardware import measure_bandwidth, measure_peak_flops
    from inferlab.model.llama import build_model
    from inferlab.sim.simulator import measure_costs

    torch.set_num_threads(threads)
    model = build_model(model_name, seed=0)
    bw = measure_bandwidth("cpu").value
    peak = measure_peak_flops("float32", "cpu").value
    roof = StepModel.for_roof(model.config, peak, bw, "float32")
    return agreement(roof, samples_of(measure_costs(model, prefill_lens, batches, contexts)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    print(measure(args.model, threads=args.threads).table())


if __name__ == "__main__":
    main()
