"""Chapter 4's latency-against-load sweep in steady state: run it, store it, read it back.

The sweep serves the ShareGPT-like workload (``inferlab.sim.traces``) with Llama-2-7B on the
roofline of an A100 80GB (``inferlab.analysis.step_time.StepModel``), under static and under
continuous batching, at a list of offered rates; each point is a steady state of
``inferlab.sim.steady_state`` (trace grown until two lengths agree, or shown overloaded), and
each policy's capacity under the SLO is searched for as well. Near a server's capacity a
steady state takes thousands of requests to establish, so the full sweep takes minutes: too
long for a book that is executed on every build. It is therefore run once by

    python -m inferlab.sim.sweeps --write      # about 15 minutes on one core

and stored, with what it was computed from (the setup, the device's and model's numbers, the
date and the git commit), in ``data/simulations/ch04_steady_state.json``, which Chapter 4
reads with ``load``. ``tests/test_steady_state.py`` fails when the stored inputs no longer
match the tables, or when recomputing a stored point gives another number: then rerun the
command above. ``python -m inferlab.sim.sweeps`` without ``--write`` prints the stored table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from inferlab.analysis import formulas
from inferlab.analysis.capacity import kv_blocks_for_device
from inferlab.analysis.column import Table
from inferlab.analysis.hardware import get_device_spec
from inferlab.analysis.step_time import StepModel
from inferlab.data import data_path
from inferlab.model.config import ModelConfig
from inferlab.serving.config import ServingConfig
from inferlab.serving.metrics import SLO
from inferlab.sim.records import (capacity_from_dict, capacity_to_dict, state_from_dict,
    state_to_dict)
from inferlab.sim.steady_state import (MEETS, Criterion, SLOCapacity, SteadyState,
    capacity_at_slo, simulated, steady_state, verdict)
from inferlab.sim.workloads import Workload

NAME = "ch04_steady_state.json"


@dataclass(frozen=True)
class SweepSetup:
    """Everything the sweep depends on besides the code and the tables."""

    model: str = "llama-2-7b"
    device: str = "A100 80GB SXM"
    max_batch: int = 256
    policies: tuple[str, ...] = ("static", "continuous")
    rates: tuple[float, ...] = (1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 20.0, 24.0)
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    target: float = 0.9          # share of requests that must meet the SLO
    n0: int = 500                # shortest trace; then doubled
    n_max: int = 16000           # longest trace
    seed: int = 0
    warmup: float = 0.2
    cooldown: float = 0.1
    criterion: Criterion = field(default_factory=Criterion)

    @property
    def slo(self) -> SLO:
        return SLO(self.slo_ttft_s, self.slo_tpot_s)

    def model_config(self) -> ModelConfig:
        return ModelConfig.from_name(self.model)

    def costs(self) -> StepModel:
        return StepModel.for_device(self.model_config(), get_device_spec(self.device))

    def serving(self, policy: str) -> ServingConfig:
        blocks = kv_blocks_for_device(self.model_config(), get_device_spec(self.device))
        return ServingConfig(num_blocks=blocks, max_batch=self.max_batch, policy=policy)

    def serve(self, policy: str):
        """One simulated engine under ``policy`` (a ``steady_state.Serve``)."""
        return simulated(self.costs(), self.serving(policy))

    def workload(self) -> Workload:
        return Workload.sharegpt()

    def inputs(self) -> dict:
        """The numbers from the tables the sweep used (to tell when a stored sweep is stale)."""
        spec, config = get_device_spec(self.device), self.model_config()
        return {"bandwidth": spec.bandwidth, "peak_flops": spec.peak_flops("bfloat16"),
                "memory": spec.memory, "weight_bytes": formulas.decode_bytes_per_step(config),
                "kv_bytes_per_token": formulas.kv_bytes_per_token(config),
                "num_blocks": self.serving("continuous").num_blocks,
                "mean_lengths": list(self.workload().mean_lengths),
                "step_model": asdict(self.costs())}   # the step-time model's numbers

    def state(self, policy: str, rate: float) -> SteadyState:
        return steady_state(self.workload(), rate, self.serve(policy), self.slo,
                            n0=self.n0, n_max=self.n_max, seed=self.seed,
                            criterion=self.criterion, warmup=self.warmup, cooldown=self.cooldown)

    def capacity(self, policy: str, states: list[SteadyState]) -> SLOCapacity:
        """The search, started from the highest swept rate that met the SLO; when none did,
        no search (the capacity is below the lowest rate swept, reported as 0)."""
        met = [s.rate for s in states if verdict(s, self.target, self.criterion) == MEETS]
        if not met:
            return SLOCapacity(0.0, None, (), self.target, self.criterion)
        return capacity_at_slo(self.workload(), self.serve(policy), self.slo, max(met),
                               self.target, n0=self.n0, n_max=self.n_max,
                               seed=self.seed, criterion=self.criterion, warmup=self.warmup,
                               cooldown=self.cooldown)


@dataclass(frozen=True)
class Sweep:
    """A stored sweep: steady states by policy and rate, and each policy's SLO capacity."""

    setup: SweepSetup
    states: dict[str, list[SteadyState]]
    capacities: dict[str, SLOCapacity]
    inputs: dict
    provenance: dict


