"""How cut tensors that cross hosts travel: ``gen --wire fp32|fp16|int8``.

Where a pipeline's pace is its link (boards on 100 Mbit/s Ethernet or Wi-Fi), sending fewer bytes
is the cheapest speed there is:

- ``fp32`` (the default): as computed, equal to onnxruntime;
- ``fp16``: IEEE half floats rounded to the nearest even, half the bytes; each value moves by at
  most 2^-11 of itself (values below 6.1e-5 by at most 3e-8);
- ``int8``: 8-bit steps between the frame's smallest and largest value of the tensor, which travel
  with it: a quarter of the bytes, plus 8; each value moves by at most (max - min) / 510.

Only float32 tensors between ranks on different hosts change: within a host a message is a
memcpy through shared memory, where converting costs more than it saves. An fp16 edge whose
values, on the inputs gen checks conversions with, pass fp16's range (:mod:`.fp16_range`) keeps
fp32, and gen says so. The choice is kept in ``packages/.wire``, so ``check``, ``predict`` and a
plan made again after a lost board read what the program does. The runtime's half of it is
``wire_pack`` / ``wire_unpack`` (``runtime_cpp/autodice_tensors.cpp``); :func:`through` is the
same arithmetic in numpy, for ``check``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..core.errors import AutodiceError
from ..core.plan import Edge, Plan

WIRES = ("fp32", "fp16", "int8")
# The share of its fp32 bytes a tensor that crosses hosts takes, as the cost model counts it
# (int8's 8 bytes of min and step, and int64 tensors, which never shrink, left out: both paths of
# autodice.dse.cost price alike).
WIRE_SHARE = {"fp32": 1.0, "fp16": 0.5, "int8": 0.25}
WIRE_FILE = ".wire"  # in packages/, beside .precision


def wire_bytes(kind: str, elements: int) -> int:
    """The bytes ``elements`` float32 values take as ``kind`` carries them (the runtime's
    ``wire_bytes``)."""
    return {"fp32": 4 * elements, "fp16": 2 * elements, "int8": 8 + elements}[kind]


def crosses_hosts(plan: Plan, src: int, dst: int) -> bool:
    """Whether a message from stage ``src`` to stage ``dst`` may leave its host (any copy of
    one stage on another host than any copy of the other)."""
    hosts = {plan.ranks[k].host for k in (*plan.ranks[src].turns(), *plan.ranks[dst].turns())}
    return len(hosts) > 1


@dataclass(frozen=True)
class Wire:
    """The format asked for, and the edges (by tag) kept in fp32 because their values pass
    fp16's range."""
    kind: str = "fp32"
    kept: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, text: str) -> Wire:
        """Raises:
            AutodiceError: not one of :data:`WIRES`."""
        if text not in WIRES:
            raise AutodiceError(f"--wire {text}: the wire format is one of {', '.join(WIRES)}")
        return cls(text)

    @classmethod
    def of_output(cls, out_dir: str | Path) -> Wire:
        """What ``gen`` chose in ``out_dir`` (fp32 before gen, or a gen before ``--wire``)."""
        try:
            data = json.loads((Path(out_dir) / "packages" / WIRE_FILE).read_text())
            return cls(data["wire"], frozenset(data.get("kept_fp32", ())))
        except (OSError, ValueError, KeyError, TypeError):
            return cls()

    def dumps(self) -> str:
        return json.dumps({"wire": self.kind, "kept_fp32": sorted(self.kept)}) + "\n"

    def of(self, plan: Plan, e: Edge, dst: int) -> str:
        """How ``e`` travels to stage ``dst``."""
        if (self.kind == "fp32" or e.dtype != "float32" or e.tag in self.kept
                or not crosses_hosts(plan, e.src, dst)):
            return "fp32"
        return self.kind

    def nbytes(self, plan: Plan, e: Edge, dst: int) -> int:
        """The bytes one frame of ``e`` takes on its way to ``dst``."""
        kind = self.of(plan, e, dst)
        return e.nbytes if kind == "fp32" else wire_bytes(kind, e.nbytes // 4)

    def smaller(self, plan: Plan) -> list[tuple[Edge, int, str]]:
        """Every (edge, destination, format) that travels in fewer bytes than fp32."""
        return [(e, d, k) for e in plan.edges for d in e.dst
                if (k := self.of(plan, e, d)) != "fp32"]

    def arrival(self, plan: Plan):
        """``(rank, tensor name, value) -> value`` as it reaches that rank: for chaining the
        sub-models as a run computes (:func:`~autodice.frontend.check.chain_values`)."""
        kinds = {(d, e.tensor): kind for e, d, kind in self.smaller(plan)}

        def arrive(rank, name: str, value):
            kind = kinds.get((rank.turns()[0], name))
            return value if kind is None else through(value, kind)

        return arrive

    def rank_bytes(self, plan: Plan, rank: int) -> tuple[int, int]:
        """Bytes rank ``rank`` sends and receives a frame, as they travel."""
        r = plan.ranks[rank]
        stage = r.turns()[0]
        sent = sum(self.nbytes(plan, e, d) for e in r.send for d in e.dst)
        received = sum(self.nbytes(plan, e, stage) for e in r.recv)
        return sent, received


def through(value, kind: str):
    """``value`` (float32) as it arrives after travelling as ``kind``: the runtime's
    arithmetic, rounding for rounding."""
    import numpy as np

    x = np.asarray(value, np.float32)
    if kind == "fp32" or x.size == 0:
        return x
    if kind == "fp16":
        with np.errstate(over="ignore"):  # past 65504: inf, as the runtime sends it
            return x.astype(np.float16).astype(np.float32)
    lo, hi = x.min(), x.max()
    step = np.float32((hi - lo) / np.float32(255))
    inv = np.float32(1) / step if step > 0 else np.float32(0)
    steps = np.clip(np.rint((x - lo) * inv), 0, 255).astype(np.uint8)
    return (lo + steps.astype(np.float32) * step).astype(np.float32)
