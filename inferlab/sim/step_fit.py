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

    python -m inferlab.sim.step_fit        # about a minute on a 2-core CPU
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from inferlab.analysis.step_time import Shape, StepModel
from inferlab.sim.simulator import FittedCosts, _nonnegative_lstsq


@dataclass(frozen=True)
class Sample:
    """One measured forward, as the simulator's cost model sees it: prompt ``chunks`` of (new,
    cached) tokens beside ``batch`` decodes over ``context`` tokens, and its seconds."""

    chunks: tuple[tuple[int, int], ...]
    batch: int
    context: int
    seconds: float

    @property
    def kind(self) -> str:
        if not self.chunks:
            return "decode"
        return "prefill" if self.batch == 0 and len(self.chunks) == 1 \
            and self.chunks[0][1] == 0 else "mixed"

    def shape(self) -> Shape:
        return Shape.of_rows(self.chunks) + Shape.decode(self.batch, self.context)

    def label(self) -> str:
        if self.kind == "prefill":
            return f"prefill {self.chunks[0][0]}"
        what = f"decode {self.batch} x {self.context // max(1, self.batch)}"
        return what if self.kind == "decode" else \
            f"{sum(n for n, _ in self.chunks)} chunk + {what}"


def samples_of(costs: FittedCosts) -> list[Sample]:
    """The measured steps behind a ``measure_costs`` fit."""
    return ([Sample(((t, 0),), 0, 0, s) for t, s in costs.prefill_samples]
            + [Sample((), n, c, s) for n, c, s in costs.decode_samples])


def samples_from_iterations(iterations) -> list[Sample]:
    """The forwards an engine run logged (``Run.iterations``): whole prefills, decode steps
    and chunked steps."""
    out = []
    for it in iterations:
        for f in it.forwards:
            chunks = tuple((r.new, r.cached) for r in f.rows if r.prefill)
            decodes = [r for r in f.rows if not r.prefill]
            out.append(Sample(chunks, len(decodes), sum(r.new + r.cached for r in decodes),
                              f.seconds))
    return out


def fit(roof: StepModel, samples: list[Sample]) -> StepModel:
    """``roof`` with the overhead and efficiency that best fit ``samples`` (non-negative)."""
    base = replace(roof, overhead_s=0.0, efficiency=1.0)
    a, b = _nonnegative_lstsq([[1.0, base.seconds(s.shape())] for s in samples],
                              [s.seconds for s in samples])
    if b <= 0:
        raise ValueError("the measured times do not grow with the modelled ones")
    return replace(roof, overhead_s=a, efficiency=min(1.0, 1.0 / b))


def _predict_fitted(costs: FittedCosts, s: Sample) -> float:
    if s.kind == "prefill":
        return costs.prefill_s(s.chunks[0][0])
    return costs.step_s(s.chunks, s.batch, s.context)


def _fit_costs(samples: list[Sample]) -> FittedCosts:
    return FittedCosts.fit([(s.chunks[0][0], s.seconds) for s in samples if s.kind == "prefill"],
                           [(s.batch, s.context, s.seconds) for s in samples
                            if s.kind == "decode"],
                           mixed=[(s.chunks, s.batch, s.context, s.seconds) for s in samples
                                  if s.kind == "mixed"])


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
            lines.append(f"{s.label():>22s} {s.seconds * 1e3:8.2f}ms {e1:+10.1%} {e2:+12.1%}")
        lines.append(f"mean |error| on held-out shapes: StepModel {self.step_model_mean:.1%}, "
                     f"FittedCosts {self.fitted_costs_mean:.1%}")
        return "\n".join(lines)


def agreement(roof: StepModel, samples: list[Sample]) -> Agreement:
    """Fit both models on every other sample of each kind; compare on the rest."""
    train, test = [], []
    for kind in ("prefill", "decode", "mixed"):
        mine = [s for s in samples if s.kind == kind]
        train += mine[0::2]
        test += mine[1::2]
    model = fit(roof, train)
    fitted = _fit_costs(train)
    err = lambda p, s: p / s.seconds - 1  # noqa: E731
    return Agreement(model, tuple(test),
                     tuple(err(model.seconds(s.shape()), s) for s in test),
                     tuple(err(_predict_fitted(fitted, s), s) for s in test))


def cpu_roof(config, threads: int | None = None) -> StepModel:
    """``config`` on this CPU's probed roof (float32 bandwidth and matmul throughput)."""
    from inferlab.analysis.hardware import measure_bandwidth, measure_peak_flops

    return StepModel.for_roof(config, measure_peak_flops("float32", "cpu").value,
                              measure_bandwidth("cpu").value, "float32")


def measure(model_name: str = "tiny", prefill_lens=(8, 16, 32, 64, 96, 128),
            batches=(1, 2, 4, 8, 16, 32), contexts=(16, 64, 128), threads: int = 1) -> Agreement:
    """Probe this CPU's roof, time the engine's steps (``measure_costs``) and compare."""
    import torch

    from inferlab.model.llama import build_model
    from inferlab.sim.simulator import measure_costs

    torch.set_num_threads(threads)
    model = build_model(model_name, seed=0)
    return agreement(cpu_roof(model.config),
                     samples_of(measure_costs(model, prefill_lens, batches, contexts)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    print(measure(args.model, threads=args.threads).table())


if __name__ == "__main__":
    main()
