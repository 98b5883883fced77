"""``autodice view OUT -o report.html`` and a search's ``report.html``: one self-contained page
with the partition (an interactive graph), each key's figures, the run's per-rank bars and
latency histogram, and a search's front, whose points show and save their mappings.

The page reads only files the stages wrote (plan.json, the model, results/stats.json, a
search's pareto.json), so it can be made again at any time; :mod:`.page` says how it is drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..core.errors import AutodiceError

if TYPE_CHECKING:
    from ..core.model import Graph
    from ..core.plan import Plan


def view_report(out_dir: str | Path, html: str | Path, *, model: str | Path | None = None,
                predict: Callable[[Plan, Graph], Any] | None = None,
                stats: str | Path | None = None, front: str | Path | None = None) -> Path:
    """Write the page of the split in ``out_dir`` to ``html``: its partition and keys (with
    predicted times where ``predict`` prices the plan as a :class:`autodice.dse.cost.Cost`: the
    search's cost model sits a floor above this package, so the caller brings it), its run
    (``stats``, by default the output's ``results/stats.json``; where there is none the page
    says so) and, given a search's output folder ``front``, that search's front. Returns
    ``html``."""
    from ..core.plan import load_plan
    from ..frontend.split import plan_graph
    from .page import STATS, render, write_page
    from .partition import keys_table, partition_view
    from .sections import read_front, read_stats, run_section

    out_dir, html = Path(out_dir), Path(html)
    if html.suffix.lower() not in (".html", ".htm"):
        raise AutodiceError(f"{html}: the page must be .html")
    plan = load_plan(out_dir)
    graph = plan_graph(out_dir, plan, Path(model) if model else None)
    cost = predict(plan, graph) if predict else None
    figures = read_stats(Path(stats) if stats else out_dir / STATS)
    text = render(f"{Path(plan.model).name} over {len(plan.ranks)} ranks",
                  f"autodice split {out_dir}", partition=partition_view(plan, graph),
                  keys=keys_table(plan, graph, cost),
                  run=run_section(figures) if figures else None, show_run=True,
                  front=read_front(Path(front)) if front else None)
    write_page(html, text)
    return html


def front_page(doc: dict, mappings: dict[str, dict]) -> str:
    """The page of a search (``dse -o DIR`` writes it as ``DIR/report.html``): its front, from
    ``pareto.json``'s document and each point's mapping by name."""
    from .page import render
    from .sections import front_section

    return render(f"Design-space exploration of {Path(doc['model']).name}",
                  f"autodice dse over {doc['platform']}", front=front_section(doc, mappings))
