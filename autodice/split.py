"""``autodice split``: ONNX model + mapping + platform -> sub-models, tables and plan.

The pipeline is a flat list of passes; every check runs before the first byte is written, and the
output appears all at once (written to a temporary sibling, then renamed), so a failed run never
leaves a half-written directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .errors import AutodiceError
from .extract import write_submodels
from .model import Graph, load_model
from .partition import build_plan, find_edges
from .place import assign_ranks, check_resources
from .plan import Plan
from .spec import parse_mapping, parse_platform
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


@contextlib.contextmanager
def staged(out: Path, owned: bool = False) -> Iterator[Path]:
    """A temporary directory that replaces ``out`` when the block succeeds.

    Unless the caller ``owned`` it (a folder inside an autodice output), refuses to replace a
    non-empty directory that is not an earlier autodice output, so a typo in ``-o`` cannot delete
    someone's files.
    """
    if out.exists() and not owned and (not out.is_dir() or (
            any(out.iterdir()) and not (out / "plan.json").exists())):
        raise AutodiceError(f"{out}: exists and is not an autodice output directory; "
                            f"choose another -o or remove it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes it private; the result should not be
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            out.rename(old / out.name)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def layer_table(graph: Graph) -> list[dict]:
    """One row per layer: what a user needs to write a mapping."""
    rows = []
    for i, node in enumerate(graph.nodes):
        out_t = graph.types.get(node.output[0]) if node.output else None
        weights = [t for t in node.input if graph.is_weight(t)]
        rows.append({
            "name": graph.names[i], "op": node.op_type,
            "shape": out_t.shape_str() if out_t else "?",
            "param_bytes": sum(graph.tensors[t].nbytes for t in weights),
            "flops": layer_flops(graph, i),
            "follows": i in graph.followers,
        })
    return rows


def layer_flops(graph: Graph, i: int) -> int:
    """Multiply-adds x 2 for Conv/Gemm/MatMul; one op per output element otherwise."""
    node = graph.nodes[i]
    if i in graph.followers or not node.output or node.output[0] not in graph.types:
        return 0
    out = graph.types[node.output[0]]
    if not out.static:
        return 0
    n_out = 1
    for d in out.shape:
        n_out *= d
    if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
        w = graph.types.get(node.input[1])
        if w is not None and w.static:
            per_out = 1
            for d in w.shape[1:]:
                per_out *= d
            if node.op_type == "ConvTranspose":  # weights are (Cin, Cout/group, k...)
                per_out = w.shape[0] * per_out // max(w.shape[1], 1)
            return 2 * n_out * per_out
    if node.op_type in ("Gemm", "MatMul") and node.input[0] in graph.types:
        a = graph.types[node.input[0]]
        k = a.shape[-1] if a.static and a.shape else 1
        if node.op_type == "Gemm":
            for attr in node.attribute:
                if attr.name == "transA" and attr.i and a.static:
                    k = a.shape[0]
        return 2 * n_out * int(k)
    return n_out
