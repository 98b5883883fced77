"""Helpers for the tests that run on the emulated cluster (test_cluster, test_links)."""

from pathlib import Path

from autodice.backend.engine import ensure_ncnn
from autodice.deploy.emulated.state import inventory_toml


def write_inventory(c, folder: Path, hosts: list[str]) -> Path:
    """``folder/inventory.toml`` for ``hosts`` of cluster ``c``, on the lean ncnn built here (the
    hosts share this machine's filesystem, so none of them builds ncnn)."""
    path = folder / "inventory.toml"
    path.write_text(inventory_toml(c, hosts, ncnn_dir=ensure_ncnn()))
    return path
