"""The cost calculator: dollars per million input and output tokens, predicted and simulated.

Choose a model, a device (and how many), a precision, prompt and output lengths, an SLO and an
hourly price (0: the newest row of ``data/prices.csv`` for that device). ``calculate`` gives

- the prediction from the roofline (``CostCase.floor``) at batch 1 and at the largest batch
  that fits in memory: the bounds a back-of-the-envelope estimate starts from;
- the simulator's answer (``CostCase.simulate``): the highest Poisson rate within the SLO in
  steady state, the batch that rate runs at, and the price split between prefill and decode
  time; and the floor at that same batch, so that the gap between prediction and simulation
  can be read off. A setting Chapter 8 stored (``data/simulations/ch08_costs.json``) is read
  from there; any other is searched afresh (``simulate=True``), which takes about a minute.

``plot_calculation`` draws it (the site's static figure); ``cost_widget`` is the ipywidgets
calculator of Lab 8, and ``show_cost_calculator`` picks whichever is available
(``inferlab.analysis.widgets``, as the roofline explorer and the capacity calculator do).
"""

from __future__ import annotations

from dataclasses import dataclass

from inferlab.analysis.chips import max_batch
from inferlab.sim.token_cost import PRECISIONS, CostCase, Floor, SimulatedCost, stored_cost
from inferlab.analysis.widgets import redrawing, widget_or_figure
from inferlab.model.config import model_presets


@dataclass(frozen=True)
class Calculation:
    case: CostCase
    usd_per_device_hour: float
    price_label: str
    at_batch_1: Floor
    at_full_memory: Floor
    simulated: SimulatedCost | None   # None: not stored, and not asked to simulate
    at_simulated_batch: Floor | None
    stored: bool           # the simulation came from data/simulations/

    def __str__(self) -> str:
        c, s = self.case, self.simulated
        lines = [f"{c.model}, {c.precision}, on {c.group_name} at {self.price_label}; prompt "
                 f"{c.prompt}, output {c.output}; SLO TTFT <= {c.ttft_s:g} s, TPOT <= "
                 f"{c.tpot_s * 1e3:g} ms for {c.target:.0%}",
                 f"  roofline at batch 1:        ${self.at_batch_1.usd_per_m_input:8.3f}/M in, "
                 f"${self.at_batch_1.usd_per_m_output:8.3f}/M out",
                 f"  roofline at batch {self.at_full_memory.batch:<4d} (full): "
                 f"${self.at_full_memory.usd_per_m_input:8.3f}/M in, "
                 f"${self.at_full_memory.usd_per_m_output:8.3f}/M out"]
        if s is None:
            lines.append("  simulated: not stored for this setting; simulate it (about a minute)")
            return "\n".join(lines)
        if not s.ok:
            lines.append("  simulated: no rate met the SLO")
            return "\n".join(lines)
        lines += [f"  simulated within the SLO:   ${s.usd_per_m_input:8.3f}/M in, "
                  f"${s.usd_per_m_output:8.3f}/M out at {s.rate:.2f} req/s, mean batch "
                  f"{s.batch:.1f} ({'stored' if self.stored else 'simulated now'}; hour split "
                  "by tokens)",
                  f"  roofline at that batch:     ${self.at_simulated_batch.usd_per_m_input:8.3f}"
                  f"/M in, ${self.at_simulated_batch.usd_per_m_output:8.3f}/M out"]
        if s.split is not None:
            k_in, k_out = s.usd_per_m("kernels")
            lines.append(f"  simulated, split by kernel time: ${k_in:8.3f}/M in, ${k_out:8.3f}/M out")
        lines.append(f"  either split: ${s.usd_per_m_blended:.3f}/M tokens of either kind, "
                     f"${s.usd_per_request * 1e3:.4f} per thousand requests (roofline at that "
                     f"batch: ${self.at_simulated_batch.usd_per_request(c.output) * 1e3:.4f})")
        return "\n".join(lines)


