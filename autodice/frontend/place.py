"""Checking a mapping against the model and the platform, and placing every node on ranks.

All checks run before anything is written and report every offender at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.errors import SHOWN, Problems, did_you_mean
from ..core.mapping import Mapping, Resource
from ..core.model import Graph
from ..core.shapes import UNSUPPORTED_OPS
from ..core.spec import Platform, format_cores


@dataclass(frozen=True)
class Placement:
    """Ranks in mapping order, the cores each is bound to, and the ranks each node runs on.

    A mapped layer runs on exactly one rank; a follower (constant or shape arithmetic) runs on
    every rank that consumes it.
    """

    resources: tuple[Resource, ...]
    slots: tuple[tuple[int, ...], ...]
    node_ranks: tuple[tuple[int, ...], ...]


def check_resources(mapping: Mapping, platform: Platform) -> tuple[Resource, ...]:
    """Check every key (parsed with the mapping) against the platform.

    Raises:
        AutodiceError: malformed keys, unknown hosts, wrong arch, cores outside a host's slots,
            cores claimed twice, GPUs that do not exist.
    """
    problems = Problems()
    where = mapping.path
    resources: list[Resource] = []
    claimed: dict[tuple[str, int], str] = {}
    gpus: dict[tuple[str, int], str] = {}
    hosts = list(platform.devices)
    for key, _ in mapping.entries:
        if key in mapping.bad_keys:
            problems.add(f'{where}: key "{key}": {mapping.bad_keys[key]}',
                         f"{where}: and {{n}} more malformed keys")
            continue
        res = mapping.resources[key]
        dev = platform.devices.get(res.host)
        if dev is None:
            listing = ", ".join(hosts[:SHOWN]) + (", ..." if len(hosts) > SHOWN else "")
            problems.add(f'{where}: key "{key}": host "{res.host}" is not in {platform.path}'
                         f"{did_you_mean(res.host, hosts)} (hosts: {listing})",
                         f"{where}: and {{n}} more keys whose host is not in {platform.path}")
            continue
        if res.kind == "gpu":
            if dev.gpu is None:
                problems.add(f'{where}: key "{key}": host "{res.host}" has no GPU in '
                             f"{platform.path} (add gpu=MODEL (API) to its line)",
                             f"{where}: and {{n}} more keys for a GPU their host lacks")
            elif res.gpu_index != 0:
                problems.add(f'{where}: key "{key}": host "{res.host}" has one GPU, gpu0',
                             f"{where}: and {{n}} more keys for a GPU other than gpu0")
            elif (res.host, res.gpu_index) in gpus:
                problems.add(f'{where}: key "{key}": GPU {res.gpu_index} of "{res.host}" is '
                             f'already used by key "{gpus[(res.host, res.gpu_index)]}"',
                             f"{where}: and {{n}} more keys for a GPU another key uses")
            gpus[(res.host, res.gpu_index)] = key
        else:
            if res.family != "cpu" and dev.arch != "cpu" and res.family != dev.arch:
                problems.add(f'{where}: key "{key}": "{res.family}" cores on host "{res.host}", '
                             f"which is {dev.arch} in {platform.path}",
                             f"{where}: and {{n}} more keys of the wrong architecture")
            outside = [c for c in res.cores if dev.slots is not None and c not in dev.slots]
            if outside:
                problems.add(f'{where}: key "{key}": core{"s" if len(outside) > 1 else ""} '
                             f'{",".join(map(str, outside))} not in the slots of "{res.host}" '
                             f"({format_cores(dev.slots)})",
                             f"{where}: and {{n}} more keys with cores outside their host's slots")
            for c in res.cores:
                other = claimed.get((res.host, c))
                if other is not None:
                    problems.add(f'{where}: key "{key}": core {c} of "{res.host}" is already '
                                 f'claimed by key "{other}"',
                                 f"{where}: and {{n}} more cores claimed twice")
                claimed[(res.host, c)] = key
        resources.append(res)
    problems.raise_if_any()
    return tuple(resources)


def bind_slots(resources: tuple[Resource, ...], platform: Platform) -> tuple[tuple[int, ...], ...]:
    """Cores per rank: a CPU key's own; a GPU rank gets the lowest core of its host that no CPU key
    claims (the host's lowest core when all are claimed: a GPU rank mostly waits)."""
    claimed = {(r.host, c) for r in resources if r.kind == "cpu" for c in r.cores}
    slots = []
    for r in resources:
        if r.kind == "cpu":
            slots.append(r.cores)
            continue
        cores = platform.devices[r.host].slots
        if cores is None:  # a bare host line: any core the keys leave free
            cores = tuple(range(1 + max((c for h, c in claimed if h == r.host), default=-1)))
        free = [c for c in sorted(cores) if (r.host, c) not in claimed]
        slots.append((free[0] if free else min(cores),))
    return tuple(slots)


def assign_ranks(graph: Graph, mapping: Mapping, resources: tuple[Resource, ...],
                 platform: Platform) -> Placement:
    """Place every node, checking the layer lists.

    Raises:
        AutodiceError: unknown layers (with did-you-mean), layers listed twice or under two keys,
            mapped layers left out, ops the ncnn tool chain cannot convert.
    """
    problems = Problems()
    where = mapping.path
    explicit: dict[int, int] = {}
    first_key: dict[int, str] = {}
    unknown: list[tuple[str, str]] = []
    for rank, (key, layers) in enumerate(mapping.entries):
        seen_here: set[int] = set()
        for layer in layers:
            found = graph.resolve(layer)
            if len(found) > 1:
                listing = ", ".join(f'"{graph.names[i]}"' for i in found)
                problems.add(f'{where}: key "{key}": layer "{layer}" is ambiguous: it names the '
                             f"first output of {listing}; use one of those names",
                             f"{where}: and {{n}} more ambiguous layer names")
                continue
            if not found:
                unknown.append((key, layer))
                continue
            (i,) = found
            if i in seen_here:
                problems.add(f'{where}: key "{key}": layer "{layer}" is listed twice',
                             f"{where}: and {{n}} more layers listed twice under one key")
                continue
            seen_here.add(i)
            if i in explicit:
                problems.add(f'{where}: layer "{layer}" is mapped to both "{first_key[i]}" and '
                             f'"{key}"; splitting one layer across ranks (horizontal '
                             f"partitioning) is not supported yet",
                             f"{where}: and {{n}} more layers mapped to two keys")
                continue
            explicit[i] = rank
            first_key[i] = key
            op = graph.nodes[i].op_type
            if op in UNSUPPORTED_OPS:
                problems.add(f'{where}: key "{key}" (rank {rank}): layer "{layer}" is a {op}, '
                             f"which ncnn/pnnx cannot convert",
                             f"{where}: and {{n}} more layers ncnn/pnnx cannot convert")
    # Did-you-mean costs a string comparison with every layer: the first few offenders get it,
    # the rest a count (a mapping for another model can name hundreds).
    spellings = [*graph.names, *(n.output[0] for n in graph.nodes if n.output)]
    for key, layer in unknown[:SHOWN]:
        problems.add(f'{where}: key "{key}": layer "{layer}" is not in {graph.path}'
                     f"{did_you_mean(layer, spellings)} (`autodice layers` lists them)")
    if len(unknown) > SHOWN:
        problems.add(f"{where}: and {len(unknown) - SHOWN} more layers not in {graph.path} "
                     f"({len(unknown)} in all)")
    if unknown:  # every layer would be reported missing too: say it once, above
        problems.raise_if_any()
    missing = [graph.names[i] for i in range(len(graph.nodes))
               if i not in explicit and i not in graph.followers]
    if missing:
        shown = ", ".join(f'"{m}"' for m in missing[:SHOWN])
        more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
        problems.add(f"{where}: {len(missing)} layer{'s are' if len(missing) > 1 else ' is'} "
                     f"not mapped to any key: {shown}{more}")
    problems.raise_if_any()

    # Followers go where their consumers are; walk backwards so chains of followers resolve.
    node_ranks: list[tuple[int, ...]] = [()] * len(graph.nodes)
    for i in range(len(graph.nodes) - 1, -1, -1):
        if i not in graph.followers:
            node_ranks[i] = (explicit[i],)
            continue
        ranks = {explicit[i]} if i in explicit else set()
        for t in graph.nodes[i].output:
            for c in graph.consumers.get(t, ()):
                ranks.update(node_ranks[c])
        node_ranks[i] = tuple(sorted(ranks)) or (0,)
    return Placement(resources, bind_slots(resources, platform), tuple(node_ranks))


def mixed_kinds(keys: dict[str, tuple[str, tuple[int, ...]]], platform: Platform) -> list[str]:
    """A note for each CPU key (key -> (host, cores)) that holds both big and little cores of a
    board whose platform line names them (``little=``): OpenMP waits on its slowest thread, so
    such a key runs at the little cores' pace. A note, not an error: the mapping asked for it."""
    notes = []
    for key, (host, cores) in keys.items():
        dev = platform.devices.get(host)
        if dev is not None and dev.mixes(cores):
            little = tuple(c for c in cores if c in dev.little)
            big = tuple(c for c in cores if c not in dev.little)
            notes.append(f"{key} holds big cores {format_cores(big)} and little cores "
                         f"{format_cores(little)} of {host}: OpenMP waits on the little ones; "
                         "a key on one kind runs at its own pace")
    return notes
