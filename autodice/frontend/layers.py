"""What a user needs to write a mapping: one row per layer, with its shape, weights and FLOPs."""

from __future__ import annotations

from ..core.model import Graph


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
