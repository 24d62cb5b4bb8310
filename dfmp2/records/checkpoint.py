"""What an existing record means for a new run on it, and the record as a checkpoint.

The record doubles as the checkpoint of the SCF and of finished block pairs. Every save
replaces the whole record atomically, so a run killed at any moment leaves either the previous
or the next checkpoint, never a torn file. These functions run only while the record's lock is
held (:mod:`dfmp2.records.lock`), so nothing here races another process.

Policy for a record already at the output path:

- ``running`` or ``interrupted`` with the same inputs: resume it; with other inputs: refuse
  (its work is not ours to throw away);
- ``failed`` with the same inputs: resume what it finished; with other inputs: replace it;
- ``complete`` with the same inputs: reused where the caller allows (batch), else
  recomputed (resumed from it under ``--resume``); with other inputs: recomputed. A complete
  record is never overwritten: it is first moved aside (``<stem>.superseded-<created>.h5``),
  and the copy is dropped only when the new run completes with the same inputs.
"""
from __future__ import annotations

import glob
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dfmp2.errors import Dfmp2Error, InputError
from dfmp2.system import interrupts
from dfmp2.system.files import is_empty_file
from dfmp2.mp2.pairs import PairKey
from dfmp2.mp2.plan import BlockPlan
from dfmp2.records.job_sections import read_steps
from dfmp2.records.sections import (
    CalculationInputs,
    Checkpoint,
    read_checkpoint,
    read_inputs,
    read_scf,
    write_checkpoint,
)
from dfmp2.records.tree import (
    COMPLETE,
    FAILED,
    INTERRUPTED,
    Node,
    created,
    interpreting,
    read_record,
    schema,
    stale_temporaries,
    status,
    write_record,
)

log = logging.getLogger(__name__)

FRESH, RESUME, REUSE = "fresh", "resume", "reuse"


@dataclass(frozen=True)
class PreviousRun:
    """What to do with the record found at the output path."""

    action: str
    record: Node | None = None
    superseded: Path | None = None


def examine_previous(path: Path, expected_schema: str, inputs: CalculationInputs,
                     resume_required: bool, reuse_complete: bool,
                     resume_fields: tuple[str, ...] = CalculationInputs.RESUME_FIELDS,
                     same_result: Callable[[Node], bool] | None = None,
                     unfinished_aside: bool = False) -> PreviousRun:
    """What to do with the record at ``path``: an unfinished one of the same
    ``resume_fields`` is resumed (other ones refused, or with ``unfinished_aside`` moved aside
    as ``<stem>.unfinished-<created>``; failed ones replaced), a complete one of the same
    inputs is reused or resumed only when ``same_result`` (what the job asks of it beyond
    ``/input``, such as a density or convergence criteria) holds for it, and any other
    complete one is set aside."""
    for tmp in stale_temporaries(path):
        tmp.unlink(missing_ok=True)
    if not path.exists() or is_empty_file(path):
        # A job stopped before it wrote its record (a signal while it started) left nothing
        # to resume, as one stopped before its SCF was saved: a requeued job that always
        # passes --resume starts it. So does an empty file (a job script's mktemp).
        if resume_required:
            log.warning("--resume: there is no record at %s, so nothing finished to resume; "
                        "starting the run", path)
        # A rerun killed after it set a complete record aside, before writing its own, left
        # only the copy: this run drops it once it completes the same calculation.
        return PreviousRun(FRESH, superseded=_copy_of_the_same(path, inputs))
    try:
        previous = read_record(path)
    except InputError as exc:
        raise InputError(f"cannot resume from {path}: {exc}") from None
    with interpreting(path):
        return _previous_run(path, previous, expected_schema, inputs, resume_required,
                             reuse_complete, resume_fields, same_result, unfinished_aside)


