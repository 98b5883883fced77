"""deploy, platform, cluster up|down|status: the verbs that reach the boards."""

from __future__ import annotations

from pathlib import Path

import click

from ..core.errors import AutodiceError
from ..core.plan import human_bytes
from ..deploy.emulated.state import DEFAULT as DEFAULT_CLUSTER
from .app import (INPUT_HELP, console, job_options, main, model_inputs, only_with, out, progress,
                  rate_line, report_run, stats_table, stream_options)
from .backend import is_a_stream, one_frame_labels, run_stream, show_top_k, task_for


@main.group()
def cluster():
    """An emulated edge cluster here: network namespaces on a bridge, each with its own sshd."""


_name_option = click.option(
    "--name", default=DEFAULT_CLUSTER, show_default=True,
    help="Which cluster: each name is a cluster of its own (its own namespaces, links, "
         "subnet and state), so two can be up at once.")


@cluster.command("up")
@click.option("--hosts", required=True, metavar="NAME,NAME,...",
              help="Host names (as in platform.txt), e.g. edge01,edge02,edge03.")
@click.option("--bandwidth", default="1gbit", show_default=True,
              help="Rate of each host's link, both ways (tbf), e.g. 100mbit; 'none': unshaped.")
@click.option("--cores", multiple=True, metavar="HOST=CPUS",
              help="Run a host (its sshd, all it starts) on CPUs, e.g. edge01=0-1 (repeatable).")
@click.option("--arch", "arches", multiple=True, metavar="HOST=MACHINE",
              help="Make a host an emulated board of another architecture, e.g. "
                   "edge02=aarch64 (qemu-user in the host's own user namespace; repeatable); "
                   "edge02=aarch64:bullseye runs Debian 11 (glibc 2.31, as JetPack 5).")
@click.option("--subnet", default=None,
              help="IPv4 subnet of the cluster; this machine gets its first address "
                   "[default: 10.77.0.0/24, a named cluster 10.77.N.0/24].")
@_name_option
@click.option("--replace", is_flag=True,
              help="Replace a cluster of this name that is up with other settings (by "
                   "default refused: it is someone's).")
@click.option("--ncnn-dir", type=click.Path(file_okay=False), default=None,
              help="ncnn install the hosts build against (default: one already built here).")
@click.option("--output", "-o", default="inventory.toml", show_default=True,
              type=click.Path(dir_okay=False), help="Where to write the inventory for deploy.")
def cluster_up(hosts, bandwidth, cores, arches, subnet, name, replace, ncnn_dir, output):
    """Create (or repair) the emulated cluster and write its inventory."""
    from ..deploy.emulated import cluster as emu

    pins, machines = {}, {}
    for option, specs, into, form in (("--cores", cores, pins, "HOST=CPUS, e.g. edge01=0-1"),
                                      ("--arch", arches, machines,
                                       "HOST=MACHINE[:RELEASE], e.g. edge02=aarch64")):
        for spec in specs:
            host, eq, value = spec.partition("=")
            if not eq:
                raise AutodiceError(f"{option} {spec}: expected {form}")
            into[host] = value
    with console.status("bringing the cluster up"):
        c = emu.up([h for h in hosts.split(",") if h], None if bandwidth == "none" else bandwidth,
                   pins, subnet, output, ncnn_dir, console, arch=machines, name=name,
                   replace=replace)
    _cluster_table(c)
    out.print(f"wrote {output}")


@cluster.command("down")
@_name_option
def cluster_down(name):
    """Remove every namespace, link, sshd and file of the emulated cluster (that one only)."""
    from ..deploy.emulated import cluster as emu

    removed = emu.down(name)
    out.print(f"removed {len(removed)} things" + (": " + ", ".join(removed) if removed else ""))


@cluster.command("status")
@_name_option
def cluster_status(name):
    """Show the emulated cluster's hosts, addresses and whether their sshd is alive."""
    from ..deploy.emulated import cluster as emu

    c, _ = emu.status(name)
    if c is None:
        flag = "" if name == DEFAULT_CLUSTER else f" --name {name}"
        out.print(f"no cluster {name} (run `autodice cluster up{flag} --hosts ...`)")
        return
    _cluster_table(c)


def _cluster_table(c) -> None:
    from rich.table import Table
    from rich.text import Text

    from ..deploy.emulated import cluster as emu

    _, rows = emu.status(c.name)
    rate = f"{int(c.bandwidth[:-3]) / 1e6:g} Mbit/s" if c.bandwidth else "unshaped"
    table = Table(title=f"cluster {c.name}: {c.subnet}, links {rate}, "
                        f"state in {c.state_dir}")
    for col in ("host", "address", "cores", "namespace", "sshd"):
        table.add_column(col)
    for s in rows:
        table.add_row(s.name, s.address, s.cores or "all",
                      "ok" if s.netns else Text("gone", style="red"),
                      f"pid {s.sshd_pid}" if s.sshd_pid else Text("down", style="red"))
    out.print(table)


@main.command()
@click.argument("output", type=click.Path(file_okay=False))
@click.option("--inventory", "-i", required=True, type=click.Path(dir_okay=False),
              help="inventory.toml: ssh destination and remote directory per host.")
@click.option("--run", "run_job", is_flag=True, help="Then run the job across the hosts.")
@click.option("--input", "inputs", multiple=True, metavar="[NAME=]SOURCE",
              help=INPUT_HELP + " For --run.")