def run(setup: SweepSetup = SweepSetup(), progress=print) -> Sweep:
    """Compute the sweep (minutes: see the module's docstring)."""
    from inferlab.measurements import git_commit

    states, capacities = {}, {}
    for policy in setup.policies:
        states[policy] = []
        for rate in setup.rates:
            s = setup.state(policy, rate)
            states[policy].append(s)
            progress(f"{policy} {rate:g} req/s: {s.status} after {s.window.n_requests} requests")
        capacities[policy] = setup.capacity(policy, states[policy])
        progress(f"{policy}: capacity under the SLO {capacities[policy].rate:.2f} req/s")
    provenance = {"command": "python -m inferlab.sim.sweeps --write",
                  "date": _dt.date.today().isoformat(), "git_commit": git_commit()}
    return Sweep(setup, states, capacities, setup.inputs(), provenance)


def to_json(sweep: Sweep) -> dict:
    setup = asdict(sweep.setup)
    return {"setup": setup, "inputs": sweep.inputs, "provenance": sweep.provenance,
            "states": {p: [state_to_dict(s) for s in ss] for p, ss in sweep.states.items()},
            "capacities": {p: capacity_to_dict(c) for p, c in sweep.capacities.items()}}


def from_json(d: dict) -> Sweep:
    setup = dict(d["setup"])
    setup["criterion"] = Criterion(**setup["criterion"])
    setup["policies"], setup["rates"] = tuple(setup["policies"]), tuple(setup["rates"])
    return Sweep(SweepSetup(**setup),
                 {p: [state_from_dict(s) for s in ss] for p, ss in d["states"].items()},
                 {p: capacity_from_dict(c) for p, c in d["capacities"].items()},
                 d["inputs"], d["provenance"])


def path() -> Path:
    return data_path("hardware.csv").parent / "simulations" / NAME


def load() -> Sweep:
    """The stored sweep (``data/simulations/ch04_steady_state.json``)."""
    return from_json(json.loads(data_path("simulations", NAME).read_text(encoding="utf-8")))


def save(sweep: Sweep, out: Path | None = None) -> Path:
    out = out or path()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(to_json(sweep), indent=1) + "\n", encoding="utf-8")
    return out


def windows(sweep: Sweep) -> Table:
    """The sweep's steady states, one row per policy and rate: a ``Table`` (HTML in a
    notebook, aligned text when printed), captioned with the setup and the SLO."""
    s = sweep.setup
    rows = [(policy, f"{st.rate:g}", st.status, f"{st.window.n_requests:,}",
             f"{st.window.offered_out_tok_s:,.0f}", f"{st.window.achieved_out_tok_s:,.0f}",
             f"{st.window.latency.p50:.1f}", f"{st.window.latency.p99:.1f}",
             f"{st.window.slo_attainment:.0%}")
            for policy, states in sweep.states.items() for st in states]
    return Table(rows, ["policy", "req/s", "status", "requests", "offered tok/s",
                        "achieved tok/s", "p50 latency (s)", "p99 latency (s)", "in SLO"],
                 caption=f"{s.model} on {s.device} (roofline), ShareGPT-like, max batch "
                         f"{s.max_batch}; SLO TTFT <= {s.slo_ttft_s:g} s, TPOT <= "
                         f"{s.slo_tpot_s * 1e3:g} ms for {s.target:.0%} of requests")


def capacity_lines(sweep: Sweep) -> list[str]:
    """Each policy's highest rate within the SLO, one sentence a policy."""
    lines = []
    for policy, cap in sweep.capacities.items():
        if cap.state is None:
            lines.append(f"{policy}: no rate swept met the SLO (capacity below "
                         f"{min(sweep.setup.rates):g} req/s)")
        else:
            lines.append(f"{policy}: highest rate within the SLO {cap.rate:.2f} req/s "
                         f"({len(cap.probes)} rates probed)")
    return lines


def table(sweep: Sweep) -> str:
    """The sweep as text: its steady states (``windows``), then the SLO capacities."""
    return "\n".join([str(windows(sweep)), *capacity_lines(sweep)])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Chapter 4's steady-state sweep.")
    parser.add_argument("--write", action="store_true",
                        help=f"recompute (minutes) and store in data/simulations/{NAME}")
    args = parser.parse_args(argv)
    if args.write:
        print(f"wrote {save(run())}")
    print(table(load()))


if __name__ == "__main__":
    main()
