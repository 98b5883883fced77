"""Checking ``plan.json`` as it is read back: a file in the user's folder is input like any other.

``split`` writes the plan, but anyone may edit it before ``gen``, ``build``, ``run``, ``check``,
``view`` or ``deploy`` read it, and those verbs turn it into C++ tables, file paths, rankfiles
and ssh command lines. So every field is checked for its type and range, sub-model paths must
stay inside the output, host names follow platform.txt's rule, keys must parse, and ranks and
edges must agree, before a :class:`~autodice.core.plan.Plan` is built from it.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

import numpy as np

from .errors import Problems
from .mapping import parse_key
from .spec import HOST_NAME, MAX_CORE

MAX_ELEMENTS = 2**31  # as core.onnxio: the most elements one tensor may have
MAX_THREADS = MAX_CORE + 1
_MISSING = object()


def check_plan_json(data, where: str) -> list[str]:
    """Every problem of the plan document ``data`` (read from ``where``), one line each."""
    p = Problems()
    if not isinstance(data, dict):
        return [f"{where}: expected an object (the plan `autodice split` writes)"]
    c = _Checker(where, p)
    c.text(data, "model", "", path=True)
    for key in ("model_inputs", "model_outputs"):
        for i, t in c.items(data, key, ""):
            c.tensor(t, f"{key}[{i}]")
    tags: dict[int, dict] = {}
    for i, e in c.items(data, "edges", ""):
        at = f"edges[{i}]"
        c.text(e, "tensor", at)
        c.whole(e, "from", at, 0, None)
        c.wholes(e, "to", at, 0, None)
        c.shape(e, "shape", at)
        c.dtype(e, "dtype", at)
        c.whole(e, "bytes", at, 0, None)
        tag = c.whole(e, "tag", at, 0, 2**31 - 1)
        kind = c.field(e, "kind", at)
        if kind is not _MISSING and kind not in ("activation", "input"):
            p.add(f'{where}: {at}.kind {_show(kind)} is not "activation" or "input"')
        if isinstance(tag, int):
            if tag in tags:
                p.add(f"{where}: {at}: tag {tag} is used by another edge too")
            tags[tag] = e
    if tags and sorted(tags) != list(range(len(tags))):
        p.add(f"{where}: edges: tags must be 0 to {len(tags) - 1}, one per edge (the program "
              "numbers its MPI tags from them)")
    derived = data.get("derived", {})
    if not isinstance(derived, dict) or not all(
            isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and v[0]
            and isinstance(v[1], (int, float)) and not isinstance(v[1], bool) and 0 <= v[1] <= 1
            for v in derived.values()):
        c._bad("", "derived", 'an object of "part": ["layer it computes part of", share]',
               derived)
    ranks = c.items(data, "ranks", "")
    if data.get("ranks") == []:
        p.add(f"{where}: ranks: expected a non-empty list of ranks")
    keys: set[str] = set()
    for i, r in ranks:
        c.rank(r, i, tags, keys)
    return p.lines()


def _show(value) -> str:
    text = f'"{value}"' if isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class _Checker:
    """Field readers that add one problem per bad field, named by its path in the document."""

    def __init__(self, where: str, problems: Problems):
        self.where, self.p = where, problems

    def field(self, obj: dict, key: str, at: str):
        if key not in obj:
            self.p.add(f'{self.where}: {at or "the plan"}: "{key}" is missing')
            return _MISSING
        return obj[key]

    def _bad(self, at: str, key: str, want: str, value) -> None:
        self.p.add(f"{self.where}: {at + '.' if at else ''}{key}: expected {want}, got "
                   f"{_show(value)}")

    def items(self, obj: dict, key: str, at: str) -> list[tuple[int, dict]]:
        value = self.field(obj, key, at)
        if value is _MISSING:
            return []
        if not isinstance(value, list) or not all(isinstance(x, dict) for x in value):
            self._bad(at, key, "a list of objects", value)
            return []
        return list(enumerate(value))

    def text(self, obj: dict, key: str, at: str, path: bool = False):
        """A non-empty string; a ``path`` also without NUL (names are data: any byte goes)."""
        value = self.field(obj, key, at)
        if value is not _MISSING and (not isinstance(value, str) or not value
                                      or (path and "\0" in value)):
            self._bad(at, key, "a non-empty path" if path else "a non-empty string", value)
            return _MISSING
        return value

    def texts(self, obj: dict, key: str, at: str) -> list[str]:
        value = self.field(obj, key, at)
        if value is _MISSING:
            return []
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            self._bad(at, key, "a list of names", value)
            return []
        return value

    def whole(self, obj: dict, key: str, at: str, lo: int, hi: int | None):
        value = self.field(obj, key, at)
        if value is _MISSING:
            return value
        if (not isinstance(value, int) or isinstance(value, bool) or value < lo
                or (hi is not None and value > hi)):
            self._bad(at, key, f"a whole number from {lo}" + (f" to {hi}" if hi else " up"),
                      value)
            return _MISSING
        return value

    def wholes(self, obj: dict, key: str, at: str, lo: int, hi: int | None) -> list[int]:
        value = self.field(obj, key, at)
        if value is _MISSING:
            return []
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= lo
                and (hi is None or v <= hi) for v in value):
            self._bad(at, key, f"a list of whole numbers from {lo}" + (f" to {hi}" if hi else
                                                                        " up"), value)
            return []
        return value

    def shape(self, obj: dict, key: str, at: str) -> list:
        dims = self.wholes(obj, key, at, 0, MAX_ELEMENTS)
        count = 1
        for d in dims:
            count *= d
        if count > MAX_ELEMENTS:
            self._bad(at, key, "a shape of at most 2^31 elements", dims)
        return dims

    def dtype(self, obj: dict, key: str, at: str) -> None:
        value = self.field(obj, key, at)
        if value is _MISSING:
            return
        try:
            ok = isinstance(value, str) and np.dtype(value).kind in "biuf"
        except TypeError:
            ok = False
        if not ok:
            self.p.add(f"{self.where}: {at}.{key} {_show(value)} is not a numeric dtype such as "
                       "float32 or int64")

    def tensor(self, t: dict, at: str) -> None:
        self.text(t, "name", at)
        shape = self.shape(t, "shape", at)
        self.dtype(t, "dtype", at)
        self.whole(t, "bytes", at, 0, None)
        if isinstance(t, dict) and "model_shape" in t:
            model_shape = self.shape(t, "model_shape", at)
            if shape and model_shape and math.prod(shape) != math.prod(model_shape):
                self.p.add(f"{self.where}: {at}.model_shape {_show(model_shape)} holds another "
                           f"number of elements than its shape {_show(shape)}")

    def rank(self, r: dict, i: int, tags: dict[int, dict], keys: set[str]) -> None:
        at, where, p = f"ranks[{i}]", self.where, self.p
        number = self.whole(r, "rank", at, 0, None)
        if isinstance(number, int) and number != i:
            p.add(f"{where}: {at}.rank is {number}, expected {i} (ranks are numbered in order "
                  "from 0)")
        key, host = self.text(r, "key", at), self.text(r, "host", at)
        if isinstance(host, str) and not HOST_NAME.fullmatch(host):
            p.add(f"{where}: {at}.host {_show(host)} must be letters, digits, \"_\", \".\" or "
                  "\"-\" (as in platform.txt)")
        device = self.field(r, "device", at)
        if device is not _MISSING and device not in ("cpu", "gpu"):
            p.add(f'{where}: {at}.device {_show(device)} is not "cpu" or "gpu"')
        if isinstance(key, str):
            try:
                res = parse_key(key)
            except ValueError as e:
                p.add(f"{where}: {at}.key {_show(key)}: {e}")
            else:
                if key in keys:
                    p.add(f"{where}: {at}.key {_show(key)} is the key of another rank too")
                keys.add(key)
                if isinstance(host, str) and res.host != host:
                    p.add(f"{where}: {at}: key {_show(key)} is not on host {_show(host)}")
                if device in ("cpu", "gpu") and res.kind != device:
                    p.add(f"{where}: {at}: key {_show(key)} is not a {device} key")
        self.whole(r, "gpu_index", at, 0, 63)
        self.wholes(r, "slots", at, 0, MAX_CORE)
        self.whole(r, "threads", at, 1, MAX_THREADS)
        if "replicas" in r:
            self.wholes(r, "replicas", at, 0, None)
        sub = self.text(r, "submodel", at, path=True)
        if isinstance(sub, str):
            path = PurePosixPath(sub)
            if (path.is_absolute() or ".." in path.parts or "\\" in sub
                    or path.suffix != ".onnx"):
                p.add(f"{where}: {at}.submodel {_show(sub)} is not a path inside the output "
                      "(such as models/KEY.onnx)")
        for key_ in ("layers", "followers", "inputs", "outputs"):
            self.texts(r, key_, at)
        for direction, peer in (("recv", "from"), ("send", "to")):
            for j, x in self.items(r, direction, at):
                here = f"{at}.{direction}[{j}]"
                tag = self.whole(x, "tag", here, 0, 2**31 - 1)
                if isinstance(tag, int) and tag not in tags:
                    p.add(f"{where}: {here}: tag {tag} is not the tag of any edge")
                elif isinstance(tag, int):
                    edge = tags[tag]
                    if x.get("tensor") != edge.get("tensor") or x.get(peer) != edge.get(
                            "from" if peer == "from" else "to"):
                        p.add(f"{where}: {here}: tensor and {peer} differ from edge tag {tag}'s")
        for key_ in ("submodel_inputs", "submodel_outputs"):
            for j, t in self.items(r, key_, at):
                self.tensor(t, f"{at}.{key_}[{j}]")
        for j, s in self.items(r, "steps", at):
            self.texts(s, "wait", f"{at}.steps[{j}]")
            self.texts(s, "extract", f"{at}.steps[{j}]")
        memory = self.field(r, "memory", at)
        if memory is not _MISSING:
            if not isinstance(memory, dict) or set(memory) != {
                    "params", "peak_activations", "recv_bytes", "send_bytes"}:
                self._bad(at, "memory", "params, peak_activations, recv_bytes and send_bytes",
                          memory)
            else:
                for k in memory:
                    self.whole(memory, k, f"{at}.memory", 0, None)