@stream_options
@job_options
@click.option("--timeout", default=600.0, show_default=True,
              help="Seconds a job on one repeated frame may run.")
@click.option("--keep-connections", default=300.0, show_default=True, metavar="SECONDS",
              type=click.FloatRange(0, 86400),
              help="Keep each host's ssh connection open this long when idle, for the next "
                   "deploy (0: close them when done).")
@click.option("--recover", is_flag=True,
              help="A stream goes on when a host is lost: a mapping onto the hosts left is "
                   "deployed and the frames in flight are sent again.")
@click.option("--front", type=click.Path(file_okay=False, exists=True), default=None,
              help="With --recover: a `dse` output; its fastest point on the hosts left is "
                   "the new mapping (default: the mapping's keys there, balanced).")
def deploy(output, inventory, run_job, inputs, frames, preprocess, task, conf, iou, max_det,
           annotate, labels, top, fmt, window, metrics, no_pipeline, check, rtol, gpu_fallback,
           timeout, keep_connections, recover, front):
    """Copy OUTPUT's packages to the hosts over ssh, build there and (--run) run with mpirun."""
    import numpy as np
    from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

    from ..core.plan import load_plan
    from ..deploy.deploy import deploy as run_deploy
    from ..frontend.check import compare_with_model

    only_with("--run", run_job, "inputs", "frames", "preprocess", "task", "annotate", "labels",
              "top", "fmt", "window", "metrics", "no_pipeline", "check", "rtol", "gpu_fallback",
              "timeout", "recover")
    only_with("--recover", recover, "front")
    plan = load_plan(output)
    given = model_inputs(plan, inputs)
    streaming = run_job and is_a_stream(plan, given, no_pipeline)
    task = task_for(plan, given, task) if streaming else task
    only_with("--task detect", task == "detect", "conf", "iou", "max_det")
    only_with("--task detect or segment", task in ("detect", "segment"), "annotate")
    if recover and not streaming:
        raise AutodiceError("--recover and --front are for a stream: --run --input with a "
                            "folder of images, a batch .npy or -")
    if streaming:
        from ..deploy.stream import open_deployed

        def opener(status):
            return open_deployed(output, inventory, window, gpu_fallback == "cpu",
                                 lambda host, step: status(f"{host}: {step}"), keep_connections,
                                 recover=front or True)

        from ..backend.session.results import Reading

        reading = Reading.of(plan, task, labels, top, conf, iou, max_det, preprocess)
        return run_stream(output, plan, given, frames, None, preprocess, reading, fmt,
                          window, check, rtol, gpu_fallback, open_session=opener,
                          annotate=annotate, metrics=metrics)
    frames = 1 if frames is None else frames
    names = one_frame_labels(plan, given, preprocess, labels, task) if run_job else None
    with progress(SpinnerColumn(), TextColumn("{task.fields[host]:<12}"),
                  TextColumn("{task.description}"), TimeElapsedColumn()) as bar:
        tasks = {h: bar.add_task("waiting", host=h, total=None) for h in plan.hosts()}
        res = run_deploy(output, inventory, run=run_job, inputs=given if run_job else None,
                         frames=frames, pipeline=not no_pipeline, timeout_s=timeout,
                         progress=lambda h, step: bar.update(tasks[h], description=step),
                         gpu_fallback=gpu_fallback == "cpu",
                         keep_connections_s=keep_connections)
    _deploy_table(res.hosts, res.seconds)
    if res.run is not None:
        s = res.run.stats
        out.print(rate_line(s, f"; results in {res.run.results}"))
        stats_table(s)
        if check:
            feeds = {n: np.load(p) for n, p in given.items()}
            report_run(compare_with_model(plan, Path(output), feeds, res.run.outputs), rtol, s,
                       output)
        if names is not None:
            show_top_k(plan, given, res.run.outputs, names, top, fmt)


@main.command()
@click.option("--inventory", "-i", required=True, type=click.Path(dir_okay=False),
              help="inventory.toml: the hosts to ask, as deploy reaches them.")
@click.option("--output", "-o", default="platform.txt", show_default=True,
              type=click.Path(dir_okay=False), help="The platform file to write.")
def platform(inventory, output):
    """Write a platform file from what each host says of itself over ssh: architecture, the
    cores it lets us use and their kinds, memory, GPU, glibc (comments say where each came
    from). Each written line also goes to stdout."""
    from ..api import platform as write

    with console.status("asking the hosts"):
        text = write(inventory, output)
    for line in text.splitlines():
        if line and not line.startswith("#"):
            out.print(line, soft_wrap=True, highlight=False)
    console.print(f"wrote {output}", soft_wrap=True)


def _deploy_table(hosts, seconds) -> None:
    """Per host: its architecture, what was sent and where its program was built."""
    from rich.table import Table

    table = Table(title=f"deployed to {len(hosts)} hosts in {sum(seconds.values()):.1f} s "
                        f"({', '.join(f'{k} {v:.1f} s' for k, v in seconds.items())})")
    for col in ("host", "arch", "sent", "files moved", "program"):
        table.add_column(col, justify="right" if col == "sent" else "left")
    for r in hosts.values():
        table.add_row(r.host, r.arch, human_bytes(r.bytes_sent), str(len(r.files)),
                      "built here" if r.built else f"built on {r.built_by}")
    out.print(table)