def _previous_run(path: Path, previous: Node, expected_schema: str, inputs: CalculationInputs,
                  resume_required: bool, reuse_complete: bool, resume_fields: tuple[str, ...],
                  same_result: Callable[[Node], bool] | None,
                  unfinished_aside: bool) -> PreviousRun:
    if schema(previous) != expected_schema:
        raise InputError(f"{path} holds a {schema(previous)} record, not a {expected_schema} "
                         "one; choose another -o")
    stored = read_inputs(previous)
    state = status(previous)
    if state == COMPLETE:
        same = (stored is not None
                and not stored.differing(inputs, CalculationInputs.REUSE_FIELDS)
                and (same_result is None or same_result(previous)))
        if same and reuse_complete:
            return PreviousRun(REUSE, previous)
        if same and resume_required:
            # Resumed from its contents, which the new record rewrites from its first save
            # (holding none of the result yet): a kill then left a running record in its
            # place, and the result had to be computed again.
            return PreviousRun(RESUME, previous, set_aside(path, previous))
        if resume_required:
            raise InputError(f"--resume: {path} holds a complete run with other options; "
                             "drop --resume to recompute it")
        return PreviousRun(FRESH, superseded=set_aside(path, previous))
    differing = (list(resume_fields) if stored is None else
                 stored.differing(inputs, resume_fields))
    stored_scf = read_scf(previous)
    resumable = (read_checkpoint(previous) is not None or read_steps(previous) is not None
                 or (stored_scf is not None and stored_scf[1] is not None))
    if state == FAILED and differing:
        if resume_required:
            raise InputError(f"cannot resume from {path}: it holds a failed run with different "
                             f"{', '.join(differing)}")
        return PreviousRun(FRESH)
    if differing and unfinished_aside and not resume_required:
        kept = set_aside(path, previous, "unfinished")
        log.warning("%s held an unfinished run with different %s; it is kept as %s",
                    path, ", ".join(differing), kept)
        return PreviousRun(FRESH)
    if differing:
        kind = "an interrupted" if state == INTERRUPTED else "an unfinished"
        raise InputError(f"{path} holds {kind} run with different {', '.join(differing)}; "
                         "resume it with the same molecule and options, or choose another "
                         f"-o{complete_copies_beside(path)}")
    if not resumable:
        # Stopped before its SCF was saved: starting again loses nothing, and a requeued job
        # that always passes --resume must not fail on it.
        if resume_required:
            log.warning("%s holds a run of these inputs stopped before it finished anything; "
                        "starting it again", path)
        # A rerun killed so, after it set a complete record aside, left that copy too.
        return PreviousRun(FRESH, superseded=_copy_of_the_same(path, inputs))
    return PreviousRun(RESUME, previous, _copy_of_the_same(path, inputs))


def _copy_of_the_same(path: Path, inputs: CalculationInputs) -> Path | None:
    """The newest complete record set aside beside ``path`` that holds the calculation of
    ``inputs``: a rerun killed after it set the record aside leaves one, which the resumed
    run makes redundant once it completes (it stayed, without a word)."""
    for copy in sorted(path.parent.glob(f"{glob.escape(path.stem)}.superseded-*{path.suffix}"),
                       reverse=True):
        try:
            root = read_record(copy)
            stored = read_inputs(root)
        except (Dfmp2Error, OSError, TypeError, ValueError, KeyError):
            continue
        if (status(root) == COMPLETE and stored is not None
                and not stored.differing(inputs, CalculationInputs.REUSE_FIELDS)):
            return copy
    return None


# 'created' (ISO 8601 with its UTC offset) as digits: 20261125T0902270000.
SET_ASIDE_STAMP_LENGTH = 19


def complete_copies_beside(path: Path) -> str:
    """`` (complete earlier records beside it: ...)`` naming the copies set aside for
    ``path``, for a refusal that leaves the user looking for their result; empty if none."""
    kept = sorted(path.parent.glob(f"{glob.escape(path.stem)}.superseded-*{path.suffix}"))
    return (f" (complete earlier records beside it: {', '.join(k.name for k in kept)})"
            if kept else "")