def calculate(case: CostCase, usd_per_device_hour: float = 0.0, simulate: bool = False,
              **search) -> Calculation:
    """Floors and simulation for ``case`` (``usd_per_device_hour`` 0: the table's price).

    The simulation is the stored one where Chapter 8 stored this case; otherwise it is run
    when ``simulate`` is true (keyword arguments go to ``CostCase.capacity``) and left out
    when not."""
    if usd_per_device_hour > 0:
        label = f"${usd_per_device_hour:.2f}/h (given)"
    else:
        row = case.price()
        usd_per_device_hour, label = row.usd_per_hour, row.label()
    try:
        sim, stored = stored_cost(case, usd_per_device_hour), True
    except (KeyError, FileNotFoundError):
        capacity, stored = (case.capacity(**search) if simulate else None), False
        sim = None if capacity is None else case.priced(
            capacity, usd_per_device_hour, case.split(capacity) if capacity.state else None)
    full = max(1, min(case.max_batch, max_batch(case.config(), case.spec(), case.devices,
                                                 case.prompt + case.output, case.precision)))
    at_sim = None
    if sim is not None and sim.ok:
        at_sim = case.floor(max(1, round(sim.batch)), usd_per_device_hour)
    return Calculation(case, usd_per_device_hour, label, case.floor(1, usd_per_device_hour),
                       case.floor(full, usd_per_device_hour), sim, at_sim, stored)


def plot_calculation(calc: Calculation | None = None, ax=None):
    """Bars of dollars per million input and output tokens: the floors and the simulation."""
    import matplotlib.pyplot as plt

    from inferlab.analysis.figures import legend_outside, plain_log_ticks

    calc = calc or calculate(CostCase())
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 3.4))
    bars = [("roofline, batch 1", calc.at_batch_1),
            (f"roofline, batch {calc.at_full_memory.batch} (memory full)", calc.at_full_memory)]
    if calc.at_simulated_batch is not None:
        bars += [(f"roofline, batch {calc.at_simulated_batch.batch} (the simulated batch)",
                  calc.at_simulated_batch), ("simulated within the SLO", calc.simulated)]
    width = 0.8 / len(bars)
    for i, (label, cost) in enumerate(bars):
        values = [cost.usd_per_m_input, cost.usd_per_m_output]
        ax.bar([k + (i - (len(bars) - 1) / 2) * width for k in range(2)], values, width,
               label=label)
    ax.set_xticks([0, 1], ["input tokens", "output tokens"])
    ax.set_yscale("log")
    plain_log_ticks(ax, "y")
    ax.set_ylabel("dollars per million tokens")
    c = calc.case
    ax.set_title(f"{c.model} on {c.group_name}, {c.prompt} in / {c.output} out, "
                 f"TPOT <= {c.tpot_s * 1e3:g} ms", fontsize="medium")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    legend_outside(ax)
    return ax


def cost_widget():
    """The ipywidgets calculator; raises ImportError without ipywidgets."""
    import ipywidgets as widgets

    from inferlab.analysis.chips import accelerators

    models = [n for n in model_presets() if n not in ("tiny", "small", "medium")]
    devices = [n for n, s in accelerators().items() if s.peak_flops("bfloat16")]
    default = CostCase()
    slider = lambda d, v, lo, hi, step: widgets.IntSlider(  # noqa: E731
        value=v, min=lo, max=hi, step=step, description=d, continuous_update=False)
    controls = {
        "model": widgets.Dropdown(options=models, value=default.model, description="model"),
        "device": widgets.Dropdown(options=devices, value=default.device, description="device"),
        "count": widgets.IntText(value=0, description="devices (0: auto)"),
        "precision": widgets.Dropdown(options=list(PRECISIONS), value=default.precision,
                                      description="precision"),
        "prompt": slider("prompt", default.prompt, 50, 8000, 50),
        "output": slider("output", default.output, 10, 2000, 10),
        "ttft_ms": slider("TTFT ms", int(default.ttft_s * 1e3), 100, 10000, 100),
        "tpot_ms": slider("TPOT ms", int(default.tpot_s * 1e3), 5, 200, 5),
        "price": widgets.FloatText(value=0.0, description="$/h (0: table)"),
        "simulate": widgets.Checkbox(value=False, description="simulate (about a minute)"),
    }

    def draw(model, device, count, precision, prompt, output, ttft_ms, tpot_ms, price,
             simulate):
        case = CostCase(model=model, device=device, count=count or None, precision=precision,
                        prompt=prompt, output=output, ttft_s=ttft_ms / 1e3, tpot_s=tpot_ms / 1e3)
        calc = calculate(case, price, simulate=simulate)
        print(calc)
        plot_calculation(calc)

    rows = [["model", "device", "count"], ["precision", "price"], ["prompt", "output"],
            ["ttft_ms", "tpot_ms"], ["simulate"]]
    return redrawing(controls, rows, draw)


def show_cost_calculator(**plot_kwargs):
    """The widget when ipywidgets is importable, else the static figure."""
    return widget_or_figure(cost_widget, plot_calculation, **plot_kwargs)
