"""The input model as the passes see it: named layers, topological order, static shapes.

Owns the layer table: giving every node a unique layer name, ordering the nodes, and telling
apart the layers a user maps from the *followers* — ``Constant`` nodes and pure shape arithmetic,
which go wherever their consumers go so a mapping never has to mention them. The shapes come from
:mod:`autodice.core.shapes` (inference for batch 1, run once, on a copy that holds no large
weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .errors import AutodiceError, Problems
from .onnxio import LazyModel, TensorRef, read_model
from .shapes import UNSUPPORTED_OPS, TensorType, check_types, infer_types

# Ops whose output is a function of shapes only; with static shapes they become constants.
SHAPE_OPS = frozenset({"Shape", "Size"})


@dataclass
class Graph:
    """The loaded model plus the indexes every pass needs. Nodes are in topological order."""

    path: Path
    lazy: LazyModel
    nodes: list[onnx.NodeProto]
    names: list[str]  # unique layer name per node
    index: dict[str, int]  # layer name -> node position
    inputs: list[str]  # real model inputs (initializers excluded)
    outputs: list[str]
    producer: dict[str, int]  # tensor -> node position
    consumers: dict[str, list[int]]  # tensor -> node positions, in order
    types: dict[str, TensorType]
    followers: frozenset[int]  # node positions that follow their consumers
    _aliases: dict[str, tuple[int, ...]] | None = field(default=None, repr=False)
    _folded: dict[str, TensorProto] | None = field(default=None, repr=False)

    @property
    def tensors(self) -> dict[str, TensorRef]:
        return self.lazy.tensors

    @property
    def layer_names(self) -> list[str]:
        """The layers a mapping places, in topological order (every node but the followers)."""
        return [self.names[i] for i in range(len(self.nodes)) if i not in self.followers]

    def folded(self) -> dict[str, TensorProto]:
        """The follower outputs whose values small constants determine (:func:`fold_followers`),
        computed once: sub-models write the shape plumbing among them as constants."""
        if self._folded is None:
            self._folded = fold_followers(self.nodes, self.followers, self.types, self.lazy)
        return self._folded

    def is_weight(self, tensor: str) -> bool:
        return tensor in self.lazy.tensors

    def weight_bytes(self, node: int) -> int:
        """Bytes of the weights (initializers) node position ``node`` reads."""
        return sum(self.tensors[t].nbytes for t in set(self.nodes[node].input)
                   if t and self.is_weight(t))

    def resolve(self, layer: str) -> tuple[int, ...]:
        """The node(s) a mapping's layer name may mean: its layer name (what ``autodice layers``
        prints) first; else a node's first output, or that output as the original AutoDiCE tool
        spells it (``/`` -> ``_``). One node: found; none: unknown; several: ambiguous."""
        if layer in self.index:
            return (self.index[layer],)
        if self._aliases is None:
            aliases: dict[str, set[int]] = {}
            for i, node in enumerate(self.nodes):
                if node.output and node.output[0]:
                    first = node.output[0]
                    for alias in (first, first.replace("/", "_")):
                        aliases.setdefault(alias, set()).add(i)
            self._aliases = {a: tuple(sorted(s)) for a, s in aliases.items()}
        return self._aliases.get(layer, ())


def load_model(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """Read ``path``, name its layers, infer static shapes for batch 1, find the followers.

    Raises:
        AutodiceError: unreadable file, unknown ``input_shapes`` names, cyclic or unsorted graph.
    """
    path = Path(path)
    return build_graph(path, read_model(path), input_shapes)


def build_graph(path: Path, lazy: LazyModel,
                input_shapes: dict[str, tuple[int, ...]] | None = None) -> Graph:
    """The :class:`Graph` of a lazily read model (or of one a rewrite made from it).

    Raises:
        AutodiceError: unknown ``input_shapes`` names, cyclic or unsorted graph, failed shape
            inference.
    """
    graph = lazy.proto.graph
    if not graph.node:
        raise AutodiceError(f"{path}: the graph has no nodes; there is nothing to split")
    names = name_layers(graph.node)
    check_ops(path, graph.node, names, lazy)
    nodes = sort_nodes(path, list(graph.node), names, lazy)
    if nodes is not graph.node:
        order = {id(n): i for i, n in enumerate(graph.node)}
        names = [names[order[id(n)]] for n in nodes]
    weights = lazy.tensors
    inputs = [i.name for i in graph.input if i.name not in weights]
    outputs = [o.name for o in graph.output]
    untensored = [f'{path}: {kind} "{v.name}" is of '
                  f'{(v.type.WhichOneof("value") or "no").removesuffix("_type")} type, not a '
                  "tensor; autodice splits models of tensors" for kind, vs in
                  (("input", graph.input), ("output", graph.output)) for v in vs
                  if v.name not in weights and v.type.WhichOneof("value") != "tensor_type"]
    if untensored:
        raise AutodiceError(*untensored)
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for t in node.output:
            if t:
                producer[t] = i
        for t in node.input:
            if t:
                consumers.setdefault(t, []).append(i)
    types = infer_types(path, lazy, nodes, inputs, input_shapes or {}, names=names)
    check_types(path, nodes, names, types, producer)
    followers = find_followers(nodes, types, weights)
    # Exporters compute Reshape targets from Shape/Gather/Concat chains that ONNX's data
    # propagation does not follow; evaluating the followers settles them. Each round can make
    # more Shape nodes static (Reshape of a Reshape...), so repeat until nothing changes.
    while any(t and not (t in types and types[t].static) for n in nodes for t in n.output):
        constants = fold_followers(nodes, followers, types, lazy)
        if not constants:
            break
        types = infer_types(path, lazy, nodes, inputs, input_shapes or {}, constants, names)
        grown = find_followers(nodes, types, weights)
        if grown == followers:
            break
        followers = grown
    return Graph(path, lazy, nodes, names, {n: i for i, n in enumerate(names)}, inputs, outputs,
                 producer, consumers, types, followers)


def name_layers(nodes) -> list[str]:
    """Unique layer names: a node's own name, else its first output's (as upstream AutoDiCE
    does); repeats get ``_1``, ``_2``... in graph order, so names are stable across runs."""
    base = [n.name or (n.output[0] if n.output else n.op_type) for n in nodes]
    taken = set(base)
    seen: dict[str, int] = {}
    out = []
    for name in base:
        if name not in seen:
            seen[name] = 0
            out.append(name)
            continue
        k = seen[name]
        while True:
            k += 1
            candidate = f"{name}_{k}"
            if candidate not in taken:
                break
        seen[name] = k
        taken.add(candidate)
        out.append(candidate)
    return out


def sort_nodes(path: Path, nodes: list, names: list[str], lazy: LazyModel):
    """``nodes`` in topological order (the same list when already sorted, as ONNX requires).

    Raises:
        AutodiceError: a node reads a tensor nothing produces, a tensor with two producers
            (ONNX graphs are single-assignment), an output no node produces, or a cycle.
    """
    available = {i.name for i in lazy.proto.graph.input} | set(lazy.tensors) | {""}
    problems = Problems()
    produced_by: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for t in n.output:
            if t and t in produced_by:
                problems.add(f'{path}: tensor "{t}" is the output of both node '
                             f'"{names[produced_by[t]]}" and node "{names[i]}"',
                             f"{path}: and {{n}} more tensors with two producers")
            elif t in available and t:
                problems.add(f'{path}: node "{names[i]}" writes "{t}", which is a model input '
                             "or initializer", f"{path}: and {{n}} more nodes that write an "
                             "input or initializer")
            produced_by.setdefault(t, i)
    for o in lazy.proto.graph.output:
        if o.name not in produced_by:
            problems.add(f'{path}: output "{o.name}" is not produced by any node',
                         f"{path}: and {{n}} more outputs no node produces")
    for i, n in enumerate(nodes):
        for t in n.input:
            if t not in available and t not in produced_by:
                problems.add(f'{path}: node "{names[i]}" reads tensor "{t}" that no node, input '
                             f"or initializer provides",
                             f"{path}: and {{n}} more tensors read but never provided")
    problems.raise_if_any()
    done = set(available)
    if all(_ready(n, done) for n in nodes):
        return nodes
    # Not sorted: Kahn's algorithm, keeping file order among ready nodes.
    pending = list(range(len(nodes)))
    done = set(available)
    order = []
    while pending:
        ready = [i for i in pending if all(t in done for t in nodes[i].input)]
        if not ready:
            raise AutodiceError(f'{path}: the graph has a cycle through node "{names[pending[0]]}"')
        for i in ready:
            order.append(i)
            done.update(nodes[i].output)
        pending = [i for i in pending if i not in set(ready)]
    return [nodes[i] for i in order]


def _ready(node, done: set) -> bool:
    if not all(t in done for t in node.input):
        return False
    done.update(node.output)
    return True


def check_ops(path: Path, nodes, names: list[str], lazy: LazyModel) -> None:
    """Every node's op must be one ONNX defines or a function the model brings: anything else
    has no shape inference (its outputs would be reported as shapeless much later) and no
    converter.

    Raises:
        AutodiceError: one line per unknown op, naming the node.
    """
    functions = {(f.domain, f.name) for f in lazy.proto.functions}
    problems = Problems()
    for i, n in enumerate(nodes):
        domain = "" if n.domain in ("", "ai.onnx") else n.domain
        if (n.domain, n.op_type) in functions or onnx.defs.has(n.op_type, domain):
            continue
        problems.add(f'{path}: node "{names[i]}": op "{n.op_type}" is unknown to ONNX (domain '
                     f'"{n.domain or "ai.onnx"}") and not a function of the model, so nothing '
                     "can infer its shapes or convert it",
                     f"{path}: and {{n}} more nodes of unknown ops")
    problems.raise_if_any()


def find_followers(nodes, types: dict[str, TensorType], weights) -> frozenset[int]:
    """Nodes that compute only from constants and static shapes.

    They are cheap and their outputs are not activations, so they run on every rank that consumes
    them instead of being sent: a mapping need not list them. ``Shape``/``Size`` of a static
    tensor counts as constant (it is folded when sub-models are written).
    """
    static_tensors = set(weights)
    followers = set()
    for i, n in enumerate(nodes):
        if n.op_type in SHAPE_OPS:
            ok = bool(n.input) and n.input[0] in types and types[n.input[0]].static
        else:
            ok = all(t in static_tensors for t in n.input if t)
        if ok and n.op_type not in UNSUPPORTED_OPS:
            followers.add(i)
            static_tensors.update(t for t in n.output if t)
    return frozenset(followers)


def fold_followers(nodes, followers: frozenset[int], types: dict[str, TensorType],
                   lazy: LazyModel) -> dict[str, TensorProto]:
    """Values of the follower outputs that small constants determine (empty if none can be).

    Runs onnx's reference evaluator on the followers alone, ``Shape`` folded to constants;
    followers that read a large weight are left out (they are weight transforms, not shapes).
    """
    from onnx.reference import ReferenceEvaluator

    known = set(lazy.small)
    chosen = []
    for i in sorted(followers):
        node = nodes[i]
        if node.op_type in SHAPE_OPS:
            chosen.append(shape_constant(node, types))
        elif all(t in known for t in node.input if t):
            chosen.append(node)
        else:
            continue
        known.update(t for t in node.output if t)
    outputs = [t for n in chosen for t in n.output if t]
    if not outputs:
        return {}
    used = {t for n in chosen for t in n.input if t in lazy.small}
    graph = helper.make_graph(chosen, "followers", [],
                              [helper.make_tensor_value_info(t, TensorProto.UNDEFINED, None)
                               for t in outputs],
                              [lazy.small[t] for t in sorted(used)])
    model = helper.make_model(graph, opset_imports=lazy.proto.opset_import,
                              ir_version=max(lazy.proto.ir_version, 4))
    try:
        values = ReferenceEvaluator(model).run(None, {})
    except Exception:  # unfoldable: keep what inference found
        return {}
    return {t: numpy_helper.from_array(np.asarray(v), t) for t, v in zip(outputs, values)
            if np.asarray(v).nbytes <= 4096}


def shape_constant(node, types: dict[str, TensorType]) -> onnx.NodeProto:
    """A ``Constant`` node with the value a ``Shape``/``Size`` node computes on static shapes."""
    shape = np.array(types[node.input[0]].shape, dtype=np.int64)
    if node.op_type == "Size":
        value = np.array(int(np.prod(shape)), dtype=np.int64)
    else:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        value = shape[attrs.get("start", 0):attrs.get("end", len(shape))]
    return helper.make_node("Constant", [], [node.output[0]], name=node.name,
                            value=numpy_helper.from_array(value))
