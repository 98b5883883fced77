"""The plan: what every rank runs, receives and sends. Every stage after ``split`` reads only this.

Frozen dataclasses, so a pass returns a new plan instead of editing one, and ``plan.json`` is their
byte-stable rendering (fixed key order, no timestamps, paths relative to the output directory).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import AutodiceError, parse_nested, read_text

PLAN_VERSION = 1


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # as the ranks hold and exchange it (at most four axes of a Mat)
    dtype: str  # numpy name: "float32", "int64", ...
    nbytes: int
    # The shape the model gives it, where that is not ``shape`` (a 5-D output, or one with unit
    # axes ncnn drops, carried as its Mat form: the same bytes): what results are shaped as.
    model_shape: tuple[int, ...] | None = None

    @property
    def onnx_shape(self) -> tuple[int, ...]:
        """The shape the model gives this tensor."""
        return self.model_shape or self.shape


@dataclass(frozen=True)
class Edge:
    """One tensor crossing ranks: sent once per frame by ``src`` to every rank in ``dst``.

    ``tag`` is unique per edge, so a receiver can match messages without ordering assumptions;
    a model input read on one rank and needed on others is an edge too (``kind="input"``).
    """

    tensor: str
    src: int
    dst: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    tag: int
    kind: str = "activation"  # or "input"


@dataclass(frozen=True)
class Step:
    """Wait for ``wait`` (received tensors), then compute ``extract`` and send what is cut.

    Steps follow the global data-dependency order, so a rank that both feeds and consumes a peer
    (ping-pong) never blocks on a tensor that depends on what it has not sent yet.
    """

    wait: tuple[str, ...]
    extract: tuple[str, ...]


@dataclass(frozen=True)
class Memory:
    """Per-rank memory for one frame (DeepDSL-style static estimate), bytes."""

    params: int
    peak_activations: int
    recv_bytes: int
    send_bytes: int  # on the wire: a tensor sent to two ranks counts twice


@dataclass(frozen=True)
class Rank:
    rank: int
    key: str
    host: str
    device: str  # "cpu" | "gpu"
    gpu_index: int
    slots: tuple[int, ...]
    threads: int
    submodel: str  # path relative to the output directory
    layers: tuple[str, ...]  # mapped layers, in execution order
    followers: tuple[str, ...]  # constants and shape arithmetic copied here for its layers
    inputs: tuple[str, ...]  # model inputs this rank reads
    outputs: tuple[str, ...]  # model outputs this rank produces
    recv: tuple[Edge, ...]
    send: tuple[Edge, ...]
    submodel_inputs: tuple[TensorSpec, ...]  # graph inputs, in order (pnnx names them in0, in1...)
    submodel_outputs: tuple[TensorSpec, ...]  # graph outputs, in order (out0, out1...)
    steps: tuple[Step, ...]
    memory: Memory
    # Data parallelism: the ranks of this rank's stage, in turn order (frame f goes to
    # replicas[f % len]); empty when the stage is this rank alone.
    replicas: tuple[int, ...] = ()

    def turns(self) -> tuple[int, ...]:
        """The ranks taking turns at this rank's stage (itself alone when not replicated)."""
        return self.replicas or (self.rank,)


@dataclass(frozen=True)
class Plan:
    model: str  # path of the whole model, relative to the output directory when possible
    model_inputs: tuple[TensorSpec, ...]
    model_outputs: tuple[TensorSpec, ...]
    ranks: tuple[Rank, ...]
    edges: tuple[Edge, ...]
    version: int = field(default=PLAN_VERSION)
    # Layers a horizontal split made: name -> (the layer it computes part of, share of its work)
    derived: dict[str, tuple[str, float]] = field(default_factory=dict)

    def hosts(self) -> list[str]:
        """Hosts in order of their first rank."""
        return list(dict.fromkeys(r.host for r in self.ranks))


