"""The record a job writes, from its lock to its last status: locked for the whole job, saved
as it goes, and ended ``complete``, ``failed`` or ``interrupted`` whatever happens (a full
disk and a signal during the last write included), with no temporary file left.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dfmp2.df.store import ScratchArea
from kernels.accounting import NkiRequired
from dfmp2.errors import Dfmp2Error, InputError, Interrupted, RunFailure
from dfmp2.jobs.preamble import Environment
from dfmp2.records.checkpoint import FRESH, RESUME, PreviousRun, examine_previous, put_back
from dfmp2.records.lock import RecordInUse, RecordLock
from dfmp2.records.ledger import write_accounting
from dfmp2.records.sections import (CalculationInputs, ScfEngineSection, read_inputs,
                                    write_timings)
from dfmp2.records.tree import (COMPLETE, FAILED, INTERRUPTED, RUNNING, SCHEMA, Node,
                                RecordWriteError, read_record, set_status, status,
                                write_record)
from dfmp2.system import interrupts
from dfmp2.system.files import (StagedText, refuse_links_named_after,
                                refuse_unless_regular)
from dfmp2.system.memory import limit_reached

log = logging.getLogger(__name__)
# Tries at the final record write of a failed run before a signal is allowed to stop it.
FINAL_WRITE_ATTEMPTS = 3
# The stage of rank r's own scratch files (frequencies: each rank computes whole points).
RANK_STAGE = re.compile(r"r[0-9]+")

class RecordSession:
    """A record this process writes: locked for the whole run, saved as it goes, and ended
    ``complete``, ``failed`` or ``interrupted`` whatever happens, with no temporary file left.
    On ranks other than 0 it only runs the body."""

    def __init__(self, path: Path, env: Environment,
                 calculation: Callable[[Node], bool] | None = None) -> None:
        """``calculation`` tells whether a record holds this job's calculation: a run that
        finds the record in use hands it on with the refusal, so that a batch can tell the
        holder's result for its own only when it is."""
        self.path, self.env, self.calculation = path, env, calculation
        self.lock = RecordLock(path) if env.world.is_root else None
        self.t_start = time.perf_counter()
        # Rank 0's, for every rank: a shared file must have one name on every node.
        self._scratch_prefix = env.world.broadcast(
            scratch_prefix(path, env.scratch_dir) if env.world.is_root else None,
            "sharing the scratch files' name")
        self._areas: list[ScratchArea] = []
        self._complete = False
        self._kept: Node | None = None
        self.restored = False
        self.superseded: Path | None = None
        """The complete record this job set aside, which a failure leaves as it is."""
        self.earlier_scratch: Path | None = None
        """The scratch folder of the killed run this job resumes, when it is another: its
        files of this record are left there (a finished B, rebuilt here) until this job
        completes and removes them."""
        self.outputs: list[StagedText] = []
        """The job's text files written beside their places: in place once the record is
        complete, dropped if it never is."""
        self.superseded_outputs: list[tuple[Path, Path]] = []
        """Files set aside with it (where each is now, where it stood): they go back with
        the record when a run that wrote nothing puts the record back."""

    def scratch_area(self, stage: str) -> ScratchArea:
        """The scratch files of one stage of the job, named after the record. Whatever an
        earlier, killed run left there (files of ranks this run does not have, a B out of
        core that this run keeps in memory) is removed once the job is complete."""
        area = ScratchArea(self.env.scratch_dir, f"{self._scratch_prefix}.{stage}")
        self._areas.append(area)
        return area

    def __enter__(self) -> "RecordSession":
        if self.lock is not None:
            try:
                self.lock.acquire()
            except RecordInUse as exc:
                exc.same_calculation = self.calculation
                raise
            try:
                refuse_links_named_after(self.path, [self.path.parent, self.env.scratch_dir],
                                         "choose another -o or --scratch")
            except BaseException:
                self.lock.release()
                raise
        return self

    def __exit__(self, *exc) -> None:
        for output in self.outputs:
            output.discard()
        if self.lock is not None:
            try:
                if self._complete:
                    self._remove_leftovers()
            finally:
                self.lock.release()

    def _remove_leftovers(self) -> None:
        """Every scratch file of this record's stages, and of other ranks' stages, that is
        still there (ours are removed as they are finished with), here and in the scratch
        folder of the run this one resumed: the result is written, so none is needed again.
        A file that cannot go is reported, and the result stands."""
        stale = self._files_of_stages(self.env.scratch_dir, self._scratch_prefix)
        if self.earlier_scratch is not None:
            stale += self._files_of_stages(self.earlier_scratch,
                                           scratch_prefix(self.path, self.earlier_scratch))
        for path in stale:
            try:
                refuse_unless_regular(path, "remove it by hand")
                path.unlink(missing_ok=True)
                log.info("removed the scratch file %s of an earlier run", path)
            # A signal here is no file that cannot go: it stops the run (the result stands).
            except (InputError, OSError) as exc:
                log.warning("the scratch file %s of an earlier run is left: %s", path, exc)

    def _files_of_stages(self, folder: Path, prefix: str) -> list[Path]:
        """The files in ``folder`` of this job's stages and of rank stages, named after the
        record by ``prefix``."""
        own = f".{prefix}."
        stages = {area.prefix[len(self._scratch_prefix) + 1:] for area in self._areas}

        def of_a_stage(name: str) -> bool:
            stage = name[len(own):].split(".")[0]
            return stage in stages or RANK_STAGE.fullmatch(stage) is not None

        with contextlib.suppress(OSError):
            return sorted(path for path in folder.iterdir()
                          if path.name.startswith(own) and path.name.endswith(".bin")
                          and of_a_stage(path.name))
        return []

    def finish(self, root: Node, state: str, error: str | None = None) -> None:
        set_status(root, state, error)
        write_accounting(root, self.env.kernel_set.accounting, self.env.kernel_set.report())
        # The SCF's kernels too, whatever the command (frequencies and optimize, whose SCFs
        # are their points' and steps', wrote them nowhere).
        scf = self.env.scf_kernels
        if scf.accounting.calls or scf.accounting.fallbacks:
            write_accounting(root, scf.accounting, scf.fast.report(), ScfEngineSection.group_name)
        write_timings(root, {"total": time.perf_counter() - self.t_start})
        if self.env.world.is_root:
            write_record(self.path, root)
        # Only a record that says complete makes the scratch files redundant.
        self._complete = state == COMPLETE

    def complete(self, root: Node) -> None:
        """End the record ``complete``. The job's other files (:attr:`outputs`: the optimised
        geometry, a Molden file) go in place only once the record that says so is written;
        when it cannot be, they are dropped, earlier files of those names stay as they were,
        and the record is left as ``fail`` leaves it."""
        self.finish(root, COMPLETE)
        outputs, self.outputs = self.outputs, []
        for output in outputs:
            output.commit()

    def keep_on_failure(self, complete: Node) -> None:
        """``complete`` is the complete record this job rewrites in place (a frequency job
        that takes its points and analyses them again): if the job fails, the record goes
        back to it, instead of a failed record without the result."""
        self._kept = complete

    def fail(self, root: Node, exc: BaseException) -> str | None:
        """End the record after ``exc``. When the full record cannot be written (a full disk),
        a small one that still says what happened is tried; returns why neither could be."""
        state = INTERRUPTED if isinstance(exc, Interrupted) else FAILED
        text = str(exc) if isinstance(exc, Dfmp2Error) else f"internal error: {exc!r}"
        if self._kept is not None and self.env.world.is_root:
            with contextlib.suppress(Dfmp2Error):
                write_record(self.path, self._kept)
                self.restored = True
                return None
        try:
            self._finish_despite_signals(root, state, text)
        except RecordWriteError:
            try:
                self.finish(without_datasets(root), state, text)
            except Dfmp2Error as write_error:
                return str(write_error)
        except Dfmp2Error as write_error:
            return str(write_error)
        return None

    def _finish_despite_signals(self, root: Node, state: str, error: str) -> None:
        """End the record with everything it holds, even when a signal interrupts the write
        (torchrun's SIGTERM to the ranks left after one died, a second Ctrl-C): the run is
        stopping anyway, and a smaller record would lose finished work."""
        for _ in range(FINAL_WRITE_ATTEMPTS - 1):
            try:
                self.finish(root, state, error)
                return
            except Interrupted:
                log.info("a signal interrupted the final record write; writing it again")
        self.finish(root, state, error)

