"""HDF5 run records: a tree of groups with attributes and datasets, written atomically."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from dfmp2.errors import InputError

SCHEMA = "dfmp2.run/1"
BENCH_SCHEMA = "dfmp2.bench/1"
INTERACTION_SCHEMA = "dfmp2.interaction/1"
KNOWN_SCHEMAS = (SCHEMA, BENCH_SCHEMA, INTERACTION_SCHEMA)


@dataclass
class Node:
    """One HDF5 group: attributes, datasets and child groups."""

    attrs: dict[str, Any] = field(default_factory=dict)
    datasets: dict[str, np.ndarray] = field(default_factory=dict)
    groups: dict[str, "Node"] = field(default_factory=dict)

    def group(self, name: str) -> "Node":
        """The child group ``name`` (``a/b`` for nested), created when missing."""
        node = self
        for part in name.strip("/").split("/"):
            node = node.groups.setdefault(part, Node())
        return node


def _attr_value(value: Any) -> Any:
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    if value is None:
        return "none"
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return value


def _write_node(group: h5py.Group, node: Node) -> None:
    for key, value in node.attrs.items():
        group.attrs[key] = _attr_value(value)
    for key, array in node.datasets.items():
        group.create_dataset(key, data=np.asarray(array))
    for key, child in node.groups.items():
        _write_node(group.create_group(key), child)


def write_record(path: str | Path, root: Node) -> Path:
    """Write the whole record to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        with h5py.File(tmp_name, "w") as h5:
            _write_node(h5, root)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return path


def _read_node(group: h5py.Group) -> Node:
    node = Node()
    for key, value in group.attrs.items():
        node.attrs[key] = value.decode() if isinstance(value, bytes) else (
            value.item() if isinstance(value, np.generic) else value)
    for key, item in group.items():
        if isinstance(item, h5py.Group):
            node.groups[key] = _read_node(item)
        else:
            node.datasets[key] = item[()]
    return node


def read_record(path: str | Path) -> Node:
    """Read a run record; anything that is not one is an InputError naming the file."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such record")
    try:
        with h5py.File(path, "r") as h5:
            root = _read_node(h5)
    except OSError:
        raise InputError(f"{path} is not a readable HDF5 run record") from None
    if root.attrs.get("schema") not in KNOWN_SCHEMAS:
        raise InputError(f"{path} is an HDF5 file but not a dfmp2 record "
                         f"(schema {root.attrs.get('schema')!r}, expected {SCHEMA!r})")
    return root


def is_record_file(path: str | Path) -> bool:
    try:
        read_record(path)
    except InputError:
        return False
    return True