def human_bytes(n: float) -> str:
    """``1234567`` -> ``"1.2 MB"`` (decimal units, as tables and pictures show sizes)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _tensor_json(t: TensorSpec) -> dict:
    return {"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "bytes": t.nbytes,
            **({"model_shape": list(t.model_shape)} if t.model_shape else {})}


def _edge_json(e: Edge) -> dict:
    return {"tensor": e.tensor, "from": e.src, "to": list(e.dst), "shape": list(e.shape),
            "dtype": e.dtype, "bytes": e.nbytes, "tag": e.tag, "kind": e.kind}


def plan_to_json(plan: Plan) -> dict:
    ranks = []
    for r in plan.ranks:
        ranks.append({
            "rank": r.rank, "key": r.key, "host": r.host, "device": r.device,
            "gpu_index": r.gpu_index, "slots": list(r.slots), "threads": r.threads,
            "submodel": r.submodel, "layers": list(r.layers), "followers": list(r.followers),
            "inputs": list(r.inputs), "outputs": list(r.outputs),
            "recv": [{"tensor": e.tensor, "from": e.src, "shape": list(e.shape),
                      "dtype": e.dtype, "bytes": e.nbytes, "tag": e.tag} for e in r.recv],
            "send": [{"tensor": e.tensor, "to": list(e.dst), "shape": list(e.shape),
                      "dtype": e.dtype, "bytes": e.nbytes, "tag": e.tag} for e in r.send],
            "submodel_inputs": [_tensor_json(t) for t in r.submodel_inputs],
            "submodel_outputs": [_tensor_json(t) for t in r.submodel_outputs],
            "steps": [{"wait": list(s.wait), "extract": list(s.extract)} for s in r.steps],
            "memory": {"params": r.memory.params, "peak_activations": r.memory.peak_activations,
                       "recv_bytes": r.memory.recv_bytes, "send_bytes": r.memory.send_bytes},
            **({"replicas": list(r.replicas)} if r.replicas else {}),
        })
    return {
        "version": plan.version,
        "model": plan.model,
        "model_inputs": [_tensor_json(t) for t in plan.model_inputs],
        "model_outputs": [_tensor_json(t) for t in plan.model_outputs],
        "edges": [_edge_json(e) for e in plan.edges],
        "ranks": ranks,
        **({"derived": {k: list(v) for k, v in plan.derived.items()}} if plan.derived else {}),
    }


def dumps(obj) -> str:
    """JSON with two-space indents but short lists of scalars on one line: readable diffs."""

    def render(o, indent: str) -> str:
        inner = indent + "  "
        if isinstance(o, dict):
            if not o:
                return "{}"
            items = [f"{inner}{json.dumps(k)}: {render(v, inner)}" for k, v in o.items()]
            return "{\n" + ",\n".join(items) + "\n" + indent + "}"
        if isinstance(o, list):
            flat = json.dumps(o)
            if all(not isinstance(x, (dict, list)) for x in o) and len(flat) + len(indent) < 100:
                return flat
            if not o:
                return "[]"
            return "[\n" + ",\n".join(inner + render(x, inner) for x in o) + "\n" + indent + "]"
        return json.dumps(o)

    return render(obj, "") + "\n"


def _tensor(d: dict) -> TensorSpec:
    model_shape = d.get("model_shape")
    return TensorSpec(d["name"], tuple(d["shape"]), d["dtype"], d["bytes"],
                      tuple(model_shape) if model_shape else None)


def plan_from_json(data: dict) -> Plan:
    """Rebuild a :class:`Plan` from ``plan_to_json`` output (edges are shared objects)."""
    edges = tuple(Edge(e["tensor"], e["from"], tuple(e["to"]), tuple(e["shape"]), e["dtype"],
                       e["bytes"], e["tag"], e["kind"]) for e in data["edges"])
    by_tag = {e.tag: e for e in edges}
    ranks = []
    for r in data["ranks"]:
        ranks.append(Rank(
            r["rank"], r["key"], r["host"], r["device"], r["gpu_index"], tuple(r["slots"]),
            r["threads"], r["submodel"], tuple(r["layers"]), tuple(r["followers"]),
            tuple(r["inputs"]), tuple(r["outputs"]),
            tuple(by_tag[x["tag"]] for x in r["recv"]), tuple(by_tag[x["tag"]] for x in r["send"]),
            tuple(_tensor(t) for t in r["submodel_inputs"]),
            tuple(_tensor(t) for t in r["submodel_outputs"]),
            tuple(Step(tuple(s["wait"]), tuple(s["extract"])) for s in r["steps"]),
            Memory(**r["memory"]), tuple(r.get("replicas", ())),
        ))
    return Plan(data["model"], tuple(_tensor(t) for t in data["model_inputs"]),
                tuple(_tensor(t) for t in data["model_outputs"]), tuple(ranks), edges,
                data["version"], {k: (v[0], float(v[1])) for k, v in
                                  data.get("derived", {}).items()})


# The invariants every plan must hold, checked apart from the passes that build it. The passes
# are written to produce valid plans; this checker is how we know. ``split`` runs it before writing
# anything, the tests run it on every plan they make, and ``load_plan`` on every plan.json it reads
# back (which anyone may have edited). They live with the plan because they are its contract.


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
        turns = r.turns()
        if (len(set(turns)) != len(turns) or not all(0 <= k < n for k in turns)
                or any(plan.ranks[k].turns() != turns for k in turns)):
            bad.append(f"rank {r.rank}: its stage's ranks {list(turns)} are not ranks that each "
                       "name the same")
        elif r.rank not in turns or plan.ranks[turns[0]].layers != r.layers:
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


def load_plan(out_dir: str | Path) -> Plan:
    """The plan in ``out_dir/plan.json``, checked like any input: anyone may have edited it, and
    its paths, host names and tables become files, rankfiles, ssh arguments and C++.

    Raises:
        AutodiceError: no plan there, one written by an incompatible version, or every field
            that is of the wrong type or range, leaves the output, or contradicts another.
    """
    from .plan_json import check_plan_json

    path = Path(out_dir) / "plan.json"
    if not path.exists():
        raise AutodiceError(f"{path}: no plan here; run `autodice split` first")
    try:
        data = parse_nested(json.loads, read_text(path), path)
    except json.JSONDecodeError as e:
        raise AutodiceError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
    version = data.get("version") if isinstance(data, dict) else None
    if isinstance(data, dict) and version != PLAN_VERSION:
        raise AutodiceError(f"{path}: plan version {version} is not "
                            f"{PLAN_VERSION}; re-run `autodice split`")
    problems = check_plan_json(data, str(path))
    if problems:
        raise AutodiceError(*problems)
    plan = plan_from_json(data)
    check_plan(plan, str(path))
    return plan
