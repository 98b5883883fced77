"""``autodice split``: ONNX model + mapping + platform -> sub-models, tables and plan.

The pipeline is a flat list of passes; every check runs before the first byte is written, and the
output appears all at once (written to a temporary sibling, then renamed), so a failed run never
leaves a half-written directory. :func:`plan_mapping` is the passes without the writing: the
search runs it on every front point, so what it emits is what ``split`` accepts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..core.model import Graph, load_model
from ..core.outdir import staged
from ..core.plan import Plan
from ..core.spec import Mapping, Platform, parse_mapping, parse_platform
from .extract import write_submodels
from .partition import build_plan, find_edges
from .place import assign_ranks, check_resources
from .tables import write_tables
from .validate import check_plan


def split(model: str | Path, mapping: str | Path, platform: str | Path, out: str | Path,
          input_shapes: dict[str, tuple[int, ...]] | None = None) -> Plan:
    """Split ``model`` as ``mapping`` says, onto ``platform``, into the directory ``out``.

    Returns:
        The plan (also written as ``out/plan.json``).
    Raises:
        AutodiceError: any problem with the inputs, all of them listed; ``out`` is untouched.
    """
    model, out = Path(model), Path(out)
    platform_spec = parse_platform(platform)
    mapping_spec = parse_mapping(mapping)
    graph = load_model(model, input_shapes)
    plan = plan_mapping(graph, mapping_spec, platform_spec, out)
    with staged(out) as tmp:
        write_submodels(graph, plan, tmp)
        write_tables(plan, tmp)
        shutil.copyfile(mapping, tmp / "mapping.json")
        shutil.copyfile(platform, tmp / "platform.txt")
    return plan


def plan_mapping(graph: Graph, mapping: Mapping, platform: Platform,
                 out_dir: Path = Path(".")) -> Plan:
    """The checked plan of ``mapping`` of ``graph`` onto ``platform``; writes nothing.

    Args:
        out_dir: the directory the plan's paths are relative to (``split``'s output).
    Raises:
        AutodiceError: any problem with the mapping, all of them listed.
    """
    resources = check_resources(mapping, platform)
    placement = assign_ranks(graph, mapping, resources, platform)
    edges = find_edges(graph, placement, mapping.path)
    plan = build_plan(graph, placement, edges, out_dir, graph.path)
    check_plan(plan)
    return plan
