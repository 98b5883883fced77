"""Round trips: the longest path of one frame through the layer graph, for ping-pong mappings.

A rank runs its layers for one frame in order; when its data goes to other ranks and comes back
within the frame it waits for the detour. These functions find which candidates have such a round
trip (:func:`has_round_trip`, from the rank graph) and, for those only, each rank's span from its
first layer to its last (:func:`frame_spans`, over the layer edges of :func:`layer_edges`). The fast
path and :func:`~autodice.dse.cost.plan_cost` both call them.
"""

from __future__ import annotations

import numpy as np

from ..core.model import Graph


def layer_edges(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(producer position, consumer position, bytes) of every layer-to-layer tensor, positions
    among the mapped layers in topological order."""
    layer_nodes = [i for i in range(len(graph.nodes)) if i not in graph.followers]
    pos = {n: k for k, n in enumerate(layer_nodes)}
    src, dst, nbytes = [], [], []
    for k, i in enumerate(layer_nodes):
        for t in dict.fromkeys(graph.nodes[i].input):
            p = graph.producer.get(t)
            if p is not None and p in pos:
                src.append(pos[p])
                dst.append(k)
                nbytes.append(float(graph.types[t].nbytes) if t in graph.types else 0.0)
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(nbytes)


def frame_spans(lg: np.ndarray, d: np.ndarray, src: np.ndarray, dst: np.ndarray,
                w: np.ndarray, K: int) -> np.ndarray:
    """Longest path of one frame from each rank's first layer to its last, (P, K) seconds.

    Args:
        lg: (P, N) rank of each layer; d: (P, N) its latency there.
        src, dst: the layer graph's edges (positions, ``src < dst``); w: (P, E) their transfer
            times (0 within a rank).
        K: ranks per candidate.

    A rank's layers form a chain (it runs them in order), so paths leave a rank only through
    edges to other ranks; a path that comes back is a round trip the rank has to wait for.
    Dynamic programming in topological order, vectorized over candidates and source ranks.
    """
    P, N = lg.shape
    rows = np.arange(P)
    # Previous layer on the same rank, from a stable sort of the layers by rank; N (a row of
    # -inf in ``dist``) where there is none, so the chain edge is one gather for all candidates.
    flat = (rows[:, None] * K + lg).ravel()
    order = np.argsort(flat, kind="stable")
    prev_flat = np.full(P * N, N, dtype=np.int64)
    same = flat[order[1:]] == flat[order[:-1]]
    prev_flat[order[1:][same]] = order[:-1][same] % N
    prev = prev_flat.reshape(P, N).T.copy()  # (N, P)
    first = prev == N
    lgT, dT, wT = lg.T.copy(), d.T[:, :, None].copy(), w.T[:, :, None].copy()
    incoming: list[list[int]] = [[] for _ in range(N)]
    for e, t in enumerate(dst):
        incoming[t].append(e)
    dist = np.full((N + 1, P, K), -np.inf)  # dist[n, i, k]: from rank k's first layer to n's end
    for n in range(N):
        best = dist[prev[n], rows]
        f = first[n]
        if f.any():
            best[rows[f], lgT[n, f]] = 0.0  # the rank starts its frame here
        for e in incoming[n]:
            np.maximum(best, dist[src[e]] + wT[e], out=best)
        np.add(best, dT[n], out=dist[n])
    last = np.full(P * K, -1, dtype=np.int64)
    np.maximum.at(last, flat, np.broadcast_to(np.arange(N), (P, N)).ravel())
    last = last.reshape(P, K)
    span = np.where(last >= 0, dist[np.maximum(last, 0), rows[:, None], np.arange(K)[None, :]],
                    0.0)
    return np.maximum(span, 0.0)


def has_round_trip(adjacency: np.ndarray) -> np.ndarray:
    """(P, K, K) rank-to-rank sends -> (P,) whether some rank's data comes back to it."""
    reach = adjacency.astype(np.float64)
    for _ in range(max(1, int(np.ceil(np.log2(max(adjacency.shape[1], 2)))))):
        reach = np.minimum(reach + reach @ reach, 1.0)
    return np.trace(reach, axis1=1, axis2=2) > 0
