"""``autodice split``: ONNX model + mapping + platform -> sub-models, tables and plan.

The pipeline is a flat list of passes; every check runs before the first byte is written, and the
output appears all at once (written to a temporary sibling, then renamed), so a failed run never
leaves a half-written directory. :func:`plan_mapping` is the passes without the writing: the
search runs it on every front point, so what it emits is what ``split`` accepts.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..core.errors import AutodiceError, Problems, read_text
from ..core.mapping import Mapping, parse_mapping, parse_mapping_text
from ..core.model import Graph, build_graph, load_model
from ..core.outdir import staged
from ..core.plan import Plan, check_plan
from ..core.spec import Platform, parse_platform, parse_platform_text
from .extract import write_submodels
from .horizontal import Split, split_layers
from .partition import batch_of_one, build_plan, find_edges, float32_only
from .place import assign_ranks, bind_slots, check_resources
from .replicas import add_replicas, without_replicas
from .tables import write_tables


def split(model: str | Path, mapping: str | Path, platform: str | Path, out: str | Path,
          input_shapes: dict[str, tuple[int, ...]] | None = None) -> Plan:
    """Split ``model`` as ``mapping`` says, onto ``platform``, into the directory ``out``.

    Returns:
        The plan (also written as ``out/plan.json``).
    Raises:
        AutodiceError: any problem with the inputs, all of them listed; ``out`` is untouched.
    """
    model, out = Path(model), Path(out)
    # Each read once, and the text read is what the output keeps: a pipe (`-m <(...)`) reads
    # only once, and a file edited meanwhile must not leave a copy the plan disagrees with.
    problems = Problems()
    platform_text, mapping_text = (problems.attempt(read_text, p) for p in (platform, mapping))
    if platform_text is not None:
        platform_spec = problems.attempt(parse_platform_text, platform_text, str(platform))
    if mapping_text is not None:
        mapping_spec = problems.attempt(parse_mapping_text, mapping_text, str(mapping))
    graph = problems.attempt(load_model, model, input_shapes)
    problems.raise_if_any()  # every file's, at once
    with tempfile.TemporaryDirectory(prefix="autodice-split-") as work:
        done = partition_mapping(graph, mapping_spec, platform_spec, out, Path(work))
        with staged(out) as tmp:
            write_submodels(done.graph, done.plan, tmp)
            write_tables(done.plan, tmp)
            (tmp / "mapping.json").write_text(mapping_text, encoding="utf-8")
            (tmp / "platform.txt").write_text(platform_text, encoding="utf-8")
    return done.plan


@dataclass(frozen=True)
class Partitioned:
    """The plan, and the model its sub-models are cut from (rewritten where layers are split
    across keys; its sliced weights live in the ``work`` folder the passes were given)."""

    graph: Graph
    plan: Plan


def plan_mapping(graph: Graph, mapping: Mapping, platform: Platform,
                 out_dir: Path = Path(".")) -> Plan:
    """The checked plan of ``mapping`` of ``graph`` onto ``platform``; writes nothing.

    Args:
        out_dir: the directory the plan's paths are relative to (``split``'s output).
    Raises:
        AutodiceError: any problem with the mapping, all of them listed.
    """
    return partition_mapping(graph, mapping, platform, out_dir).plan


def partition_mapping(graph: Graph, mapping: Mapping, platform: Platform, out_dir: Path,
                      work: Path | None = None) -> Partitioned:
    """The passes, in order: check the keys, split the layers listed under several keys
    (horizontal), place every layer, find the cut edges, build the plan, add the stage copies
    (data parallelism), check the plan's invariants.

    Args:
        work: where split layers' weight slices are written, for sub-models to copy; None
            plans only (the search scores many mappings and writes none).

    Raises:
        AutodiceError: any problem with the mapping, all of them listed.
    """
    resources = check_resources(mapping, platform)
    batch_of_one(graph, graph.path)
    vertical = without_replicas(mapping)
    graph, vertical, derived = split_horizontally(graph, vertical, work)
    kept = [k for k, _ in vertical.entries]
    own = tuple(r for r in resources if r.key in kept)
    placement = assign_ranks(graph, vertical, own, platform)
    edges = find_edges(graph, placement, mapping.path)
    plan = build_plan(graph, placement, edges, out_dir, graph.path)
    float32_only(plan, graph.path)
    plan = add_replicas(plan, mapping, resources, bind_slots(resources, platform))
    plan = replace(plan, derived=derived)
    check_plan(plan)
    return Partitioned(graph, plan)


def plan_graph(out_dir: Path, plan: Plan, model: Path | None = None) -> Graph:
    """The model a split output's plan was made of: the model itself, or, when layers were
    split across keys, the model as the split rewrote it (re-planned from the output's
    mapping.json and platform.txt)."""
    graph = load_model(model or out_dir / plan.model,
                       {t.name: t.onnx_shape for t in plan.model_inputs})
    if not plan.derived:
        return graph
    return partition_mapping(graph, parse_mapping(out_dir / "mapping.json"),
                             parse_platform(out_dir / "platform.txt"), out_dir).graph


def split_horizontally(graph: Graph, mapping: Mapping,
                       work: Path | None) -> tuple[Graph, Mapping, dict[str, tuple[str, float]]]:
    """The model rewritten so that each layer listed under several keys is one part per key
    (:mod:`.horizontal`), and the mapping of the rewritten model. Unchanged when no layer is.
    """
    listed: dict[int, list[str]] = {}
    for key, layers in mapping.entries:
        for layer in layers:
            found = graph.resolve(layer)
            if len(found) != 1:
                continue  # unknown or ambiguous: placing says so
            if key in listed.get(found[0], []):  # the rewrite would hide it from placing
                raise AutodiceError(f'{mapping.path}: key "{key}": layer "{layer}" is listed '
                                    "twice")
            listed.setdefault(found[0], []).append(key)
    splits = []
    for i, keys in listed.items():
        if len(keys) < 2:
            continue
        name = graph.names[i]
        items = [next((v for (k, layer), v in mapping.split_items.items()
                       if k == key and graph.resolve(layer) == (i,)), ("", None)) for key in keys]
        kinds = {kind for kind, _ in items if kind}
        if len(kinds) > 1:
            raise AutodiceError(f'{mapping.path}: layer "{name}" is split as '
                                f"{' and '.join(sorted(kinds))} under different keys: one way")
        given = [share for _, share in items]
        mean = sum(s for s in given if s) / max(1, sum(1 for s in given if s))
        shares = tuple(s or mean or 1.0 for s in given)
        splits.append(Split(name, tuple(keys), next(iter(kinds), ""),
                            tuple(x / sum(shares) for x in shares)))
    if not splits:
        return graph, mapping, {}
    key_of = {graph.names[i]: keys[0] for i, keys in listed.items() if len(keys) == 1}
    done = split_layers(graph, splits, key_of, work, mapping.path)
    new_graph = build_graph(graph.path, done.lazy)
    entries = []
    for key, layers in mapping.entries:
        kept = [layer for layer in layers
                if not (len(graph.resolve(layer)) == 1 and
                        graph.names[graph.resolve(layer)[0]] in done.replaced)]
        entries.append((key, tuple([*kept, *(n for n, k in done.assigned.items() if k == key)])))
    derived = {n: (d.origin, d.fraction) for n, d in done.derived.items()}
    return new_graph, replace(mapping, entries=tuple(entries), split_items={}), derived
