"""One run per record: an advisory lock beside the record, held for the whole run.

The lock is an ``flock`` on ``.<record>.lock``. The kernel drops it when its holder exits for
any reason, SIGKILL included, so a lock file left by a killed run never blocks the resume;
while a run holds it, a second run on the same record is refused at once. Only the holder
may touch the record's temporary and scratch files.
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from dfmp2.errors import InputError, RunFailure
from dfmp2.system.files import disk_reason, open_lock_file

REMEDY = "choose another -o"
SPACE_REMEDY = "free some space or choose another -o"


class RecordInUse(InputError):
    """Another process is running on this record."""


def lock_path(record: Path) -> Path:
    return record.parent / f".{record.name}.lock"


class RecordLock:
    def __init__(self, record: Path) -> None:
        self.record = record
        self.path = lock_path(record)
        self._fd: int | None = None

    def __enter__(self) -> "RecordLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        # A holder unlinks the file before it lets go, so after locking we check that the
        # path still names the file we locked; otherwise we lock the new one.
        while True:
            try:
                fd = open_lock_file(self.path, REMEDY)
            except IsADirectoryError:
                # Something the user put there, as a link or a FIFO would be: bad input.
                raise InputError(f"the lock file {self.path} is a folder; {REMEDY}") from None
            except PermissionError as exc:
                # Left by another user's killed run (in a sticky folder such as /tmp it is
                # theirs alone to remove): only another -o lets this run go on.
                raise InputError(f"cannot open the lock file {self.path} ({exc.strerror}): "
                                 "it is another user's, or this folder's permissions do not "
                                 "let you replace it; remove it if no dfmp2 run uses the "
                                 f"record, or {REMEDY}") from None
            except OSError as exc:
                raise RunFailure(f"cannot create the lock file {self.path}: "
                                 f"{disk_reason(exc, SPACE_REMEDY)}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_pid(fd)
                os.close(fd)
                raise RecordInUse(f"{self.record} is in use by another dfmp2 run"
                                  f"{f' (process {holder})' if holder else ''}; wait for it to "
                                  "finish or choose another -o") from None
            except OSError as exc:
                # A file system mounted without locks (Lustre's noflock: ENOSYS; NFS without
                # its lock daemon: ENOLCK). Running unlocked could let two runs write one
                # record, so the run stops here, with the lock file it made removed.
                self.path.unlink(missing_ok=True)
                os.close(fd)
                raise RunFailure(f"cannot lock {self.path} ({exc.strerror or exc}): its file "
                                 "system does not support file locks; put the record on one "
                                 "that does with -o (a local disk, or a mount with locking "
                                 "on)") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError as exc:
            # Nobody else may use a lock we hold, so removing it here races no one.
            self.path.unlink(missing_ok=True)
            os.close(fd)
            raise RunFailure(f"cannot write the lock file {self.path}: "
                             f"{disk_reason(exc, SPACE_REMEDY)}") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
