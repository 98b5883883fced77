"""Invariants every plan must hold, checked apart from the passes that build it.

The passes are written to produce valid plans; this checker is how we know. ``split`` runs it
before writing anything, the tests run it on every plan they make, and ``load_plan`` runs it on
every plan.json it reads back (which anyone may have edited).
"""

from __future__ import annotations

from ..core.errors import AutodiceError
from ..core.plan import Plan


def check_plan(plan: Plan, where: str | None = None) -> None:
    """Raise AutodiceError listing every broken invariant.

    A replicated stage counts once: its ranks are copies of its first, and edges name that one.

    Args:
        where: the plan.json the plan was read from; None for a plan the passes just made, where
            a broken invariant is an internal error.
    """
    bad: list[str] = []
    tags = [e.tag for e in plan.edges]
    if len(set(tags)) != len(tags):
        bad.append("edge tags are not unique")
    n = len(plan.ranks)
    for e in plan.edges:
        if e.src in e.dst:
            bad.append(f'rank {e.src} sends "{e.tensor}" to itself')
        if not e.dst or any(not 0 <= d < n for d in e.dst) or not 0 <= e.src < n:
            bad.append(f'edge "{e.tensor}" names a rank outside 0..{n - 1}')
    stages = [r for r in plan.ranks if r.turns()[0] == r.rank]
    for r in plan.ranks:
        first = plan.ranks[r.turns()[0]] if 0 <= r.turns()[0] < n else None
        if first is None or r.rank not in first.turns() or first.layers != r.layers:
            bad.append(f"rank {r.rank} copies a stage it does not match")
    layers = [layer for r in stages for layer in r.layers]
    if len(set(layers)) != len(layers):
        bad.append("a layer is placed on two ranks")
    produced_outputs = [t for r in stages for t in r.outputs]
    if sorted(produced_outputs) != sorted(t.name for t in plan.model_outputs):
        bad.append("model outputs are not each produced by exactly one rank")
    model_inputs = {t.name for t in plan.model_inputs}
    for r in plan.ranks:
        if not set(r.inputs) <= model_inputs:
            bad.append(f"rank {r.rank} reads inputs that are not the model's")
        specs = {t.name: t for t in (*r.submodel_inputs, *r.submodel_outputs)}
        for e in (*r.recv, *r.send):
            spec = specs.get(e.tensor)
            if spec is not None and (spec.shape, spec.dtype) != (e.shape, e.dtype):
                bad.append(f'rank {r.rank}: "{e.tensor}" is {spec.dtype} {spec.shape} in its '
                           f"sub-model but {e.dtype} {e.shape} on the wire")
        got = {e.tensor for e in r.recv}
        me = r.turns()[0]
        for e in r.recv:
            if me not in e.dst:
                bad.append(f'rank {r.rank} receives "{e.tensor}" but is not its destination')
        senders = {}
        for e in plan.edges:
            if me in e.dst:
                senders.setdefault(e.tensor, []).append(e.src)
        for t, src in senders.items():
            if len(src) != 1 or t not in got:
                bad.append(f'rank {r.rank} receives "{t}" from {len(src)} senders')
        sub_in = {t.name for t in r.submodel_inputs}
        if sub_in != got | set(r.inputs):
            bad.append(f"rank {r.rank}: sub-model inputs are not its inputs and receives")
        sub_out = [t.name for t in r.submodel_outputs]
        for e in r.send:
            if e.kind == "activation" and e.tensor not in sub_out:
                bad.append(f'rank {r.rank} sends "{e.tensor}" that its sub-model does not output')
            if e.kind == "input" and e.tensor not in r.inputs:
                bad.append(f'rank {r.rank} forwards input "{e.tensor}" it does not read')
        extracted = [t for s in r.steps for t in s.extract]
        if extracted != sub_out:
            bad.append(f"rank {r.rank}: steps do not extract each sub-model output once, in order")
        waited = [t for s in r.steps for t in s.wait]
        if len(set(waited)) != len(waited) or not set(waited) <= got:
            bad.append(f"rank {r.rank}: steps wait for a tensor twice or one it never receives")
    if not bad:
        _check_no_deadlock(plan, bad)
    if bad:
        prefix = f"{where}: " if where else "internal error: invalid plan: "
        raise AutodiceError(*(prefix + b for b in bad))


def _check_no_deadlock(plan: Plan, bad: list[str]) -> None:
    """Run the steps of all ranks as the runtime would; every rank must finish."""
    available = {t.name for r in plan.ranks for t in r.submodel_inputs if t.name in r.inputs}
    sent_by = {e.tensor: e for e in plan.edges}
    pos = [0] * len(plan.ranks)
    stages = [r for r in plan.ranks if r.turns()[0] == r.rank]  # copies run the same steps
    progress = True
    while progress:
        progress = False
        for r in stages:
            while pos[r.rank] < len(r.steps) and set(r.steps[pos[r.rank]].wait) <= available:
                available.update(t for t in r.steps[pos[r.rank]].extract if t in sent_by)
                pos[r.rank] += 1
                progress = True
    stuck = [r.rank for r in stages if pos[r.rank] < len(r.steps)]
    if stuck:
        bad.append(f"ranks {stuck} would wait forever")
