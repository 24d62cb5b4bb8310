"""The HDF5 tree engine of run records: the one place that reads and writes HDF5.

A record is a tree of :class:`Node` (attributes, datasets, child groups) written whole and
atomically: a temporary file beside the target, then a rename. The groups and attributes of
each command are the typed sections of :mod:`dfmp2.records.sections` (a calculation) and
:mod:`dfmp2.records.job_sections` (optimisations, interactions, benchmarks); no other module
spells a group or attribute name.

Root attributes: ``schema``, ``status``, ``created``, ``command`` (``error`` when failed,
``resumed``).
"""
from __future__ import annotations

import datetime as dt
import glob
import io
import json
import contextlib
import os
import re
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from dfmp2.errors import Dfmp2Error, InputError, RunFailure
from dfmp2.records import isolated
from dfmp2.records.isolated import ChildFailed, ChildMissedDeadline, in_child
from dfmp2.system.files import FILE, disk_reason, existing_kind, printable, shown
from dfmp2.system.interrupts import written_whole

SCHEMA = "dfmp2.run/1"


BENCH_SCHEMA = "dfmp2.bench/1"


INTERACTION_SCHEMA = "dfmp2.interaction/1"


OPTIMIZE_SCHEMA = "dfmp2.optimize/1"


FREQUENCIES_SCHEMA = "dfmp2.frequencies/1"


KNOWN_SCHEMAS = (SCHEMA, BENCH_SCHEMA, INTERACTION_SCHEMA, OPTIMIZE_SCHEMA, FREQUENCIES_SCHEMA)
# The kinds of record (a schema less its version): another version of one is dfmp2's own.
KNOWN_KINDS = {schema.partition("/")[0] for schema in KNOWN_SCHEMAS}
# Why a record holds values of a kind dfmp2 does not write.
FOREIGN_RECORD = "it was not written by this version of dfmp2, or was altered"
# A read slower than this (a stalled network file system) gets more than the minute.
SLOW_DISK_BYTES_PER_SECOND = 10 * 2**20


RUNNING, COMPLETE, FAILED, INTERRUPTED = "running", "complete", "failed", "interrupted"


class RecordWriteError(RunFailure):
    """The record (or its temporary file) could not be written: a full disk, a quota, a
    vanished folder."""


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
    if isinstance(value, str):
        return _exact_text(value)
    return value


