"""PNG Gantt chart of a simulated step (`planner.simulate.PlanTimeline`); matplotlib is imported only here.

One row per (pipeline, stage), forwards and backwards in two colours with the microbatch number on each
op when it fits. The figure is built on a bare `Figure` (no pyplot), so no global state is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.errors import HetplanError
from planner.simulate import PlanTimeline

FWD_COLOUR, BWD_COLOUR = "#4C72B0", "#DD8452"


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise HetplanError("--png", "writing a PNG needs matplotlib (pip install 'hetplan[plot]'); "
                           "without --png the timeline is printed as text") from None
    return Figure


def render_png(timeline: PlanTimeline, path: str | Path, title: str = "") -> Path:
    """Draw every pipeline's ops against time (seconds) and save a PNG at `path`."""
    figure_cls = _figure_class()
    rows = [(pi, s) for pi, t in enumerate(timeline.pipelines) for s in range(t.num_stages)]
    fig = figure_cls(figsize=(10, 1.0 + 0.45 * len(rows)), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    span = max(t.makespan_s for t in timeline.pipelines) or 1.0
    for y, (pi, s) in enumerate(rows):
        for op in timeline.pipelines[pi].ops:
            if op.stage != s:
                continue
            width = op.end_s - op.start_s
            ax.broken_barh([(op.start_s, width)], (y - 0.4, 0.8),
                           facecolors=FWD_COLOUR if op.kind == "F" else BWD_COLOUR, edgecolor="white", linewidth=0.5)
            if width > span / 60:
                ax.text(op.start_s + width / 2, y, str(op.microbatch), ha="center", va="center", fontsize=7,
                        color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"p{pi} s{s}" for pi, s in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, span)
    ax.set_xlabel("time in the step (s)")
    head = title or f"simulated step {timeline.step_s:.4g} s (closed form {timeline.closed_form_step_s:.4g} s)"
    ax.set_title(f"{head}; blue = forward, orange = backward", fontsize=9)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, format="png")
    return out
