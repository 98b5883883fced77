"""What each rank computes in: ``gen --precision``, for all keys or key by key.

``auto`` (the default), ``fp32``, ``fp16`` or ``int8``, for every key, or ``KEY=PRECISION``
items for some keys (``edge01_arm0=int8,edge02_gpu=fp16``), with an item without a key setting
the rest (``fp32,edge01_arm0=int8``). The spelling is kept in ``packages/.precision`` so a plan
regenerated after a lost board computes as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import AutodiceError
from ..core.plan import Plan, Rank

PRECISIONS = ("auto", "fp32", "fp16", "int8")
# The layers an int8 rank keeps in fp32 unless told otherwise (:mod:`.calibrate`); here, where
# the CLI can read it without loading numpy and onnx.
DEFAULT_KEEP_FP32 = ("first", "sensitive")


@dataclass(frozen=True)
class Precision:
    """The precision asked for: a default, and keys that differ from it."""
    default: str = "auto"
    keys: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str, plan: Plan | None = None) -> Precision:
        """``auto``, ``int8``, ``KEY=int8,KEY2=fp16``, ``fp32,KEY=int8`` ...

        Raises:
            AutodiceError: one line naming the item: an unknown precision, a key the plan does
                not have, a key or a default given twice.
        """
        default, keys = None, {}
        known = {r.key for r in plan.ranks} if plan is not None else None
        for item in _items(str(text)):
            key, sep, value = item.rpartition("=")
            if value not in PRECISIONS:
                raise AutodiceError(f"--precision {text}: {item!r}: the precision is one of "
                                    f"{', '.join(PRECISIONS)}")
            if not sep:
                if default is not None:
                    raise AutodiceError(f"--precision {text}: two precisions for every key "
                                        f"({default}, {value})")
                default = value
            elif known is not None and key not in known:
                raise AutodiceError(f'--precision {text}: no key "{key}" in the mapping (keys: '
                                    f"{', '.join(sorted(known))})")
            elif key in keys:
                raise AutodiceError(f'--precision {text}: key "{key}" given twice')
            else:
                keys[key] = value
        return cls(default or "auto", tuple(keys.items()))

    @classmethod
    def of_output(cls, out_dir) -> Precision:
        """What ``gen`` was asked for in ``out_dir`` (``auto`` before gen, or before it kept it)."""
        from pathlib import Path

        try:
            return cls.parse((Path(out_dir) / "packages" / ".precision").read_text().strip())
        except (OSError, AutodiceError):
            return cls()

    def int8_keys(self, plan: Plan) -> frozenset[str]:
        return frozenset(r.key for r in self.int8_ranks(plan))

    def of(self, rank: Rank) -> str:
        """This rank's precision as asked (what it computes in: :meth:`computes`)."""
        return dict(self.keys).get(rank.key, self.default)

    def computes(self, rank: Rank) -> str:
        """This rank's precision as it computes: a GPU rank asked for int8 as ``auto`` (ncnn's
        Vulkan path has no int8 layers)."""
        p = self.of(rank)
        return "auto" if p == "int8" and rank.device == "gpu" else p

    def int8_ranks(self, plan: Plan) -> list[Rank]:
        """The ranks that compute in int8 (CPU ranks asked for it)."""
        return [r for r in plan.ranks if self.computes(r) == "int8"]

    def fp16_weights(self, rank: Rank) -> bool:
        """Whether pnnx writes this rank's weights in fp16 (asked for: the smallest model)."""
        return self.of(rank) == "fp16"

    def __str__(self) -> str:
        items = [self.default] if self.default != "auto" or not self.keys else []
        return ",".join(items + [f"{k}={v}" for k, v in self.keys])


def _items(text: str) -> list[str]:
    """``text``'s items: split at commas, but a key's own commas (``b_arm0-3,8-11``: cores in
    two runs) stay in it: a piece that is neither a precision nor ``KEY=...`` starts a key."""
    items, pending = [], ""
    for piece in (w.strip() for w in text.split(",")):
        if "=" not in piece and piece not in PRECISIONS:
            pending += piece + ","
            continue
        items.append(pending + piece)
        pending = ""
    return items + ([pending.rstrip(",")] if pending else [])


def rank_fp16(r: Rank, precision: Precision, kept_fp32: frozenset[int] | set[int] = frozenset()
              ) -> bool:
    """Whether a rank computes in fp16: GPU ranks do by default (ncnn's own default there, and
    what GPUs are fast at) unless they are ``kept_fp32`` (their values pass fp16's range:
    :mod:`.fp16_range`), CPU ranks compute in fp32 (equal to onnxruntime), int8 ones in int8 and
    fp32; ``fp32`` or ``fp16`` set the rank. A GPU rank asked for int8 computes as ``auto``."""
    p = precision.computes(r)
    return p == "fp16" or (p == "auto" and r.device == "gpu" and r.rank not in kept_fp32)
