"""From a placement to the plan: cut edges, each rank's sub-model interface, steps and memory."""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import Problems
from ..core.model import Graph
from ..core.plan import Edge, Memory, Plan, Rank, Step, TensorSpec
from ..core.shapes import mat_form
from .legalize import BATCH_OPS
from .lower import batched_tensors
from .lower_rules import ELEMENTWISE
from .place import Placement


def tensor_spec(graph: Graph, name: str, batched: frozenset[str] = frozenset()) -> TensorSpec:
    """The tensor as ranks exchange it: as the model has it where an ncnn Mat holds it (at most
    four axes, or a batch of one pnnx sees as such (``batched``) and four more), else in its
    ``mat_form``, which the sub-models reshape from and to at their edges."""
    t = graph.types[name]
    shape = model_shape = tuple(int(d) for d in t.shape)
    if len(shape) > 4 and not (len(shape) == 5 and shape[0] == 1 and name in batched):
        shape = mat_form(shape)
    return TensorSpec(name, shape, t.dtype, t.nbytes,
                      model_shape if model_shape != shape else None)


def consumer_ranks(graph: Graph, placement: Placement, tensor: str) -> set[int]:
    """Ranks whose layers read ``tensor`` (followers only read constants and static shapes)."""
    ranks: set[int] = set()
    for c in graph.consumers.get(tensor, ()):
        if c not in graph.followers:
            ranks.update(placement.node_ranks[c])
    return ranks


def input_owners(graph: Graph, placement: Placement) -> dict[str, int]:
    """The rank that reads each model input: its first consumer, which forwards it to others."""
    owners = {}
    for name in graph.inputs:
        ranks = consumer_ranks(graph, placement, name)
        if ranks:
            owners[name] = min(ranks)
    return owners


def find_edges(graph: Graph, placement: Placement, mapping_path: str) -> tuple[Edge, ...]:
    """Every tensor some rank produces (or reads as model input) and another rank consumes.

    A model input is read by the first rank that consumes it and forwarded from there, so a
    frame enters the system once. Edges come in production order; the tag is the edge's index.

    Raises:
        AutodiceError: a cut tensor whose shape is not static (name the layers and ranks).
    """
    node_ranks = placement.node_ranks
    cuts: list[tuple[str, int, tuple[int, ...], str]] = []
    for name, src in input_owners(graph, placement).items():
        dst = consumer_ranks(graph, placement, name) - {src}
        if dst:
            cuts.append((name, src, tuple(sorted(dst)), "input"))
    for i, node in enumerate(graph.nodes):
        if i in graph.followers:
            continue
        src = node_ranks[i][0]
        for t in node.output:
            if t:
                dst = consumer_ranks(graph, placement, t) - {src}
                if dst:
                    cuts.append((t, src, tuple(sorted(dst)), "activation"))
    problems = Problems()
    keys = [r.key for r in placement.resources]
    for t, src, dst, _ in cuts:
        ty = graph.types.get(t)
        if ty is None or not ty.static:
            shape = ty.shape_str() if ty else "unknown"
            problems.add(f'{mapping_path}: tensor "{t}" from key "{keys[src]}" to '
                         f'{", ".join(chr(34) + keys[d] + chr(34) for d in dst)} has no static '
                         f"shape ({shape}); give the input shape with --input-shape NAME=1x3x...",
                         f"{mapping_path}: and {{n}} more cut tensors without a static shape")
    problems.raise_if_any()
    batched = batched_tensors(graph)
    specs = [tensor_spec(graph, t, batched) for t, *_ in cuts]
    return tuple(Edge(t, src, dst, spec.shape, spec.dtype, spec.nbytes, tag=k, kind=kind)
                 for k, ((t, src, dst, kind), spec) in enumerate(zip(cuts, specs)))


