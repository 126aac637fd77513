"""The machinery the course's calculators share: controls that redraw a figure, or, where
ipywidgets is missing (a static site build, a bare Python), the figure alone.

ipywidgets is imported only when a widget is built, so the package imports without it.
"""

from __future__ import annotations

from typing import Callable


def redrawing(controls: dict, rows: list[list[str]], draw: Callable[..., None]):
    """A box of ``controls`` (laid out in ``rows`` of control names) over an output area where
    ``draw(**values)`` runs again whenever a control changes. A ``ValueError`` from ``draw`` (an
    impossible combination, such as bfloat16 on a T4) is printed instead of raised."""
    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import display

    out = widgets.Output()

    def redraw(_=None):
        with out:
            out.clear_output(wait=True)
            before = set(plt.get_fignums())
            try:
                draw(**{name: control.value for name, control in controls.items()})
            except ValueError as error:
                print(error)
                return
            # only the figures draw made: plt.show() would take every open figure into this
            # output area, a figure the cell drew before building the widget included
            for number in sorted(set(plt.get_fignums()) - before):
                figure = plt.figure(number)
                display(figure)
                plt.close(figure)

    for control in controls.values():
        control.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([controls[name] for name in row]) for row in rows] + [out])


def widget_or_figure(make_widget: Callable[[], object], make_figure: Callable[..., object],
                     **figure_kwargs):
    """``make_widget()`` when ipywidgets is importable, else ``make_figure(**figure_kwargs)``."""
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return make_figure(**figure_kwargs)
    return make_widget()