def _other_scratch(record: Node, scratch_dir: Path) -> Path | None:
    """The scratch folder that ``record``'s run used, when it is a folder other than
    ``scratch_dir``."""
    earlier = read_inputs(record)
    if earlier is None or not earlier.scratch:
        return None
    folder = Path(earlier.scratch)
    with contextlib.suppress(OSError):
        if folder.is_dir() and not folder.samefile(scratch_dir):
            return folder
    return None


def scratch_prefix(record: Path, scratch_dir: Path) -> str:
    """What a record's scratch files are named after: the record's name beside it; in a
    folder of their own (``--scratch``), which records of one name in other folders may share,
    the name and a tag of the record's absolute path, so that their runs never take, reuse or
    remove each other's files."""
    if scratch_dir.resolve() == record.parent.resolve():
        return record.name
    where = os.fsencode(record.parent.resolve() / record.name)
    return f"{record.name}.{hashlib.sha256(where).hexdigest()[:8]}"


def without_datasets(node: Node) -> Node:
    """The record's attributes alone: what was run and how it ended, without the orbitals."""
    return Node(attrs=dict(node.attrs),
                groups={name: without_datasets(child) for name, child in node.groups.items()})

def guarded(session: RecordSession, root: Node, work):
    """Run ``work()``, which a signal stops at once even where the caller holds stops (see
    :func:`dfmp2.system.interrupts.raised_at_once`); any failure ends the record as failed (or
    interrupted) before it is raised again, with the record's path in the message of
    user-facing errors."""
    try:
        with interrupts.raised_at_once():
            return work()
    except BaseException as exc:
        stop = interrupts.requested()
        if stop is not None and not isinstance(exc, Interrupted):
            # The signal's exception was caught where it landed by code that then failed in
            # another way (PySCF's basis loader tries other names, and ends in
            # BasisNotFoundError): the run was stopped, not failed.
            exc = stop
        limit = limit_reached(exc)
        if limit is not None:
            error = RunFailure(limit)
            raise RunFailure(f"{error}{_record_note(session, root, error)}") from None
        if isinstance(exc, NkiRequired):
            # The outcome DFMP2_REQUIRE_NKI asks for, not a bug: one line, the reason kept.
            error = RunFailure(str(exc))
            raise RunFailure(f"{error}{_record_note(session, root, error)}") from None
        if isinstance(exc, Dfmp2Error):
            exc.args = (f"{exc}{_record_note(session, root, exc)}",)
            raise exc from None
        session.fail(root, exc)
        raise

