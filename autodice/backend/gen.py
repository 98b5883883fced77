"""``autodice gen``: the plan -> one SPMD C++ program and a package per host.

The program comes from one Jinja template (``templates/program.cpp.j2``); this module only turns
the plan into the names and numbers the template prints, so the C++ stays readable in one place.
Output is byte-stable: no timestamps, fixed order; ``tests/golden/`` holds Figure 2's program.

``OUT/packages/<host>/`` holds everything a board needs: the program, its CMakeLists.txt, the
runtime library's sources, the rankfile and hostfile, that host's ncnn models and ``run.sh``.
"""

from __future__ import annotations

import re
import shutil
from importlib import resources
from pathlib import Path

import jinja2

from ..core.outdir import file_name, staged
from ..core.plan import Plan, Rank, load_plan
from ..frontend.tables import hostfile, rankfile
from .convert import convert_all

DTYPE_ENUM = {"float32": "Float32", "int64": "Int64"}


def _var(tensor: str, taken: dict[str, str]) -> str:
    base = "t_" + re.sub(r"\W", "_", tensor)
    name, k = base, 1
    while name in taken.values() and taken.get(tensor) != name:
        k += 1
        name = f"{base}_{k}"
    taken[tensor] = name
    return name


def _shape(shape) -> str:
    return "x".join(map(str, shape))


def rank_context(plan: Plan, r: Rank) -> dict:
    """What the template needs for one rank, every index resolved."""
    names: dict[str, str] = {}
    in_pos = {t.name: k for k, t in enumerate(r.submodel_inputs)}
    out_pos = {t.name: k for k, t in enumerate(r.submodel_outputs)}
    specs = {t.name: t for t in (*r.submodel_inputs, *r.submodel_outputs)}
    tensors = [{"name": t.name, "var": _var(t.name, names), "shape": list(t.shape),
                "dtype_enum": DTYPE_ENUM.get(t.dtype, "Float32")} for t in specs.values()]
    recv = [{"tensor": e.tensor, "var": names[e.tensor], "src": e.src, "tag": e.tag,
             "shape_str": _shape(e.shape), "dtype": e.dtype, "nbytes": e.nbytes,
             "position": in_pos[e.tensor]} for e in r.recv]
    recv_index = {e.tensor: k for k, e in enumerate(r.recv)}
    sends_of: dict[str, list[dict]] = {}
    for e in r.send:
        sends_of.setdefault(e.tensor, []).extend({"peer": d, "tag": e.tag} for d in e.dst)
    steps = []
    for s in r.steps:
        steps.append({
            "wait_names": list(s.wait),
            "wait": [{"index": recv_index[t], "position": in_pos[t]} for t in s.wait],
            "extract": [{"name": t, "var": names[t], "position": out_pos[t], "index": out_pos[t],
                         "sends": sends_of.get(t, [])} for t in s.extract],
        })
    layers = list(r.layers)
    summary = ", ".join(layers) if len(layers) <= 4 else f"{layers[0]} ... {layers[-1]}"
    return {
        "rank": r.rank, "key": r.key, "host": r.host, "device": r.device, "threads": r.threads,
        "slots": list(r.slots), "layers": layers, "layer_summary": summary, "tensors": tensors,
        "recv": recv, "send": [{"tensor": e.tensor, "dst": list(e.dst), "nbytes": e.nbytes,
                                "shape_str": _shape(e.shape), "dtype": e.dtype} for e in r.send],
        "inputs": [{"var": names[t], "position": in_pos[t], "file": file_name(t),
                    "forward": sends_of.get(t, [])} for t in r.inputs],
        "outputs_all": list(r.submodel_outputs), "steps": steps,
        "model_outputs": [{"var": names[t], "index": out_pos[t], "file": file_name(t)}
                          for t in r.outputs],
        "bytes_sent": r.memory.send_bytes, "bytes_received": r.memory.recv_bytes,
    }


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("autodice.templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=False,
        lstrip_blocks=False)


def render_program(plan: Plan, fp16: bool = False) -> str:
    """The generated C++ source for ``plan``."""
    ctx = {"model": Path(plan.model).name, "ranks": [rank_context(plan, r) for r in plan.ranks],
           "edges": plan.edges, "fp16": fp16}
    return _env().get_template("program.cpp.j2").render(ctx)


def render_cmake() -> str:
    return _env().get_template("CMakeLists.txt.j2").render({})


def render_run_script(plan: Plan) -> str:
    return _env().get_template("run.sh.j2").render({"ranks": len(plan.ranks)})


def gen(out_dir: str | Path, fp16: bool = False, progress=None) -> Plan:
    """Convert the sub-models and write ``out_dir/packages/<host>/`` for every host.

    Raises:
        AutodiceError: no plan, or a sub-model pnnx cannot convert (names rank and layers).
    """
    out_dir = Path(out_dir)
    plan = load_plan(out_dir)
    ncnn_dir = out_dir / "ncnn"
    convert_all(plan, out_dir, ncnn_dir, fp16, progress)
    program = render_program(plan, fp16)
    runtime = resources.files("autodice.runtime_cpp")
    with staged(out_dir / "packages", owned=True) as tmp:
        for host in plan.hosts():
            pkg = tmp / host
            (pkg / "runtime").mkdir(parents=True)
            (pkg / "program.cpp").write_text(program)
            (pkg / "CMakeLists.txt").write_text(render_cmake())
            (pkg / "rankfile").write_text(rankfile(plan))
            (pkg / "hostfile").write_text(hostfile(plan))
            run = pkg / "run.sh"
            run.write_text(render_run_script(plan))
            run.chmod(0o755)
            for name in ("autodice_runtime.h", "autodice_runtime.cpp"):
                (pkg / "runtime" / name).write_text(runtime.joinpath(name).read_text())
            (pkg / "models").mkdir()
            for r in plan.ranks:
                if r.host == host:
                    for suffix in ("param", "bin"):
                        src = ncnn_dir / f"{r.key}.ncnn.{suffix}"
                        shutil.copyfile(src, pkg / "models" / src.name)
    return plan
