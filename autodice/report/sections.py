"""The run and the search, as the page draws them: plain JSON-ready dicts read from the files
the other stages write (``results/stats.json``, a search's ``pareto.json`` and mappings)."""

from __future__ import annotations

import json
from pathlib import Path

from ..backend.session.figures import per_frame
from ..core.errors import AutodiceError

WAITS = ("compute", "recv_wait", "send_wait", "frame_wait")  # the bars' parts, ms per frame


def run_section(stats: dict) -> dict:
    """A run's or a session's figures: frames/s, per-rank compute and wait bars (ms per frame)
    and, where the session kept one, the latency histogram."""
    ranks = [{"label": f"rank {r['rank']}: {r['key']}", "device": r.get("device", ""),
              **{part: r["ms_per_frame"][part] for part in WAITS}}
             for r in per_frame(stats)] if stats.get("ranks") else []
    return {"frames": stats.get("frames"), "fps": stats.get("fps"),
            "steady_fps": stats.get("steady_fps"), "latency_s": stats.get("latency_s"),
            "histogram": stats.get("latency_histogram"), "ranks": ranks,
            "interrupted": stats.get("interrupted"), "dropped": stats.get("frames_dropped"),
            "energy": stats.get("energy")}


def read_stats(path: Path) -> dict | None:
    """``stats.json`` as written at a run's end, or None where there is none yet."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise AutodiceError(f"{path}: not a stats.json autodice wrote ({e})") from None


def _point(p: dict, mapping: dict | None) -> dict:
    return {"name": p["point"], "fps": p["throughput_fps"], "energy_mj": p["energy_j"] * 1e3,
            "memory_mb": p["memory_bytes"] / 1e6, "devices": p["devices"],
            "bottleneck": p["bottleneck"], "mapping": mapping,
            "precision": p.get("precision"),  # gen --precision for its int8 keys
            "agreement": p.get("agreement"), "agreement_of": p.get("agreement_of"),
            "ranks": [{"key": r["key"], "compute_ms": r["compute_s"] * 1e3,
                       "comm_ms": r["comm_s"] * 1e3, "int8": r.get("precision") == "int8"}
                      for r in p["ranks_detail"]]}


def front_section(doc: dict, mappings: dict[str, dict]) -> dict:
    """A search's front (``pareto.json``'s document and each point's mapping by name): the
    points the scatter shows and the references it marks."""
    s = doc.get("settings", {})
    return {"points": [_point(p, mappings[p["point"]]) for p in doc["points"]],
            "references": [_point(p, None) for p in doc["references"]],
            "model": doc["model"], "platform": doc["platform"],
            "wire": s.get("wire", "fp32"),
            "settings": f"{s.get('encoding')} encoding, pop {s.get('pop')}, {s.get('gens')} "
                        f"generations, seed {s.get('seed')}"}


def read_front(folder: Path) -> dict:
    """:func:`front_section` of a search's output folder (``dse -o``)."""
    try:
        doc = json.loads((folder / "pareto.json").read_text())
        mappings = {p["point"]: json.loads((folder / p["mapping"]).read_text())
                    for p in doc["points"]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AutodiceError(f"{folder}: not a folder dse -o wrote ({e})") from None
    return front_section(doc, mappings)