def _record_note(session: RecordSession, root: Node, exc: Dfmp2Error) -> str:
    """`` (record PATH)``, or why the record could not say what happened."""
    unwritten = session.fail(root, exc)
    if session.restored:
        return f" (record {session.path} left as it was, complete)"
    if unwritten is None:
        kept = ("" if session.superseded is None else
                f"; the earlier complete record is kept as {session.superseded}")
        resumes = ("; what was finished is in the record, and rerunning the same command "
                   "resumes it" if isinstance(exc, Interrupted) else "")
        return f"{resumes} (record {session.path}{kept})"
    if isinstance(exc, RecordWriteError):
        return _kept_note(session.path) + _superseded_note(session)
    return f" (record {session.path} not updated: {unwritten})"


def _superseded_note(session: RecordSession) -> str:
    """Where the complete record set aside for a run that could not write its own is: back
    at its path when the run wrote nothing there (a full disk), else beside it."""
    superseded = session.superseded
    if superseded is None:
        return ""
    if put_back(superseded, session.path):
        session.superseded = None
        for aside, place in session.superseded_outputs:
            put_back(aside, place)
        return f" (the earlier complete record is back at {session.path})"
    return f" (the earlier complete record is kept as {superseded})"


def _kept_note(path: Path) -> str:
    """What a record that could not be rewritten at all still says: when its last save was
    of this run (``running``), rerunning the command resumes from what it holds."""
    try:
        state = status(read_record(path))
    except (Dfmp2Error, OSError):
        return ""
    if state != RUNNING:
        return ""
    return (f" (the record keeps its last save, status {RUNNING}: rerunning the command "
            "resumes from it)")


def settle_superseded(superseded: Path | None, same: Callable[[Node], bool]) -> bool:
    """After a run completed: the complete record moved aside for it is dropped when it held
    the same calculation (``same`` of its root), and kept otherwise, with a warning naming
    it. Whether it was dropped."""
    if superseded is None:
        return False
    # A signal is raised once the copy is settled: landing in its read, it was taken for a
    # copy that cannot be read, and one of the same calculation stayed, said to be of other
    # inputs.
    with interrupts.signals_held():
        try:
            if same(read_record(superseded)):
                superseded.unlink()
                log.info("removed %s: the new record holds the same calculation", superseded)
                return True
        except (Dfmp2Error, OSError):
            pass
        log.warning("the earlier complete record, of other inputs, is kept as %s", superseded)
    return False


def same_inputs(inputs: CalculationInputs) -> Callable[[Node], bool]:
    """Whether a record's ``/input`` is that of the same calculation as ``inputs``."""
    def same(root: Node) -> bool:
        stored = read_inputs(root)
        return stored is not None and not stored.differing(inputs,
                                                           CalculationInputs.REUSE_FIELDS)
    return same


def shared_previous_run(session: RecordSession, inputs: CalculationInputs, resume: bool,
                        reuse_complete: bool, same_result: Callable[[Node], bool] | None = None
                        ) -> PreviousRun:
    """What to do with the run record at the session's path (see
    :func:`dfmp2.records.checkpoint.examine_previous`), decided by rank 0 alone (the one that
    writes records) and its action shared with every rank; the other ranks know nothing of
    the record itself."""
    world = session.env.world
    previous = PreviousRun(FRESH)
    if world.is_root:
        # A batch (the caller that reuses complete records) follows its manifest: an
        # unfinished record of a line's earlier options is moved aside, not refused forever.
        previous = examine_previous(session.path, SCHEMA, inputs, resume, reuse_complete,
                                    same_result=same_result, unfinished_aside=reuse_complete)
        session.superseded = previous.superseded
        if previous.action == RESUME:
            session.earlier_scratch = _other_scratch(previous.record, session.env.scratch_dir)
    return replace(previous,
                   action=world.broadcast(previous.action, "sharing the resume decision"))
