"""``autodice split``: ONNX model + mapping + platform -> sub-models, tables and plan.

The pipeline is a flat list of passes; every check runs before the first byte is written, and the
output appears all at once (written to a temporary sibling, then renamed), so a failed run never
leaves a half-written directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ..core.model import load_model
from ..core.outdir import staged
from ..core.plan import Plan
from ..core.spec import parse_mapping, parse_platform
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
    resources = check_resources(mapping_spec, platform_spec)
    placement = assign_ranks(graph, mapping_spec, resources, platform_spec)
    edges = find_edges(graph, placement, mapping_spec.path)
    plan = build_plan(graph, placement, edges, out, model)
    check_plan(plan)
    with staged(out) as tmp:
        write_submodels(graph, plan, placement, tmp)
        write_tables(plan, tmp)
        shutil.copyfile(mapping, tmp / "mapping.json")
        shutil.copyfile(platform, tmp / "platform.txt")
    return plan
