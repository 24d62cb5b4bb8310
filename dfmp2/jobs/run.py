"""``dfmp2 run`` and ``dfmp2 gradient`` (and each molecule of ``dfmp2 batch``): one
calculation from options to record, input -> reference -> plan -> MP2 (or gradient) ->
record.

The record is checkpointed after the SCF and after every block pair, and a run restarted on
the same record skips both. With a world of several ranks, rank 0 alone writes the record.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import Geometry
from dfmp2.jobs.check import run_check
from dfmp2.jobs.preamble import make_plan, run_inputs, start_job
from dfmp2.jobs.session import (RecordSession, guarded, same_inputs, settle_superseded,
                                shared_previous_run)
from dfmp2.jobs.stages import (RunContext, calculate, check_differentiable, gradient_stage,
                               record_rank_stages, reference_stage)
from dfmp2.records.checkpoint import RESUME, REUSE, RecordSaver
from dfmp2.records.ledger import fallbacks_of
from dfmp2.records.sections import ScfSection
from dfmp2.records.tree import Node
from dfmp2.system.distributed import World


@dataclass
class RunOutcome:
    record: Node
    path: Path
    exit_code: int
    reused: bool = False


def holds_stability(record: Node) -> bool:
    """Whether a complete record answers ``--stability``: one made without it is computed
    again (a batch reused it and reported 'not checked')."""
    section = ScfSection.read(record)
    return section is not None and section.stability != "not checked"


def ran_without_fallbacks(record: Node) -> bool:
    """Whether a complete record answers DFMP2_REQUIRE_NKI: one whose kernels fell back to
    torch is computed again (a batch reused it and reported it complete)."""
    return fallbacks_of(record) == 0


def answers_request(settings: RunSettings) -> Callable[[Node], bool] | None:
    """What a complete record of the same inputs must also hold to be reused: the checks
    that options outside the inputs ask for (None: nothing more)."""
    checks = ([holds_stability] if settings.stability else []) + (
        [ran_without_fallbacks] if settings.require_nki else [])
    if not checks:
        return None
    return lambda record: all(check(record) for check in checks)


def run(settings: RunSettings, world: World | None = None, reuse_complete: bool = False,
        geometry: Geometry | None = None, ghosts: frozenset[int] = frozenset()) -> RunOutcome:
    """The whole job. With ``reuse_complete`` a complete record of the same inputs is returned
    as it is (``batch`` reruns). The molecule is ``geometry`` when given (QCSchema, ASE), with
    ``ghosts`` as ghost atoms, else the XYZ file ``settings.molecule``."""
    world = world or World()
    job = start_job(settings, settings.output_path(), world, geometry)
    path, env = job.path, job.env
    calc = job.calculation(settings.charge, settings.spin, ghosts)
    if settings.task == "gradient":
        check_differentiable(calc)
    plan = make_plan(calc, settings, env)
    inputs = run_inputs(calc, settings, env)
    with RecordSession(path, env, same_inputs(inputs)) as session:
        previous = shared_previous_run(session, inputs, settings.resume, reuse_complete,
                                       answers_request(settings))
        if previous.action == REUSE:
            return RunOutcome(previous.record, path, 0, reused=True)
        root = job.new_record()
        inputs.write(root)
        ctx = RunContext(calc, settings, env, root, session.scratch_area("run"), plan,
                         RecordSaver(path, root) if world.is_root else None,
                         previous.record if previous.action == RESUME else None)

        def work() -> int:
            if ctx.saver is not None:
                ctx.saver.save()
            passed = True
            if settings.task == "gradient":
                gradient_stage(ctx, reference_stage(ctx, keep_integrals=True))
                record_rank_stages(ctx)
            else:
                outcome = calculate(ctx)
                # The ranks' last collective comes first: PySCF's check runs on rank 0
                # alone, and the others, waiting for it in a gather, failed the finished job
                # once it took longer than DFMP2_DIST_TIMEOUT (and every resume again).
                record_rank_stages(ctx)
                if settings.check and world.is_root:
                    passed = run_check(calc, outcome, env.kernel_set.precision, root,
                                       settings.follow_instability)
            session.complete(root)
            return 0 if passed else 1

        exit_code = guarded(session, root, work)
        if world.is_root:
            settle_superseded(previous.superseded, same_inputs(inputs))
    return RunOutcome(root, path, exit_code)
