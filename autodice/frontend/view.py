"""``autodice view``: the model's layers coloured by rank, cut tensors labelled with their bytes.

Layers are laid out top to bottom by depth (longest path from the inputs), which reads like the
network diagrams in papers and needs no graph-layout dependency beyond matplotlib.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import AutodiceError
from ..core.outdir import check_writable_file
from ..core.plan import human_bytes as _human
from ..core.plan import load_plan
from .split import plan_graph


def render(out_dir: str | Path, image: str | Path, model: str | Path | None = None) -> None:
    """Draw the partition of the split in ``out_dir`` to ``image`` (.svg, .png or .pdf)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir, image = Path(out_dir), Path(image)
    if image.suffix.lower() not in (".svg", ".png", ".pdf"):
        raise AutodiceError(f"{image}: the picture must be .svg, .png or .pdf")
    check_writable_file(image)
    plan = load_plan(out_dir)
    graph = plan_graph(out_dir, plan, Path(model) if model else None)
    stages = [r for r in plan.ranks if r.turns()[0] == r.rank]  # copies share their layers
    rank_of = {layer: r.rank for r in stages for layer in r.layers}
    shown = [i for i in range(len(graph.nodes)) if graph.names[i] in rank_of]
    depth: dict[str, int] = {t: 0 for t in graph.inputs}
    pos = {}
    rows: dict[int, int] = {}
    for i in shown:
        node = graph.nodes[i]
        d = 1 + max((depth.get(t, 0) for t in node.input if t), default=0)
        for t in node.output:
            depth[t] = d
        pos[i] = (rows.get(d, 0), -d)
        rows[d] = rows.get(d, 0) + 1
    width = max(rows.values(), default=1)
    height = max(rows, default=1)
    fig, ax = plt.subplots(figsize=(min(4 + 1.6 * width, 40), min(2 + 0.55 * height, 200)))
    colors = plt.get_cmap("tab10" if len(plan.ranks) <= 10 else "tab20")
    cut = {e.tensor: e for e in plan.edges}
    producer_pos = {t: pos[i] for i in shown for t in graph.nodes[i].output}
    producer_rank = {t: rank_of[graph.names[i]] for i in shown for t in graph.nodes[i].output}
    for i in shown:
        x, y = pos[i]
        for t in graph.nodes[i].input:
            if t in producer_pos:
                px, py = producer_pos[t]
                is_cut = t in cut and producer_rank[t] != rank_of[graph.names[i]]
                ax.plot([px, x], [py, y], color="crimson" if is_cut else "0.6",
                        lw=2.0 if is_cut else 0.8, zorder=1)
                if is_cut:
                    ax.annotate(_human(cut[t].nbytes), ((px + x) / 2, (py + y) / 2), fontsize=7,
                                color="crimson", ha="center", zorder=3)
    labels = len(shown) <= 120
    for i in shown:
        x, y = pos[i]
        r = rank_of[graph.names[i]]
        ax.scatter([x], [y], s=260 if labels else 40, color=colors(r % colors.N), zorder=2,
                   edgecolors="black", linewidths=0.5)
        if labels:
            ax.annotate(f"{graph.names[i]}\n{graph.nodes[i].op_type}", (x, y), fontsize=7,
                        ha="left", va="center", xytext=(9, 0), textcoords="offset points",
                        parse_math=False)  # names are drawn as they are: "$x$" is no formula
    for r in stages:
        copies = [plan.ranks[k].key for k in r.turns()[1:]]
        ax.scatter([], [], color=colors(r.rank % colors.N), label=f"rank {r.rank}: {r.key}"
                   + (f" + copies on {', '.join(copies)}" if copies else ""))
    ax.legend(loc="upper right", fontsize=8, frameon=True)
    total = sum(e.nbytes * len(e.dst) for e in plan.edges)
    ax.set_title(f"{Path(plan.model).name}: {len(plan.ranks)} ranks, {len(plan.edges)} cut "
                 f"tensors, {_human(total)} per frame on the wire", fontsize=10, parse_math=False)
    ax.set_xlim(-0.7, width + 0.8)
    ax.axis("off")
    fig.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, dpi=110)
    plt.close(fig)