def build_plan(graph: Graph, placement: Placement, edges: tuple[Edge, ...], out_dir: Path,
               model_path: Path) -> Plan:
    """The plan: per rank its layers, sub-model interface, steps, peers and memory."""
    n_ranks = len(placement.resources)
    members: list[list[int]] = [[] for _ in range(n_ranks)]
    for i, ranks in enumerate(placement.node_ranks):
        for r in ranks:
            members[r].append(i)
    order = {name: k for k, name in enumerate(graph.inputs)}
    for i, node in enumerate(graph.nodes):
        for t in node.output:
            order.setdefault(t, len(graph.inputs) + i)
    sends = [[e for e in edges if e.src == r] for r in range(n_ranks)]
    recvs = [[e for e in edges if r in e.dst] for r in range(n_ranks)]
    owner = input_owners(graph, placement)
    out_owner = {}
    for t in graph.outputs:
        if t in graph.producer:
            out_owner[t] = placement.node_ranks[graph.producer[t]][0]
        elif t in owner:
            out_owner[t] = owner[t]

    batched = batched_tensors(graph)
    ranks = []
    for r, res in enumerate(placement.resources):
        nodes = members[r]
        produced = {t for i in nodes for t in graph.nodes[i].output if t}
        inputs = tuple(n for n in graph.inputs if owner.get(n) == r)
        outputs = tuple(t for t in graph.outputs if out_owner.get(t) == r)
        received = tuple(e.tensor for e in recvs[r])
        sub_in = inputs + received
        sent = {e.tensor for e in sends[r] if e.kind == "activation"}
        sub_out = tuple(sorted((t for t in produced if t in sent or t in outputs),
                               key=order.__getitem__))
        steps = _steps(graph, nodes, received, sub_out, order)
        ranks.append(Rank(
            rank=r, key=res.key, host=res.host, device=res.kind, gpu_index=res.gpu_index,
            slots=placement.slots[r], threads=len(res.cores) if res.kind == "cpu" else 1,
            submodel=f"models/{res.key}.onnx",
            layers=tuple(graph.names[i] for i in nodes if i not in graph.followers),
            followers=tuple(graph.names[i] for i in nodes if i in graph.followers),
            inputs=inputs, outputs=outputs, recv=tuple(recvs[r]), send=tuple(sends[r]),
            submodel_inputs=tuple(tensor_spec(graph, t, batched) for t in sub_in),
            submodel_outputs=tuple(tensor_spec(graph, t, batched) for t in sub_out),
            steps=steps,
            memory=static_memory(graph, nodes, sub_in, set(sub_out), recvs[r], sends[r]),
        ))
    try:
        model_ref = os.path.relpath(model_path.resolve(), out_dir.resolve())
    except ValueError:  # another drive on Windows
        model_ref = str(model_path.resolve())
    return Plan(model_ref, tuple(tensor_spec(graph, t, batched) for t in graph.inputs),
                tuple(tensor_spec(graph, t, batched) for t in graph.outputs), tuple(ranks), edges)


def _steps(graph: Graph, nodes: list[int], received: tuple[str, ...], outputs: tuple[str, ...],
           order: dict[str, int]) -> tuple[Step, ...]:
    """Group the rank's outputs, in production order, by the received tensors they need first.

    Waiting only for what the next output depends on keeps ping-pong mappings deadlock-free: a
    wait is always for a tensor produced earlier in the global topological order.
    """
    bit = {t: 1 << k for k, t in enumerate(received)}
    needs: dict[str, int] = dict(bit)
    for i in nodes:
        node = graph.nodes[i]
        mask = 0
        for t in node.input:
            mask |= needs.get(t, 0)
        for t in node.output:
            needs[t] = mask
    steps: list[tuple[list[str], list[str]]] = []
    have = 0
    for t in outputs:
        new = needs.get(t, 0) & ~have
        if new or not steps:
            steps.append(([x for x in received if bit[x] & new], []))
            have |= new
        steps[-1][1].append(t)
    return tuple(Step(tuple(sorted(w, key=order.__getitem__)), tuple(x)) for w, x in steps)