def _exact_text(text: str) -> str | bytes:
    """``text`` as HDF5 can store it. A file name that is not valid UTF-8 reaches us with its
    odd bytes as surrogate escapes, which no UTF-8 string attribute holds: such text is kept
    as its exact bytes (h5py reads them back as the same str)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")
    return text


def _write_node(group: h5py.Group, node: Node) -> None:
    for key, value in node.attrs.items():
        group.attrs[key] = _attr_value(value)
    for key, array in node.datasets.items():
        group.create_dataset(key, data=np.asarray(array))
    for key, child in node.groups.items():
        _write_node(group.create_group(key), child)


def record_image(root: Node) -> bytes:
    """The record as HDF5 file bytes, built in memory."""
    image = io.BytesIO()
    with h5py.File(image, "w") as h5:
        _write_node(h5, root)
    return image.getvalue()


RECORD_MODE = 0o666
TEMPORARY_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def write_record(path: str | Path, root: Node) -> Path:
    """Write the whole record to a temporary file beside ``path``, then rename it into place.

    The HDF5 image is built in memory and written with plain system calls, so a full disk is
    an ordinary error (the HDF5 library itself can crash the process when a write fails under
    it). Any failure removes the temporary file and leaves the previous record untouched."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    image = record_image(root)
    tmp_name = None
    try:
        # The name is known before the file exists, so a signal that lands just after its
        # creation still finds it to remove (with mkstemp, 1 interrupted run in 10 of a test
        # left one). O_EXCL | O_NOFOLLOW open a fresh file, and the rename replaces a link
        # at ``path`` rather than writing through it.
        fd = None
        while fd is None:
            tmp_name = str(directory / f".{path.name}.{secrets.token_hex(4)}.tmp")
            with contextlib.suppress(FileExistsError):
                # Readable as the user's umask allows, as any result file: 0600 kept
                # colleagues in a shared project folder from reading the records.
                fd = os.open(tmp_name, TEMPORARY_FLAGS, RECORD_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(image)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except OSError as exc:
        _remove_quietly(tmp_name)
        raise RecordWriteError(f"cannot write the run record {path}: {_reason(exc)}") from None
    except BaseException:
        _remove_quietly(tmp_name)
        raise
    return path


def _reason(exc: OSError) -> str:
    return disk_reason(exc, "free some space or choose another folder")


def _remove_quietly(name: str | None) -> None:
    if name:
        try:
            os.unlink(name)
        except OSError:
            pass


def stale_temporaries(path: Path) -> list[Path]:
    """Temporary files an interrupted write of ``path`` left behind: its name exactly (a name
    is not a pattern: ``-o '*.h5'`` must not take other records' files), then the random
    part :func:`write_record` gives them."""
    name = re.compile(rf"\.{re.escape(path.name)}\.[0-9a-f]{{8}}\.tmp")
    return [found for found in path.parent.glob(f".{glob.escape(path.name)}.*.tmp")
            if name.fullmatch(found.name)]


class _LinkInRecord(Exception):
    """A soft or external link: dfmp2 writes none, and following one may loop or open
    another file."""


def _read_node(group: h5py.Group) -> Node:
    node = Node()
    for key, value in group.attrs.items():
        node.attrs[key] = _attribute_value(value)
    for key in group.keys():
        if not isinstance(group.get(key, getlink=True), h5py.HardLink):
            raise _LinkInRecord(f"{group.name.rstrip('/')}/{key}")
        item = group[key]
        if isinstance(item, h5py.Group):
            node.groups[key] = _read_node(item)
        else:
            node.datasets[key] = item[()]
    return node


def _read_file(path: Path) -> Node:
    """The record at ``path``; of a file that is no record this version reads, only the
    root's schema (a 1 GB foreign file was read whole, 3 GB of memory, and one holding
    object references, which do not pass to the parent, was called damaged)."""
    with h5py.File(path, "r") as h5:
        # Not attrs.get: it gives None for an attribute whose damage h5py reports as a
        # KeyError, and a damaged record would read as another program's file.
        found = (_attribute_value(h5.attrs["schema"]) if "schema" in h5.attrs.keys()
                 else None)
        if not (isinstance(found, str) and found in KNOWN_SCHEMAS):
            node = Node()
            node.attrs["schema"] = found if isinstance(found, (str, type(None))) else repr(found)
            return node
        return _read_node(h5)


def _attribute_value(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value.item() if isinstance(value, np.generic) else value


def read_deadline(path: Path) -> float:
    """Seconds a record's read may take: a minute, and more for a large file on a slow
    shared disk."""
    return isolated.DEADLINE_SECONDS + path.stat().st_size / SLOW_DISK_BYTES_PER_SECOND


def read_record(path: str | Path) -> Node:
    """Read a record; anything that is not one is an InputError naming the file."""
    path = Path(path)
    kind = existing_kind(path, follow_links=True)
    if kind is None:
        raise InputError(f"{path}: no such record")
    # Opening a FIFO would wait forever for a writer.
    if kind != FILE:
        raise InputError(f"{path} is {kind}, not a run record file")
    try:
        root = in_child(_read_file, path, deadline=read_deadline(path))
    except ChildMissedDeadline as failure:
        raise InputError(f"{path} could not be read: {failure}, so it is damaged or its file "
                         "system is stalled; check the file system and try again, or restore "
                         "the file from a copy") from None
    except ChildFailed as failure:
        raise InputError(f"{path} is a damaged HDF5 file: reading it failed ({failure}); "
                         "restore it from a copy, or move it aside and run again") from None
    except _LinkInRecord as link:
        raise InputError(f"{path} holds a link at {printable(str(link), one_line=True)}, which "
                         f"dfmp2 records never do; {FOREIGN_RECORD}") from None
    except OSError as exc:
        if "unable to lock file" in str(exc):
            raise InputError(f"{path} is open in another program, which holds HDF5's lock on "
                             "it; close it there and try again") from None
        raise InputError(f"{path} is not a readable HDF5 run record") from None
    except Dfmp2Error:
        raise
    except Exception as exc:
        # A file whose HDF5 structure is damaged inside (flipped bits, a torn copy) opens,
        # then h5py fails on the part that is broken with whatever error that part gives
        # (KeyError, RuntimeError, ValueError, ...): every command that read it ended in a
        # traceback.
        raise InputError(f"{path} is a damaged HDF5 file: reading it failed "
                         f"({type(exc).__name__}: {printable(str(exc), one_line=True)[:80]}); "
                         "restore it from a copy, or move it aside and run again") from None
    found = root.attrs.get("schema")
    if isinstance(found, str) and found.partition("/")[0] in KNOWN_KINDS \
            and found not in KNOWN_SCHEMAS:
        raise InputError(f"{path} is a dfmp2 record of schema "
                         f"{printable(found[:60], one_line=True)}, which this version of dfmp2 "
                         f"does not read (it reads {', '.join(KNOWN_SCHEMAS)}); read it with "
                         "the version of dfmp2 that wrote it")
    if not (isinstance(found, str) and found in KNOWN_SCHEMAS):
        raise InputError(f"{path} is an HDF5 file but not a dfmp2 record "
                         f"(schema {printable(repr(found)[:60], one_line=True)}, "
                         f"expected {SCHEMA!r})")
    return root


def record_problem(path: str | Path) -> str | None:
    """Why the file at ``path`` is not a record this version reads (None: it is one)."""
    try:
        read_record(path)
    except InputError as exc:
        return str(exc)
    return None


def new_record(schema: str, command: str, versions: dict[str, str]) -> Node:
    root = Node(attrs={"schema": schema, "status": RUNNING,
                       "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                       "command": command})
    root.group("versions").attrs.update(versions)
    return root


def _text(root: Node, name: str) -> str | None:
    value = root.attrs.get(name)
    if value is None or isinstance(value, str):
        return value
    raise InputError(f"the record's /{name} is not text; {FOREIGN_RECORD}")


@contextlib.contextmanager
def interpreting(path: Path):
    """Reading the contents of the record at ``path``: a value of another kind or shape than
    dfmp2 writes (a record written by something else, or altered) is an input error naming
    the file, not a traceback."""
    try:
        yield
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise InputError(f"cannot read {shown(path)} as a dfmp2 record "
                         f"({type(exc).__name__}: {printable(str(exc), one_line=True)[:80]}); "
                         f"{FOREIGN_RECORD}") from None


def schema(root: Node) -> str | None:
    return _text(root, "schema")


def status(root: Node) -> str | None:
    return _text(root, "status")


def error(root: Node) -> str | None:
    return _text(root, "error")


def created(root: Node) -> str | None:
    return _text(root, "created")


@written_whole
def set_status(root: Node, value: str, error_text: str | None = None) -> None:
    root.attrs["status"] = value
    if error_text:
        root.attrs["error"] = error_text
    else:
        root.attrs.pop("error", None)


@written_whole
def set_resumed(node: Node, resumed: bool) -> None:
    node.attrs["resumed"] = resumed
