"""Views of the same bytes on fewer axes: the shape arithmetic of :mod:`.lower`.

Each function takes an op's shapes and gives the same op on at most as many axes (axes of length
one dropped, neighbouring axes that move or broadcast together merged), with no ONNX in sight,
so each is proven against numpy directly (tests/test_lower.py).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import deque
from functools import lru_cache

NCNN_AXES = 4

def transpose_view(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                          tuple[int, ...]]:
    """The same transpose on the fewest axes: ``(shape, perm)`` with the axes of length one
    dropped and each run of input axes that stays together, in order, merged into one."""
    kept = [a for a in range(len(shape)) if shape[a] != 1]
    at = {a: i for i, a in enumerate(kept)}
    runs: list[list[int]] = []
    for a in perm:
        if shape[a] == 1:
            continue
        if runs and at[a] == at[runs[-1][-1]] + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    order = sorted(range(len(runs)), key=lambda k: runs[k][0])
    where = {k: i for i, k in enumerate(order)}
    return (tuple(math.prod(shape[a] for a in runs[k]) for k in order),
            tuple(where[k] for k in range(len(runs))))


def _block_moves(n: int):
    """Every permutation of n axes that moves one block of neighbouring axes elsewhere: each
    is a transpose of at most four axes (before, block, between, after)."""
    for i, j in itertools.combinations(range(n + 1), 2):
        block, rest = list(range(i, j)), [a for a in range(n) if not i <= a < j]
        for k in range(len(rest) + 1):
            perm = tuple(rest[:k] + block + rest[k:])
            if perm != tuple(range(n)):
                yield perm


@lru_cache(maxsize=256)
def transposes(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Permutations of ``shape``'s axes, applied in turn, that make ``perm`` and each need at
    most four axes (as ``transpose_view`` sees them); the fewest such steps."""
    goal = tuple(perm)
    start = tuple(range(len(shape)))
    seen = {start: ()}
    queue = deque([start])
    while queue:
        done = queue.popleft()
        steps = seen[done]
        # The rest of the way in one step, if it fits.
        rest = tuple(done.index(a) for a in goal)
        if len(transpose_view(tuple(shape[a] for a in done), rest)[0]) <= NCNN_AXES:
            return (*steps, rest) if rest != start else steps
        for move in _block_moves(len(shape)):
            nxt = tuple(done[m] for m in move)
            if nxt not in seen:
                seen[nxt] = (*steps, move)
                queue.append(nxt)
    raise AssertionError("block moves reach every permutation")  # pragma: no cover


def broadcast_view(shapes: list[tuple[int, ...]], out: tuple[int, ...]):
    """Each operand's shape and the output's on the fewest axes: axes of length one in the
    output dropped, and neighbouring axes merged where every operand either has them whole
    or has length one in all of them."""
    n = len(out)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    runs: list[tuple[tuple[bool, ...], list[int]]] = []
    for ax in range(n):
        if out[ax] == 1:
            continue
        ones = tuple(s[ax] == 1 for s in padded)
        if runs and runs[-1][0] == ones:
            runs[-1][1].append(ax)
        else:
            runs.append((ones, [ax]))
    new_out = tuple(math.prod(out[a] for a in axes) for _, axes in runs)
    new_in = [tuple(1 if ones[i] else d for (ones, _), d in zip(runs, new_out))
              for i in range(len(shapes))]
    return new_in, new_out


def _einsum_terms(equation: str) -> tuple[list[str], str] | None:
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if not all(re.fullmatch(r"[A-Za-z]*", t) for t in (*terms, out)):
        return None
    return terms, out


def einsum_view(equation: str, shapes: list[tuple[int, ...]]):
    """``(terms, out)`` of the same einsum with letters of length one dropped and letters that
    are neighbours, in the same order, in every term and the output merged; None if the
    equation has ellipses or repeated letters in a term."""
    parsed = _einsum_terms(equation)
    if parsed is None:
        return None
    terms, out = parsed
    if any(len(set(t)) != len(t) for t in (*terms, out)):
        return None
    size: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        size.update(zip(t, s))
    terms = ["".join(c for c in t if size[c] != 1) for t in terms]
    out = "".join(c for c in out if size.get(c, 1) != 1)
    everywhere = [*terms, out]

    def follows(a: str, b: str) -> bool:
        """b comes right after a wherever either appears."""
        return all((a in t) == (b in t) and (a not in t or t.index(b) == t.index(a) + 1)
                   for t in everywhere)

    merged: dict[str, str] = {}  # letter -> the first letter of its run
    for t in everywhere:
        for a, b in zip(t, t[1:]):
            if follows(a, b):
                merged[b] = merged.get(a, a)
    terms = ["".join(c for c in t if c not in merged) for t in terms]
    out = "".join(c for c in out if c not in merged)
    total = {c: size[c] for c in size if c not in merged and size[c] != 1}
    for b, a in merged.items():
        total[a] *= size[b]
    return terms, out, total