def static_memory(graph: Graph, nodes: list[int], sub_in: tuple[str, ...], kept: set[str],
            recvs: list[Edge], sends: list[Edge]) -> Memory:
    """Parameters, plus the peak of live activations walking the rank's layers in order.

    Received and input tensors are live from the start (receives are posted early); a tensor is
    freed after its last local consumer unless it is an output (held until sent).
    """
    weights = {t for i in nodes for t in graph.nodes[i].input if graph.is_weight(t)}
    params = sum(graph.tensors[t].nbytes for t in weights)
    last_use: dict[str, int] = {}
    for k, i in enumerate(nodes):
        for t in graph.nodes[i].input:
            last_use[t] = k
    size = {t: graph.types[t].nbytes if t in graph.types else 0 for t in sub_in}
    live = sum(size.values())
    peak = live
    for k, i in enumerate(nodes):
        if i in graph.followers:
            continue
        for t in graph.nodes[i].output:
            if t and t in graph.types:
                size[t] = graph.types[t].nbytes
                live += size[t]
        peak = max(peak, live)
        for t in graph.nodes[i].input:
            if last_use.get(t) == k and t in size and t not in kept:
                live -= size.pop(t)
    return Memory(params, peak, sum(e.nbytes for e in recvs),
                  sum(e.nbytes * len(e.dst) for e in sends))


# Ops that read axis 0 of their input as a batch of frames and axis 1 as channels (pnnx writes
# them so, and an ncnn Mat has no batch axis): a leading axis above 1 there is a batch.
BATCH_READERS = BATCH_OPS | {"SpaceToDepth", "DepthToSpace"}


def batch_of_one(graph: Graph, model: Path) -> None:
    """Raises AutodiceError naming every model input whose leading axis above 1 reaches an op
    that takes that axis for the batch (directly or through element-wise ops): ncnn computes one
    frame at a time, and such a model came out wrong (LRN by 2.5e-4, BatchNormalization by
    150 %) or not at all. A leading axis that no such op reads is an axis like any other."""
    problems = Problems()
    for name in graph.inputs:
        shape = graph.types[name].shape
        if len(shape) < 3 or shape[0] <= 1:
            continue
        reach, todo, hit = {name}, [name], None
        while todo and hit is None:
            t = todo.pop()
            for c in graph.consumers.get(t, ()):
                node = graph.nodes[c]
                if node.op_type in BATCH_READERS:
                    hit = node
                    break
                if node.op_type in ELEMENTWISE:
                    for o in node.output:
                        if o not in reach and graph.types.get(o) is not None \
                                and tuple(graph.types[o].shape[:1]) == tuple(shape[:1]):
                            reach.add(o)
                            todo.append(o)
        if hit is not None:
            dims = "x".join(map(str, shape))
            one = "x".join(map(str, (1, *shape[1:])))
            problems.add(f'{model}: input "{name}" is {dims}, a batch of {shape[0]} that '
                         f'{hit.op_type} node "{hit.name or hit.output[0]}" reads as frames; '
                         "ncnn computes one frame at a time: export the model with a batch of 1 "
                         f"(or a symbolic one, and --input-shape {name}={one}) and stream the "
                         f"{shape[0]} frames through it")
    problems.raise_if_any()


def float32_only(plan: Plan, model: Path) -> None:
    """Raises AutodiceError naming every model input, model output and cut tensor that is not
    float32: ncnn computes in float32, and the program reads, sends and writes float32 Mats
    only, so such a plan would split and then fail at ``gen`` or when it runs."""
    problems = Problems()
    for t in plan.model_inputs:
        if t.dtype != "float32":
            problems.add(f'{model}: input "{t.name}" is {t.dtype}; the program feeds float32 '
                         "inputs only (export the model with a float32 input)")
    for t in plan.model_outputs:
        if t.dtype != "float32":
            problems.add(f'{model}: output "{t.name}" is {t.dtype}; the program returns '
                         "float32 outputs only (end the model before the layer that makes it)")
    for e in plan.edges:
        if e.kind == "activation" and e.dtype != "float32":
            problems.add(f'{model}: tensor "{e.tensor}" ({e.dtype}) would go from rank {e.src} '
                         f"({plan.ranks[e.src].key}) to another: ranks exchange float32 only; "
                         "map the layers on both sides of it to one key")
    problems.raise_if_any()
