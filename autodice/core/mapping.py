"""``mapping.json`` (who runs what) and its keys.

mapping.json: ``{"edge01_arm123": ["conv1", ...], "edge01_gpu": [...]}``; key order is rank order.
A key is ``<host>_<resource>`` split at the *last* underscore (host names may contain ``_``).
The resource is ``cpu|arm|x86`` plus cores — one digit per core as in the AutoDiCE paper
(``arm123``), or ranges and lists (``cpu0-11``, ``cpu1,3,5``) — or ``gpu`` / ``gpuN``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import AutodiceError, Problems, did_you_mean, parse_nested, read_text
from .spec import parse_cores


@dataclass(frozen=True)
class Resource:
    """A mapping key, parsed: the host and what of it a rank uses."""

    key: str
    host: str
    kind: str  # "cpu" or "gpu"
    family: str  # "cpu" | "arm" | "x86" | "gpu"
    cores: tuple[int, ...] = ()  # CPU keys
    gpu_index: int = 0  # GPU keys


def parse_key(key: str) -> Resource:
    """``"edge01_arm123"`` -> Resource(host="edge01", kind="cpu", cores=(1, 2, 3)).

    Raises:
        ValueError: the key is malformed (the message says how).
    """
    host, sep, res = key.rpartition("_")
    if not sep or not host:
        raise ValueError("expected <host>_<resource> such as edge01_arm123 or edge01_gpu")
    m = re.fullmatch(r"gpu([0-9]*)", res)
    if m:
        if len(m.group(1)) > 3:
            raise ValueError(f'"{res}": no host has that many GPUs')
        return Resource(key, host, "gpu", "gpu", gpu_index=int(m.group(1) or 0))
    m = re.fullmatch(r"(cpu|arm|x86)([0-9,;-]+)", res)
    if not m:
        raise ValueError(f'resource "{res}" is not cpu|arm|x86 followed by cores, or gpu[N]')
    family, spec = m.groups()
    if "-" in spec or "," in spec or ";" in spec:
        cores = parse_cores(spec)
    else:
        cores = tuple(int(c) for c in spec)
        if len(set(cores)) != len(cores):
            raise ValueError(f'"{spec}" names a core twice (one digit per core; use '
                             f"ranges such as cpu0-11 for more than 10 cores)")
    return Resource(key, host, "cpu", family, cores=cores)


def cpu_key(host: str, family: str, cores: tuple[int, ...]) -> str:
    """The key :func:`parse_key` reads as ``cores`` of ``host``: the paper's one digit per core
    when possible, else ranges."""
    if all(c < 10 for c in cores):
        key = f"{host}_{family}{''.join(map(str, cores))}"
    else:
        parts, start = [], None
        for k, c in enumerate(cores):
            start = c if start is None else start
            if k + 1 == len(cores) or cores[k + 1] != c + 1:
                parts.append(f"{start}-{c}")
                start = None
        key = f"{host}_{family}{','.join(parts)}"
    return key


@dataclass(frozen=True)
class Mapping:
    """mapping.json, parsed.

    A layer under one key runs there (vertical partitioning, the paper's). A layer under several
    keys is split among them (horizontal): each item may say how, ``{"layer": "fc6", "split":
    "channels", "share": 0.6}`` (``split``: ``channels`` or ``rows``, by default what the layer's
    type suits; ``share``: this key's part of the work, by default equal). A key whose value is
    ``{"replicates": "edge02_arm0"}`` runs a copy of that key's layers, and the two take turns
    frame by frame (data parallelism).
    """

    path: str
    entries: tuple[tuple[str, tuple[str, ...]], ...]  # (key, layers) in rank order
    # (key, layer) -> (split kind or "", share or None), for items given as objects
    split_items: dict[tuple[str, str], tuple[str, float | None]] = field(default_factory=dict)
    replicas: dict[str, str] = field(default_factory=dict)  # replica key -> the key it copies
    # Each key parsed once, here: the keys that parse, and why the others do not (reported
    # with what the platform says of the rest, by frontend/place.py).
    resources: dict[str, Resource] = field(default_factory=dict)
    bad_keys: dict[str, str] = field(default_factory=dict)

    def hosts(self) -> list[str]:
        """The hosts of the keys that parse, each once, in rank order."""
        return list(dict.fromkeys(r.host for r in self.resources.values()))


def parse_keys(keys, where: str) -> list[Resource]:
    """Mapping keys given one by one (``layers --balance KEY ...``, the API), parsed.

    Raises:
        AutodiceError: every key that does not parse, named, and keys given twice.
    """
    problems = Problems()
    found = []
    for key in keys:
        try:
            if not isinstance(key, str):
                raise ValueError("not a string")
            found.append(parse_key(key))
        except ValueError as e:
            problems.add(f'{where}: key "{key}": {e}', f"{where}: and {{n}} more malformed keys")
    seen = [r.key for r in found]
    for key in dict.fromkeys(k for k in seen if seen.count(k) > 1):
        problems.add(f'{where}: key "{key}" is given {seen.count(key)} times')
    problems.raise_if_any()
    return found


def parse_mapping(path: str | Path) -> Mapping:
    """Read mapping.json, keeping key order (= rank order).

    Raises:
        AutodiceError: unreadable, not JSON, duplicate keys, or not {key: [layer, ...]}.
    """
    return parse_mapping_text(read_text(path), str(path))


class _Pairs(list):
    """A JSON object as its (key, value) pairs: keeps order and shows repeated keys."""


def parse_mapping_text(text: str, path: str = "mapping.json") -> Mapping:
    problems = Problems()

    def pairs(items):
        seen = set()
        for k, _ in items:
            if k in seen:
                problems.add(f'{path}: key "{k}" appears twice',
                             f"{path}: and {{n}} more keys that appear twice")
            seen.add(k)
        return _Pairs(items)

    try:
        data = parse_nested(lambda t: json.loads(t, object_pairs_hook=pairs), text, path)
    except json.JSONDecodeError as e:
        raise AutodiceError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} "
                            f"column {e.colno}") from None
    problems.raise_if_any()
    return _mapping_of(data, path, problems)


def mapping_from(entries: dict, path: str = "mapping") -> Mapping:
    """A mapping given as data (``{key: [layer, ...]}``, as the API and the search make them),
    checked as mapping.json is, without a round trip through JSON text."""
    def pairs(value):
        if isinstance(value, dict):
            return _Pairs((k, pairs(v)) for k, v in value.items())
        return [pairs(v) for v in value] if isinstance(value, (list, tuple)) else value

    problems = Problems()
    for key in entries if isinstance(entries, dict) else ():
        if not isinstance(key, str):
            problems.add(f"{path}: key {key!r} is not a string")
    problems.raise_if_any()
    return _mapping_of(pairs(entries), path, problems)


def _mapping_of(data, path: str, problems: Problems) -> Mapping:
    """The checks of mapping.json on its parsed text (objects as :class:`_Pairs`)."""
    if not isinstance(data, _Pairs) or not data:
        raise AutodiceError(f'{path}: expected a non-empty object {{"host_resource": '
                            f'["layer", ...], ...}}')
    entries = []
    split_items: dict[tuple[str, str], tuple[str, float | None]] = {}
    replicas: dict[str, str] = {}
    for key, layers in data:
        if isinstance(layers, _Pairs) and [k for k, _ in layers] == ["replicates"]:
            target = layers[0][1]
            if not isinstance(target, str):
                problems.add(f'{path}: key "{key}": "replicates" names another key')
            else:
                replicas[key] = target
                entries.append((key, ()))
            continue
        if not isinstance(layers, list):
            problems.add(f'{path}: key "{key}": expected a list of layer names (or '
                         '{"replicates": "KEY"})',
                         f"{path}: and {{n}} more keys that are not lists of layer names")
            continue
        if not layers:  # a rank with nothing to run would only wait for its peers
            problems.add(f'{path}: key "{key}": lists no layers; give it some or leave it out',
                         f"{path}: and {{n}} more keys that list no layers")
            continue
        names = []
        for item in layers:
            if isinstance(item, str):
                names.append(item)
                continue
            item = dict(item) if isinstance(item, _Pairs) else item
            if not isinstance(item, dict) or not isinstance(item.get("layer"), str) or \
                    set(item) - {"layer", "split", "share"}:
                problems.add(f'{path}: key "{key}": {json.dumps(item)[:60]} is neither a layer '
                             'name nor {"layer": NAME, "split": "channels"|"rows", "share": F}')
                continue
            kind, share = item.get("split", ""), item.get("share")
            if kind not in ("", "channels", "rows"):
                problems.add(f'{path}: key "{key}": layer "{item["layer"]}": split "{kind}" is '
                             'not "channels" or "rows"')
                continue
            if share is not None and (not isinstance(share, (int, float)) or
                                      isinstance(share, bool) or not 0 < share < math.inf):
                problems.add(f'{path}: key "{key}": layer "{item["layer"]}": share {share!r} '
                             "must be a positive finite number")
                continue
            names.append(item["layer"])
            split_items[key, item["layer"]] = (kind, None if share is None else float(share))
        entries.append((key, tuple(names)))
    keys = [k for k, _ in entries]
    for key, target in replicas.items():
        if target not in keys or target in replicas:
            problems.add(f'{path}: key "{key}": replicates "{target}", which is not a key with '
                         f"layers{did_you_mean(target, [k for k in keys if k not in replicas])}")
    problems.raise_if_any()
    resources: dict[str, Resource] = {}
    bad_keys: dict[str, str] = {}
    for key in keys:
        try:
            resources[key] = parse_key(key)
        except ValueError as e:
            bad_keys[key] = str(e)
    return Mapping(path, tuple(entries), split_items, replicas, resources, bad_keys)


def mapping_json(entries: dict[str, list[str]]) -> str:
    """The text of a mapping file, byte-stable for a given mapping."""
    return json.dumps(entries, indent=2) + "\n"
