"""Files dfmp2 creates beside a record or in scratch: never through a symbolic link, never
onto something that is not a plain file, and with names the folder can hold.

Every name dfmp2 derives from a record (its lock, temporary, probe and scratch files) sits in a
folder other people may write to, so a link planted at one of those names must not redirect
our writes into the file it points to: new files are created with ``O_EXCL | O_NOFOLLOW``, and
a link found at one of our names is refused rather than removed (dfmp2 never creates links,
so one there was put there on purpose, by someone who should hear about it).
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from dfmp2.errors import InputError, RunFailure

# The longest names dfmp2 derives from a record named NAME ("{}" below): the writability
# probe (8 random characters), the raw B of an interaction's calculation and of a gradient
# in a --scratch folder (with the tag of the record's path), and a complete record set aside
# (its creation time is 19 digits, then a counter).
DERIVED_NAMES = (".{}.12345678.probe", ".{}.0123abcd.monomer_a_cp.b0.raw.bin",
                 ".{}.0123abcd.run.gradient.b0.raw.bin", "{}.superseded-YYYYMMDDTHHMMSSHHMM-NN")
ADDED_BYTES = max(len(template.format("")) for template in DERIVED_NAMES)
DEFAULT_NAME_MAX = 255
FILE = "file"
# Long names are cut in messages, which must stay one readable line.
SHOWN_NAME_CHARS = 60
# The first bytes of every HDF5 file (a user block aside, which dfmp2 records never have).
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# A text output's temporary, beside it until it is renamed onto it.
TEXT_TEMPORARY = ".{}.tmp"


def shown(path: Path | str) -> str:
    """``path`` for a message: its ends when it is very long."""
    text = str(path)
    if len(text) <= SHOWN_NAME_CHARS:
        return text
    return f"{text[:SHOWN_NAME_CHARS - 20]}...{text[-17:]}"


def link_refusal(path: Path, remedy: str = "choose another -o") -> InputError:
    return InputError(f"{shown(path)} is a symbolic link; dfmp2 does not write through links: "
                      f"remove it or {remedy}")


def existing_kind(path: Path, follow_links: bool = False) -> str | None:
    """What is at ``path``: None (nothing), :data:`FILE` (a regular file), or its kind in
    words ("a symbolic link", "a FIFO (named pipe)" ...). A path the file system cannot look
    up (a name too long, a file where a folder should be, a NUL byte) is an InputError."""
    try:
        mode = (os.stat(path) if follow_links else os.lstat(path)).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{shown(path)}: {exc.strerror or exc}") from None
    except ValueError:
        # os.stat's answer to a name holding a NUL byte, which no file name can.
        raise InputError(f"{shown(path)} holds a NUL byte, which no file name can") from None
    return kind_of(mode)


def lookup_problem(path: Path) -> str | None:
    """Why the file system cannot look ``path`` up (a name longer than it allows, a file
    where a folder should be), or None when it can: pathlib's ``is_file`` and ``is_dir``
    raise for a name too long instead of answering."""
    try:
        existing_kind(path, follow_links=True)
    except InputError as exc:
        return str(exc)
    return None


def kind_of(mode: int) -> str:
    if stat.S_ISREG(mode):
        return FILE
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                        (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return words
    return "not a regular file"


def refuse_unless_regular(path: Path, remedy: str) -> None:
    """Refuse a link or anything but a regular file at ``path`` (nothing there is fine)."""
    kind = existing_kind(path)
    if kind == "a symbolic link":
        raise link_refusal(path, remedy)
    if kind not in (None, FILE):
        raise InputError(f"{shown(path)} is {kind}, not a regular file; remove it or {remedy}")


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (or, where one does not exist yet, would)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return Path(os.path.abspath(a)) == Path(os.path.abspath(b))


def refuse_overwriting(target: Path, what: str, others: dict[str, Path], remedy: str) -> None:
    """Refuse, before any work, an output ``target`` that is one of the job's other files
    (``others``: the molecule, the record), which writing it would destroy."""
    for name, other in others.items():
        if same_file(target, other):
            raise InputError(f"{what} {shown(target)} is the {name}; {remedy}")


def refuse_record_files(target: Path, what: str, record: Path, remedy: str) -> None:
    """Refuse, before any work, an output ``target`` among the files named after the record:
    its lock, temporaries and scratch (``.<record>.*``, the lock replaced mid-run by a Molden
    file let a second run lock a fresh one) and its set-aside copies
    (``<stem>.superseded-*``), which writing it would destroy."""
    folder = Path(os.path.abspath(record)).parent
    if Path(os.path.abspath(target)).parent != folder:
        return
    name = target.name
    if name.startswith(f".{record.name}.") or name.startswith(f"{record.stem}.superseded-"):
        raise InputError(f"{what} {shown(target)} is one of the files of the record "
                         f"{shown(record)}; {remedy}")


def refuse_hdf5(target: Path, what: str, remedy: str) -> None:
    """Refuse, before any work, a text output ``target`` that is an HDF5 file: a dfmp2 record
    (a complete one, another job's) named as ``--molden`` was replaced by the Molden text."""
    try:
        with open(target, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            # HDF5 looks for its signature at 0, 512, 1024, 2048 ...: a file with a user
            # block before it (a MATLAB v7.3 file) is HDF5 too.
            offsets = [0] + [512 << k for k in range(max(0, size.bit_length() - 9))]
            found = False
            for offset in offsets:
                handle.seek(offset)
                if handle.read(len(HDF5_SIGNATURE)) == HDF5_SIGNATURE:
                    found = True
                    break
    except OSError:
        return
    if found:
        raise InputError(f"{what} {shown(target)} is an HDF5 file (a dfmp2 record?), which "
                         f"writing it would destroy; {remedy}")


def create_exclusive(path: Path, remedy: str, mode: int = 0o600) -> int:
    """A new, empty file at ``path``, opened read-write, that no link can redirect. A regular
    file already there (an earlier run's) is replaced; a link or anything else is refused.
    Other failures are the caller's OSError to report."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, mode)
    except FileExistsError:
        pass
    refuse_unless_regular(path, remedy)
    path.unlink(missing_ok=True)
    return os.open(path, flags, mode)


def check_text_output(path: Path, option: str, remedy: str) -> None:
    """Refuse, before any work, a text output (``option`` names it) that could not be written:
    a link or anything but a regular file at ``path``, an HDF5 file (a record), a folder that
    is missing or not writable, or a name that leaves no room for its temporary."""
    refuse_unless_regular(path, remedy)
    # The temporary it is written to first, too: a link or FIFO there stopped the job only
    # once its whole calculation was done.
    refuse_unless_regular(text_temporary(path), remedy)
    refuse_hdf5(path, option, remedy)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{option} {shown(path)}: the folder {shown(folder)} is not a "
                         f"writable folder; {remedy}")
    if len(os.fsencode(TEXT_TEMPORARY.format(path.name))) > folder_name_max(folder):
        raise InputError(f"{option} name {shown(path.name)} is too long; {remedy}")


def is_empty_file(path: Path) -> bool:
    """Whether ``path`` is a regular file of no bytes (not through a link): what ``mktemp``
    and Python's temporary files give a job script as its output's name, holding nothing a
    record written there could destroy."""
    try:
        info = os.lstat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size == 0


def can_create_files_in(folder: Path, prefix: str) -> bool:
    """Whether a file can be created in ``folder``: tried (an empty ``<prefix>*.probe``,
    removed at once), not asked, since root passes any access test, and /proc passes it."""
    try:
        probe_fd, probe = tempfile.mkstemp(prefix=prefix, suffix=".probe", dir=folder)
    except OSError:
        return False
    os.close(probe_fd)
    os.unlink(probe)
    return True


def create_folder(folder: Path, remedy: str) -> None:
    """Create the output folder ``folder`` (and its parents) when missing; one that cannot be
    created (a read-only file system, a file in the way) is the user's to fix."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output folder {shown(folder)}: "
                         f"{exc.strerror or exc}; {remedy}") from None


@dataclass(frozen=True)
class StagedText:
    """A text output written whole beside ``path`` (its temporary) and not yet in place:
    :meth:`commit` renames it onto ``path`` once the record it belongs to is written, and
    :meth:`discard` drops it, leaving an earlier file at ``path`` as it was."""

    temporary: Path
    path: Path

    def commit(self) -> None:
        try:
            os.replace(self.temporary, self.path)
        except OSError as exc:
            self.discard()
            raise RunFailure(f"cannot write {shown(self.path)}: "
                             f"{disk_reason(exc, 'free some space')}") from None

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self.temporary.unlink(missing_ok=True)


def stage_text(path: Path, write: Callable[[TextIO], object], remedy: str) -> StagedText:
    """The text ``write`` puts into a handle, written into a new file beside ``path``,
    created so that no link planted there redirects it; in place only once committed, so
    that a kill, a full disk or a record that cannot be written leaves an earlier file at
    ``path`` whole."""
    check_text_output(path, "output", remedy)
    temporary = text_temporary(path)
    try:
        # Readable by others, as a file a viewer opens is expected to be.
        with os.fdopen(create_exclusive(temporary, remedy, 0o644), "w",
                       encoding="utf-8") as handle:
            write(handle)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise RunFailure(f"cannot write {shown(path)}: "
                         f"{disk_reason(exc, 'free some space')}") from None
    return StagedText(temporary, path)


def text_temporary(path: Path) -> Path:
    return path.with_name(TEXT_TEMPORARY.format(path.name))


def open_lock_file(path: Path, remedy: str) -> int:
    """The lock file at ``path``, created when missing, opened without following a link; a
    lock left by a killed run is a regular file and is opened again, as it must be."""
    try:
        # O_NONBLOCK: a FIFO planted at the name must not stall the open before it is refused.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise link_refusal(path, remedy) from None
        raise
    info = os.fstat(fd)
    # Writing our process id truncates the file: it must be ours alone.
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        kind = kind_of(info.st_mode)
        what = "a file with other hard links" if kind == FILE else kind
        raise InputError(f"{shown(path)} is {what}, not dfmp2's lock file; remove it or "
                         f"{remedy}")
    return fd


def refuse_links_named_after(record: Path, folders: list[Path], remedy: str) -> None:
    """Refuse any link among the files dfmp2 names after ``record`` (``.<name>.*``) in
    ``folders``: checked once before the run, so that nothing is computed only to be refused
    when a scratch file is opened (PySCF, which writes the SCF's JK tensor itself, would
    write through it)."""
    prefix = f".{record.name}."
    for folder in dict.fromkeys(folders):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(prefix) and entry.is_symlink():
                raise link_refusal(Path(folder) / entry.name, remedy)


def folder_name_max(folder: Path) -> int:
    """The longest file name, in bytes, that ``folder`` can hold."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        return DEFAULT_NAME_MAX


def check_name_length(path: Path, folder: Path) -> None:
    """Refuse a record name that does not leave room, within the folder's longest file name,
    for the names dfmp2 derives from it."""
    size = len(os.fsencode(path.name))
    name_max = folder_name_max(folder)
    if size > name_max:
        raise InputError(f"output name {shown(path.name)} is {size} bytes, longer than the "
                         f"{name_max} a file name may have; choose a shorter -o")
    limit = name_max - ADDED_BYTES
    if size > limit:
        raise InputError(f"output name {shown(path.name)} is too long by {size - limit} bytes: "
                         f"dfmp2 names its lock, temporary and scratch files after it, which "
                         f"leaves {limit} of the {name_max} bytes a file name may have; "
                         "choose a shorter -o")


# C0 control characters but tab and newline, DEL and the C1 controls: in a file name they could
# clear or recolour the user's terminal, move its cursor, or forge a line of our output.
_CONTROLS = {code: f"\\x{code:02x}" for code in (*range(0x20), 0x7F, *range(0x80, 0xA0))
             if code not in (0x09, 0x0A)}
_CONTROLS_AND_BREAKS = {**_CONTROLS, 0x09: "\\t", 0x0A: "\\n"}


def printable(text: str, one_line: bool = False) -> str:
    """``text`` for a terminal of any locale: bytes of a file name that are not UTF-8 (surrogate
    escapes in a str) shown as ``\\xNN`` rather than failing the print, and control characters
    as escapes (tabs and newlines too with ``one_line``: for a table cell or an error line)."""
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text.translate(_CONTROLS_AND_BREAKS if one_line else _CONTROLS)


def names_a_folder(text: str) -> bool:
    """Whether a file name as typed ends in a folder: ``dir/``, ``dir/.``, ``..``. Path()
    drops such an ending (``-o newdir/`` wrote a record file named newdir)."""
    return text.replace(os.sep, "/").rsplit("/", 1)[-1] in ("", ".", "..")


def disk_reason(exc: OSError, remedy: str) -> str:
    """Why a write failed, in words, with what to do about a full disk or quota."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"{os.strerror(exc.errno)}; {remedy}"
    return exc.strerror or str(exc) or type(exc).__name__
