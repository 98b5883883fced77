"""One self-contained HTML page: the data as JSON in the page, Plotly's basic bundle inlined.

Plotly because it gives pan, zoom, hover and click on SVG with no server, and its basic bundle
(scatter and bars, 1.2 MB; the full one is 4.8 MB) holds all the page draws, the partition graph
included (markers joined by lines). It is vendored from npm (``templates/vendor/``), so the page
opens from disk with no network, as boards' operators often are.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from ..core.outdir import check_writable_file, write_atomic
from ..core.plan import human_bytes

STATS = Path("results") / "stats.json"  # where run, deploy --run and sessions leave their figures


def html_json(data) -> str:
    """``data`` as JSON that can sit inside a ``<script>`` element: ``<``, ``>`` and ``&``
    escaped, so no name from a model can end the element or open a comment (the one escaping
    function for text entering the page's script)."""
    return (json.dumps(data, ensure_ascii=True, separators=(",", ":"))
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _asset(name: str) -> str:
    return resources.files("autodice.templates").joinpath(name).read_text(encoding="utf-8")


def _key_table(keys: list[dict]) -> tuple[list[str], list[list[str]], bool]:
    predicted = bool(keys) and "compute_ms" in keys[0]
    headers = ["rank", "key", "host", "device", "threads", "layers", "MFLOPs", "weights",
               "peak activations", "received", "sent"]
    if predicted:
        headers += ["compute ms", "transfer ms", "memory"]
    rows = []
    for k in keys:
        row = [str(k["rank"]), k["key"] + (f" (copy of {k['copy_of']})" if k["copy_of"] else ""),
               k["host"], k["device"], str(k["threads"]), str(k["layers"]),
               f"{k['flops'] / 1e6:.1f}", human_bytes(k["param_bytes"]),
               human_bytes(k["peak_activation_bytes"]), human_bytes(k["recv_bytes"]),
               human_bytes(k["send_bytes"])]
        if predicted:
            row += [f"{k['compute_ms']:.2f}", f"{k['comm_ms']:.2f}", human_bytes(k["memory_bytes"])]
        rows.append(row)
    return headers, rows, predicted


def _run_summary(run: dict) -> str:
    parts = [f"{run['frames']} frames", f"{run['fps']:.1f} frames/s"]
    if run.get("steady_fps"):
        parts.append(f"{run['steady_fps']:.1f} frames/s steady")
    if run.get("latency_s"):
        lat = run["latency_s"]
        parts.append(f"latency p50 {lat['p50'] * 1e3:.1f} ms, p99 {lat['p99'] * 1e3:.1f} ms")
    if run.get("dropped"):
        parts.append(f"{run['dropped']} frames dropped")
    if run.get("interrupted"):
        parts.append(f"interrupted: {run['interrupted']}")
    for host, e in (run.get("energy") or {}).items():
        if e.get("sensor") is None:
            parts.append(f"{host}: no power sensor")
        elif e.get("joules_per_frame") is not None:
            parts.append(f"{host}: {e['joules_per_frame']:.3g} J a frame at {e['watts']:.3g} W "
                         f"({e['sensor']})")
    return ", ".join(parts)


def render(title: str, subtitle: str, *, partition: dict | None = None,
           keys: list[dict] | None = None, run: dict | None = None, show_run: bool = False,
           front: dict | None = None) -> str:
    """The page's text. Each section is drawn when its data is given; ``show_run`` without
    ``run`` says there is no run yet."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(autoescape=True, keep_trailing_newline=True)
    headers, rows, predicted = _key_table(keys or [])
    key_names = [k["key"] for k in keys or []]
    context = {
        "title": title, "subtitle": subtitle, "partition": partition, "key_headers": headers,
        "key_rows": rows, "predicted": predicted, "run": run, "show_run": show_run or bool(run),
        "stats_path": str(STATS), "front": front,
        "data": Markup(html_json({"partition": partition, "keys": key_names, "run": run,
                                  "front": front})),
        "plotly": Markup(_asset("vendor/plotly-basic.min.js")),
        "script": Markup(_asset("report.js"))}
    if partition:
        cut = sum(c["bytes"] for c in partition["cuts"])
        context["partition_summary"] = (
            f"{partition['layers']} layers on {len(key_names)} ranks"
            + (f", drawn as {len(partition['nodes'])} nodes (a chain of one key is one node)"
               if partition["merged"] else "")
            + f"; {len(partition['cuts'])} cut tensors, {human_bytes(cut)} per frame")
    if run:
        context["run_summary"] = _run_summary(run)
        context["run_height"] = 120 + 34 * len(run["ranks"])
    if front:
        context["front_summary"] = (f"{len(front['points'])} mappings on the front of "
                                    f"{front['model']} over {front['platform']} "
                                    f"({front['settings']})")
    return env.from_string(_asset("report.html.j2")).render(context)


def write_page(path: Path, text: str) -> None:
    """Write the page whole or not at all."""
    path = Path(path)
    check_writable_file(path)
    write_atomic(path, text.encode("utf-8"))
