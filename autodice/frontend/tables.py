"""The text files around the sub-models: rankfile, hostfile, sender/receiver tables, plan.json.

sender.json / receiver.json follow the AutoDiCE paper exactly: every rank as a string key, then
tensor name -> peer ranks as strings, in production order. A peer stage with copies (data
parallelism) lists all of them: frame f goes to, or comes from, the one whose turn it is.
"""

from __future__ import annotations

from pathlib import Path

from ..core.plan import Plan, dumps, plan_to_json


def rankfile(plan: Plan) -> str:
    return "".join(f"rank {r.rank}={r.host} slots={','.join(map(str, r.slots))}\n"
                   for r in plan.ranks)


def hostfile(plan: Plan) -> str:
    counts: dict[str, int] = {}
    for r in plan.ranks:
        counts[r.host] = counts.get(r.host, 0) + 1
    return "".join(f"{host} slots={n}\n" for host, n in counts.items())


def sender_table(plan: Plan) -> dict:
    return {str(r.rank): {e.tensor: [str(q) for d in e.dst for q in plan.ranks[d].turns()]
                          for e in r.send} for r in plan.ranks}


def receiver_table(plan: Plan) -> dict:
    return {str(r.rank): {e.tensor: [str(q) for q in plan.ranks[e.src].turns()]
                          for e in r.recv} for r in plan.ranks}


def write_tables(plan: Plan, out_dir: Path) -> None:
    files = {
        "rankfile": rankfile(plan),
        "hostfile": hostfile(plan),
        "sender.json": dumps(sender_table(plan)),
        "receiver.json": dumps(receiver_table(plan)),
        "plan.json": dumps(plan_to_json(plan)),
    }
    for name, text in files.items():
        (out_dir / name).write_text(text)