class CannotSetAside(InputError):
    """A record that could not be moved aside; ``reason`` says why (the system's words)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):
        return type(self), (str(self), self.reason)


def put_back(aside: Path, path: Path) -> bool:
    """Move a file set aside (a record, or an output beside it) back to ``path`` where
    nothing took its place (a rerun that wrote nothing there); whether it is back."""
    if path.exists():
        return False
    try:
        os.rename(aside, path)
    except OSError:
        return False
    return True


def set_aside(path: Path, previous: Node, kind: str = "superseded") -> Path:
    """Move a record out of the way as ``<stem>.<kind>-<created>``: a complete one
    (``superseded``), or an unfinished one a batch line no longer asks for."""
    # Bounded: an edited or foreign record's 'created' made a name too long to create.
    stamp = re.sub(r"[^0-9T]", "", created(previous) or "")[:SET_ASIDE_STAMP_LENGTH] or "earlier"
    target = path.with_name(f"{path.stem}.{kind}-{stamp}{path.suffix}")
    counter = 1
    while target.exists():
        counter += 1
        target = path.with_name(f"{path.stem}.{kind}-{stamp}-{counter}{path.suffix}")
    try:
        path.rename(target)
    except OSError as exc:
        # An immutable record, or another user's in a sticky folder such as /tmp.
        raise CannotSetAside(
            f"cannot move the {'complete' if kind == 'superseded' else kind} record {path} "
            f"aside to {target.name} ({exc.strerror}), so nothing was run; move or remove it "
            "yourself, or write the new record elsewhere", exc.strerror or str(exc)) from None
    # Whether the copy stays is known once the new run completes (settle_superseded).
    log.info("moved the %s record %s to %s", "complete" if kind == "superseded" else kind,
             path, target)
    return target


def resumable_pairs(previous: Node | None, plan: BlockPlan) -> dict[PairKey, tuple[float, float]]:
    """The finished pairs of an interrupted run that this plan can use: all of them when the
    block size is the same, none otherwise (pairs of other blocks cover other orbitals)."""
    stored = read_checkpoint(previous) if previous is not None else None
    if stored is None or stored.occ_block != plan.occ_block:
        if stored is not None and stored.pairs:
            log.info("the interrupted run used occupied blocks of %s; its %d finished pairs "
                     "are recomputed with blocks of %d", stored.occ_block, len(stored.pairs),
                     plan.occ_block)
        return {}
    finite = {key: sums for key, sums in stored.pairs.items()
              if all(math.isfinite(value) for value in sums)}
    if len(finite) < len(stored.pairs):
        log.warning("%d of the interrupted run's finished pairs hold non-finite sums; they "
                    "are computed again", len(stored.pairs) - len(finite))
    return finite


def stored_occ_block(previous: Node | None) -> int | None:
    stored = read_checkpoint(previous) if previous is not None else None
    return None if stored is None else stored.occ_block


def save_checkpoint(path: Path, root: Node) -> None:
    """Write the record of a run under way; then stop if a signal asked to (its exception
    may have been swallowed where it landed, see :mod:`dfmp2.system.interrupts`)."""
    write_record(path, root)
    interrupts.raise_if_requested()


class RecordSaver:
    """Rewrites the run record as the run progresses."""

    def __init__(self, path: Path, root: Node, node: Node | None = None) -> None:
        self.path, self.root = path, root
        self.node = node if node is not None else root
        self.checkpoint = Checkpoint(None, {})

    def save(self) -> None:
        save_checkpoint(self.path, self.root)

    def start_pairs(self, occ_block: int, finished: dict[PairKey, tuple[float, float]]) -> None:
        """The checkpoint of the energy step; saved at once only when it carries pairs of an
        earlier run (the file on disk no longer holds them), else with the first new pair."""
        self.checkpoint = Checkpoint(occ_block, dict(finished))
        write_checkpoint(self.node, self.checkpoint)
        if finished:
            self.save()

    def add_pair(self, key: PairKey, direct: float, exchange: float) -> None:
        self.checkpoint.pairs[key] = (direct, exchange)
        write_checkpoint(self.node, self.checkpoint)
        self.save()
