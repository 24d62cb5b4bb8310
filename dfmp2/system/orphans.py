"""What a dfmp2 killed by SIGKILL leaves behind: its child processes and its temporary folders.

A dfmp2 killed by SIGKILL (the OOM killer, ``kill -9``, a harness's timeout) runs no cleanup,
and its children went on: a record reader looping at full CPU, or a benchmark's side
computing a whole calculation for no one, its files left in ``$TMPDIR``. A child now ends
with its parent (:func:`end_with_parent`).

A temporary folder (:class:`OwnedFolder`) stayed too, with the records and scratch files in
it. Its name says which process made it (the machine's boot and the process's PID namespace,
its pid and start time), so that the next dfmp2 making a folder of that kind there removes
those whose owner has ended. A folder is removed only when it is a real folder of this user,
never through a link, and only when its pid names no process of this boot and namespace or a
process started at another time (the pid reused); a folder from another machine sharing the
file system, another boot or another PID namespace is never taken for an ended owner's.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import re
import secrets
import signal
import tempfile
from pathlib import Path

from dfmp2.errors import InputError

log = logging.getLogger(__name__)

# Linux's prctl option that sends a process a signal when its parent dies.
PR_SET_PDEATHSIG = 1
# Hex digits of the token of the machine's boot and PID namespace in a folder's name: enough
# that two machines sharing a file system never draw the same one.
PLACE_DIGITS = 16
# Random bytes that tell apart the folders of one process.
FOLDER_TOKEN_BYTES = 4
FOLDER_MODE = 0o700
OPEN_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def end_with_parent(parent: int) -> None:
    """Run in the child: ask Linux to kill it when its parent dies (elsewhere nothing is
    asked). A parent that died before the request was made is seen by its pid."""
    # The process's own symbols include the C library's (find_library would start ldconfig).
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


# The state of a process whose /proc entry exists but could not be read (too many open
# files, no permission): nothing is known of it, so it is taken to run.
UNKNOWN_STATE = ("?", "?")


def process_state(pid: int) -> tuple[str, str] | None:
    """A process's state letter and start time (clock ticks since boot), None when there
    is no such process (or no ``/proc``), or :data:`UNKNOWN_STATE` when its entry could not
    be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except (OSError, IndexError):
        return UNKNOWN_STATE
    return fields[0], fields[19]


def process_ended(pid: int, started: str) -> bool:
    """Whether the process ``pid`` that started at ``started`` has ended: no process has that
    pid, or it is a zombie, or it started at another time (the pid was given to another).
    One whose entry cannot be read has not (its folder was removed under it)."""
    state = process_state(pid)
    if state is UNKNOWN_STATE:
        return False
    return state is None or state[0] in ("Z", "X") or state[1] != started


def _place() -> str | None:
    """This boot of this machine and this process's PID namespace, as one token: a pid names
    a process within both alone. None without ``/proc``, or with the ``/proc`` of another PID
    namespace (a host's, mounted in a container), whose pids are not this process's."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
        if os.readlink("/proc/self") != str(os.getpid()):
            return None
    except OSError:
        return None
    return hashlib.sha256(f"{boot} {namespace}".encode()).hexdigest()[:PLACE_DIGITS]


def _owner_pattern(prefix: str, place: str) -> re.Pattern:
    token = f"[0-9a-f]{{{2 * FOLDER_TOKEN_BYTES}}}"
    return re.compile(rf"{re.escape(prefix)}{place}-(\d+)-(\d+)-{token}")


class OwnedFolder:
    """A new private folder ``<parent>/<prefix><place>-<pid>-<start>-<random>`` (``parent``
    by default the system's temporary folder, as ``tempfile`` finds it), removed with all it
    holds on leaving the ``with`` block. The folders of ``prefix`` there whose owner has
    ended are removed first. Without ``/proc`` the name is ``<prefix><random>``, which no
    later process removes. An OSError is the parent's: missing or not writable."""

    def __init__(self, prefix: str, parent: str | Path | None = None) -> None:
        self.parent = Path(parent if parent is not None else tempfile.gettempdir())
        place, own = _place(), process_state(os.getpid())
        owner = ""
        if place is not None and own is not None:
            _remove_ended_owners_folders(self.parent, prefix, place)
            owner = f"{place}-{os.getpid()}-{own[1]}-"
        for _ in range(tempfile.TMP_MAX):
            self.path = self.parent / f"{prefix}{owner}{secrets.token_hex(FOLDER_TOKEN_BYTES)}"
            try:
                # mkdir never follows a link at its name: anything there, a link planted by
                # another user included, is left alone and another name drawn.
                os.mkdir(self.path, FOLDER_MODE)
                return
            except FileExistsError:
                continue
        raise FileExistsError(errno.EEXIST, "no unused name for a temporary folder",
                              str(self.parent))

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *_) -> None:
        try:
            _remove_folder(self.parent, self.path.name)
        except OSError as exc:
            log.warning("cannot remove the temporary folder %s (%s); the next dfmp2 to make "
                        "one there removes it once this process has ended", self.path,
                        exc.strerror or exc)


def scratch_folder_in(parent: str | Path, prefix: str) -> OwnedFolder:
    """An :class:`OwnedFolder` of ``prefix`` in the folder given with ``--scratch``, for the
    scratch files of a calculation that keeps no record to resume (a benchmark's, the ASE
    calculator's): named after the record alone, a SIGKILLed one's stayed there for good."""
    try:
        return OwnedFolder(prefix, parent)
    except OSError as exc:
        raise InputError(f"scratch folder {parent} is not a writable folder: no folder can be "
                         f"made in it ({exc.strerror or exc}); choose another with --scratch"
                         ) from None


def _remove_ended_owners_folders(parent: Path, prefix: str, place: str) -> None:
    """Remove the folders of ``prefix`` in ``parent`` that a process of this machine's boot
    and PID namespace (``place``) made and that has ended; a failure is logged, never
    raised (the folder then stays for a later try)."""
    pattern = _owner_pattern(prefix, place)
    try:
        names = [name for name in os.listdir(parent) if pattern.fullmatch(name)]
    except OSError:
        return
    for name in names:
        pid, started = pattern.fullmatch(name).groups()
        if not process_ended(int(pid), started):
            continue
        try:
            if _remove_folder(parent, name):
                log.info("removed the folder %s of dfmp2 process %s, which has ended",
                         parent / name, pid)
        except OSError as exc:
            log.warning("cannot remove the folder %s of dfmp2 process %s, which has ended: "
                        "%s", parent / name, pid, exc.strerror or exc)


def _remove_folder(parent: Path, name: str) -> bool:
    """Remove ``parent/name`` with all it holds when it is a folder of this user, opened
    without following a link and emptied through that descriptor, so that a link or
    another's folder put in its place is never entered; whether it was removed."""
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(name, OPEN_FOLDER, dir_fd=parent_fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            # A link (ELOOP) or anything but a folder (ENOTDIR) at the name is not ours.
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return False
            raise
        try:
            if os.fstat(fd).st_uid != os.getuid():
                return False
            _empty(fd)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(parent_fd)


def _empty(folder_fd: int) -> None:
    """Remove everything in the open folder ``folder_fd``, entering only real folders. What
    is gone already was removed by another process cleaning up the same folder."""
    for name in os.listdir(folder_fd):
        try:
            fd = os.open(name, OPEN_FOLDER, dir_fd=folder_fd)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=folder_fd)
            continue
        try:
            _empty(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=folder_fd)
