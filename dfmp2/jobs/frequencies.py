"""`dfmp2 frequencies`: harmonic frequencies, IR intensities and thermochemistry from central
differences of the relaxed analytic DF-MP2 (SCS, SOS) gradient and dipole.

The 1 + 6N points (the input geometry, then each Cartesian coordinate moved by +-step; see
:mod:`dfmp2.vib.displacements`) are computed one gradient at a time, every SCF starting from
the input geometry's density, and each is saved in the record as it finishes: a killed run
started again with the same ``-o`` computes only the points it lacks, and gets the Hessian
an uninterrupted run gets. A complete record of the
same inputs gives its points to a new run (another temperature, pressure or Molden file costs
no gradient); another step reuses only the input geometry's point.

Under torchrun the ranks share the points (:func:`dfmp2.vib.hessian.compute_points`). With
``shard=(K, N)`` the job computes only its share (the input geometry and every N-th
displacement from K) into ``<record>.shard-K-of-N.h5``; the run without a shard on the same
``-o`` then takes the points of every shard record of the same inputs it finds beside the
record, computes any still missing, and does the analysis.
"""
from __future__ import annotations

import logging
import math
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from dfmp2.errors import Dfmp2Error, InputError
from dfmp2.grad import kernel as gradient
from dfmp2.input.calculation import Calculation
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import Geometry
from dfmp2.jobs.optimize import SAME_GEOMETRY_BOHR
from dfmp2.jobs.preamble import Environment, Job, active_sizes, run_inputs, start_job
from dfmp2.jobs.session import RecordSession, guarded, same_inputs, settle_superseded
from dfmp2.jobs.stages import (carry_ledger, check_differentiable, energy_scales,
                               method_name)
from dfmp2.records.ledger import executors_of, fallbacks_of, read_kernel_ledger
from dfmp2.records.report import reference_trust
from kernels.accounting import KernelAccounting
from dfmp2.records.checkpoint import (FRESH, RESUME, REUSE, PreviousRun,
                                     complete_copies_beside, examine_previous,
                                     save_checkpoint, set_aside)
from dfmp2.records.frequencies_section import (DisplacementSection, FrequenciesSection, Point,
                                               copy_reference, has_reference, read_points,
                                               write_frequencies, write_points,
                                               write_reference)
from dfmp2.records.sections import (CalculationInputs, ScfSection, read_inputs,
                                     write_rank_stages)
from dfmp2.records.tree import (COMPLETE, FAILED, FREQUENCIES_SCHEMA, Node, read_record,
                                schema, set_resumed, status, write_record)
from dfmp2.scf.reference import check_scf_memory, reference_warned_once
from dfmp2.system.distributed import World
from dfmp2.system.files import StagedText, refuse_overwriting, refuse_record_files
from dfmp2.system.memory import peak_resident_megabytes
from dfmp2.system.progress import Progress
from dfmp2.vib.analysis import (STATIONARY_MAX_GRADIENT, Thermochemistry, Vibrations,
                                harmonic, not_stationary, thermochemistry)
from dfmp2.vib.displacements import (DEFAULT_STEP_BOHR, REFERENCE_POINT, central_differences,
                                     check_step, displaced, hessian_from_gradients,
                                     point_count, shard_points)
from dfmp2.vib.hessian import Finished, PointEvaluator, compute_points
from dfmp2.vib.molden import check_molden_path, molden_text, write_molden

log = logging.getLogger(__name__)

DEFAULT_TEMPERATURE = 298.15
DEFAULT_PRESSURE = 101325.0


@dataclass(frozen=True)
class FrequencyOptions:
    """What `dfmp2 frequencies` adds to a calculation's settings."""

    step: float = DEFAULT_STEP_BOHR
    temperature: float = DEFAULT_TEMPERATURE
    pressure: float = DEFAULT_PRESSURE
    molden: Path | None = None
    shard: tuple[int, int] = (0, 1)

    @property
    def sharded(self) -> bool:
        return self.shard[1] > 1

    def check(self) -> None:
        check_step(self.step)
        for option, value, unit in (("--temperature", self.temperature, "K"),
                                    ("--pressure", self.pressure, "Pa")):
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"{option} {value!r}: give a finite number above 0 ({unit})")
        if self.sharded and self.molden is not None:
            raise InputError("--molden goes with the run that assembles the shards, not with "
                             "--shard")
        if self.molden is not None:
            check_molden_path(self.molden)


@dataclass
class FrequencyOutcome:
    """A finished job: the record, the energy at the input geometry, and (unless the job was
    one shard) the symmetrised Hessian (3N, 3N, Eh/Bohr^2), the modes and thermochemistry."""

    record: Node
    path: Path
    e_tot: float
    options: FrequencyOptions
    points: list[int]
    hessian: np.ndarray | None = None
    vibrations: Vibrations | None = None
    thermochemistry: Thermochemistry | None = None
    outputs: list[StagedText] = field(default_factory=list)
    """The Molden file, in place once the record is complete."""


def shard_record_path(path: Path, shard: tuple[int, int]) -> Path:
    k, n = shard
    return path.with_name(f"{path.stem}.shard-{k}-of-{n}{path.suffix}")


def check_budgets(calc: Calculation, env: Environment) -> None:
    """Refuse, before any SCF, a budget too small for the SCF or the gradient's work blocks."""
    sizes = active_sizes(calc)
    check_scf_memory(calc.mol.nao_nr(), calc.reference, env.budget)
    gradient.check_budget(max(n for n, _ in sizes), max(v for _, v in sizes),
                          calc.auxbasis_functions(), calc.mol.nao_nr(), env.budget)


def displacement_section(calc: Calculation, settings: RunSettings, options: FrequencyOptions,
                         natoms: int) -> DisplacementSection:
    os_scale, ss_scale = energy_scales(calc, settings)
    return DisplacementSection(method_name(calc, settings), os_scale, ss_scale, options.step,
                               point_count(natoms), f"{options.shard[0]}/{options.shard[1]}")


def usable_points(node: Node, expected: DisplacementSection,
                  reference: np.ndarray) -> list[Point]:
    """The points of ``node`` this job can use: computed with the same scales, at the
    geometries its step asks for."""
    stored = read_points(node)
    if stored is None:
        return []
    section, points = stored
    if (section.os_scale, section.ss_scale) != (expected.os_scale, expected.ss_scale):
        return []
    return [p for p in points if 0 <= p.index < expected.points and np.allclose(
        p.coords, displaced(reference, expected.step, p.index), rtol=0.0,
        atol=SAME_GEOMETRY_BOHR)]


def shard_records(path: Path, inputs: CalculationInputs) -> list[tuple[Path, Node]]:
    """The shard records of the same inputs beside ``path`` (``<stem>.shard-K-of-N<suffix>``)."""
    pattern = re.compile(re.escape(path.stem) + r"\.shard-\d+-of-\d+" + re.escape(path.suffix))
    folder = path.parent if str(path.parent) else Path(".")
    found = []
    for candidate in sorted(folder.iterdir()):
        if not pattern.fullmatch(candidate.name):
            continue
        try:
            node = read_record(candidate)
        except Dfmp2Error as exc:
            log.warning("skipping shard record %s: %s", candidate, exc)
            continue
        stored = read_inputs(node)
        if schema(node) == FREQUENCIES_SCHEMA and stored is not None and not stored.differing(
                inputs, CalculationInputs.SCALED_FIELDS):
            found.append((candidate, node))
    return found


def recorded_work(path: Path, main_path: Path, inputs: CalculationInputs,
                  settings: RunSettings, options: FrequencyOptions, expected: DisplacementSection,
                  reference: np.ndarray, accounting: KernelAccounting
                  ) -> tuple[dict[int, Point], Node | None, PreviousRun]:
    """The points this job need not compute (from the record at ``path`` and, unless the job
    is a shard, from the shard records beside ``main_path``), a record holding the input
    geometry's calculation, if one does, and what was at ``path``."""
    # The points are the method's own energies and gradients (its scales and dispersion in).
    previous = examine_previous(path, FREQUENCIES_SCHEMA, inputs, settings.resume, True,
                                CalculationInputs.SCALED_FIELDS)
    record = previous.record if previous.action in (RESUME, REUSE) else None
    if record is not None and _other_displacements(record, expected):
        previous = _displaced_otherwise(path, record, expected)
    sources = [(previous.superseded or path, record)] if record is not None else []
    if not options.sharded:
        sources += shard_records(main_path, inputs)
    points: dict[int, Point] = {}
    holder = None
    for source, node in sources:
        usable = usable_points(node, expected, reference)
        fresh = [p for p in usable if p.index not in points]
        points.update((p.index, p) for p in fresh)
        if fresh:
            carry_ledger(node, len(fresh), accounting, "gradient")
        if holder is None and has_reference(node) and any(
                p.index == REFERENCE_POINT for p in usable):
            holder = node
        if fresh:
            log.info("%d finished points taken from %s", len(fresh), source)
    if REFERENCE_POINT in points and holder is None:
        del points[REFERENCE_POINT]
    return points, holder, previous


def _other_displacements(record: Node, expected: DisplacementSection) -> bool:
    """Whether ``record``'s points were taken with another step or other scales: another
    calculation, though its inputs are the same."""
    stored = read_points(record)
    return stored is not None and (stored[0].step, stored[0].os_scale, stored[0].ss_scale) != (
        expected.step, expected.os_scale, expected.ss_scale)


def _displaced_otherwise(path: Path, record: Node, expected: DisplacementSection
                         ) -> PreviousRun:
    """What becomes of a record of the same inputs whose points are another step's: a
    complete one is set aside (as any complete record of other inputs), an unfinished one is
    refused (its work is not thrown away), a failed one is replaced. Its reference point
    still serves."""
    state = status(record)
    if state == COMPLETE:
        return PreviousRun(FRESH, superseded=set_aside(path, record))
    if state != FAILED:
        stored = read_points(record)[0]
        raise InputError(f"{path} holds an unfinished frequency job of step {stored.step:g} "
                         f"Bohr and MP2 scales {stored.os_scale:g}/{stored.ss_scale:g} (this "
                         f"one: {expected.step:g}, {expected.os_scale:g}/{expected.ss_scale:g}); "
                         "resume it with the same --step and method, or choose another "
                         f"-o{complete_copies_beside(path)}")
    return PreviousRun(FRESH)


def rank_evaluator(job: Job, session: RecordSession) -> PointEvaluator:
    """This rank's evaluator: whole gradients in a world of one, with scratch files of its
    own."""
    own = replace(job, env=replace(job.env, world=World()))
    rank = job.env.world.rank
    return PointEvaluator(own, session.scratch_area("run" if rank == 0 else f"r{rank}"))


def run(settings: RunSettings, options: FrequencyOptions = FrequencyOptions(),
        world: World | None = None, geometry: Geometry | None = None) -> FrequencyOutcome | None:
    """The frequency job of ``settings`` (the molecule is ``geometry`` when given, else the XYZ
    file); the outcome on rank 0, None on the other ranks."""
    options.check()
    world = world or World()
    settings = replace(settings, task="frequencies")
    main_path = settings.output_path("-freq")
    path = shard_record_path(main_path, options.shard) if options.sharded else main_path
    job = start_job(settings, path, world, geometry)
    if options.molden is not None:
        refuse_overwriting(options.molden, "--molden",
                           {"input molecule": settings.molecule, "record": path},
                           "choose another --molden")
        refuse_record_files(options.molden, "--molden", path, "choose another --molden")
    if job.geometry.natoms < 2:
        raise InputError("a single atom has no vibrations; give a molecule of two or more atoms")
    calc = job.calculation(settings.charge, settings.spin)
    check_differentiable(calc)
    check_budgets(calc, job.env)
    inputs = run_inputs(calc, settings, job.env)
    expected = displacement_section(calc, settings, options, job.geometry.natoms)
    reference = np.asarray(calc.mol.atom_coords())
    with RecordSession(path, job.env) as session:
        points, holder, previous = {}, None, PreviousRun(FRESH)
        if world.is_root:
            points, holder, previous = recorded_work(path, main_path, inputs, settings,
                                                     options, expected, reference,
                                                     job.env.kernel_set.accounting)
            session.superseded = previous.superseded
            if previous.action == REUSE:
                # Its points are analysed again (another temperature) in place.
                session.keep_on_failure(previous.record)
        points = world.broadcast(points, "sharing the finished points")
        root = job.new_record(FREQUENCIES_SCHEMA)
        inputs.write(root)
        if holder is not None:
            copy_reference(holder, root)
        set_resumed(root, bool(points))
        write_points(root, expected, list(points.values()))

        def work() -> FrequencyOutcome | None:
            # A complete record analysed again stays on disk until the new one replaces it:
            # a kill in between leaves the complete result, not a running copy without it.
            if world.is_root and previous.action != REUSE:
                write_record(path, root)
            _compute(job, rank_evaluator(job, session), options, points, expected, root,
                     reference)
            if not world.is_root:
                return None
            outcome = FrequencyOutcome(root, path, points[REFERENCE_POINT].energy, options,
                                       sorted(points))
            if not options.sharded:
                _analyse(calc, method_name(calc, settings), points, options, outcome)
            session.outputs += outcome.outputs
            session.complete(root)
            return outcome

        outcome = guarded(session, root, work)
        settle_superseded(previous.superseded, lambda old: same_inputs(inputs)(old)
                          and not _other_displacements(old, expected))
        return outcome


def _compute(job: Job, evaluator: PointEvaluator, options: FrequencyOptions,
             points: dict[int, Point], expected: DisplacementSection, root: Node,
             reference: np.ndarray) -> None:
    """The job's points that ``points`` lacks, each saved in the record (on rank 0) as it
    finishes."""
    world = job.env.world
    pending = [i for i in shard_points(expected.points, options.shard) if i not in points]

    def keep(finished: list[Finished]) -> None:
        points.update((done.point.index, done.point) for done in finished)
        if not world.is_root:
            return
        for done in finished:
            if done.reference is not None:
                write_reference(root, done.reference)
        write_points(root, expected, list(points.values()))
        save_checkpoint(job.path, root)

    show = job.settings.show_progress if world.is_root else False
    progress = Progress(len(pending), "displaced gradients", show)
    mine: list[int] = []
    busy = 0.0

    def evaluate(index: int) -> Finished:
        nonlocal busy
        started = time.perf_counter()
        finished = evaluator.evaluate(index, displaced(reference, options.step, index))
        busy += time.perf_counter() - started
        mine.append(index)
        return finished

    with reference_warned_once():
        if world.rank < len(pending):
            evaluator.start_from(reference)
        compute_points(pending, evaluate, world, keep, progress,
                       [job.env.kernel_set, job.env.scf_kernels.fast])
    if world.size > 1 and pending:
        ranks = world.gather((busy, peak_resident_megabytes(), mine),
                             "gathering every rank's points and seconds")
        write_rank_stages(root, world.size, world.backend,
                          [{"displaced_gradients": rank[0]} for rank in ranks],
                          [rank[1] for rank in ranks], [rank[2] for rank in ranks])


def _analyse(calc: Calculation, method: str, points: dict[int, Point],
             options: FrequencyOptions, outcome: FrequencyOutcome) -> None:
    """The Hessian, modes, IR intensities and thermochemistry from every point, into the
    outcome and its record; the Molden file when asked for."""
    ordered = [points[i] for i in range(point_count(calc.mol.natm))]
    raw = hessian_from_gradients(np.array([p.gradient for p in ordered]), options.step)
    hessian = 0.5 * (raw + raw.T)
    dipole_derivatives = central_differences(np.array([p.dipole for p in ordered]), options.step)
    vibrations = harmonic(calc.mol, hessian, dipole_derivatives)
    thermo = thermochemistry(calc.mol, outcome.e_tot, vibrations, options.temperature,
                             options.pressure)
    max_gradient = float(np.abs(ordered[REFERENCE_POINT].gradient).max())
    _warn(vibrations, max_gradient)
    section = FrequenciesSection(method, outcome.e_tot, options.step, thermo,
                                 vibrations.imaginary, vibrations.linear, vibrations.rigid_modes,
                                 float(np.abs(raw - raw.T).max()), max_gradient,
                                 str(options.molden or ""))
    write_frequencies(outcome.record, section, {
        "hessian": hessian, "frequencies": vibrations.frequencies,
        "ir_intensities": vibrations.ir_intensities, "normal_modes": vibrations.normal_modes,
        "reduced_masses": vibrations.reduced_masses,
        "force_constants": vibrations.force_constants,
        "dipole_derivatives": dipole_derivatives})
    if options.molden is not None:
        outcome.outputs.append(write_molden(options.molden, molden_text(
            calc.geometry.symbols, calc.mol.atom_coords(), vibrations.frequencies,
            vibrations.normal_modes, vibrations.ir_intensities)))
    outcome.hessian, outcome.vibrations, outcome.thermochemistry = hessian, vibrations, thermo


def _warn(vibrations: Vibrations, max_gradient: float) -> None:
    if vibrations.imaginary:
        shown = ", ".join(f"{f:.1f}" for f in vibrations.frequencies[:vibrations.imaginary])
        log.warning("%d imaginary frequenc%s (%s cm^-1, given as negative numbers): the "
                    "geometry is not a minimum", vibrations.imaginary,
                    "y" if vibrations.imaginary == 1 else "ies", shown)
    if max_gradient > STATIONARY_MAX_GRADIENT:
        log.warning(not_stationary(max_gradient))


def hessian(settings: RunSettings, step: float = DEFAULT_STEP_BOHR,
            geometry: Geometry | None = None,
            world: World | None = None) -> tuple[np.ndarray, float] | None:
    """The Hessian and energy of ``settings.method`` (MP2, SCS-MP2, SOS-MP2, or the double
    hybrid of ``settings.xc``) for QCEngine's ``hessian`` driver.

    Returns ``(H, E)``: ``H`` is the (3N, 3N) Cartesian Hessian d2E/dx_i dx_j in Eh/Bohr^2,
    rows and columns in atom order, x, y, z per atom, from central differences of the
    relaxed analytic gradient with ``step`` Bohr, symmetrised, with translations and
    rotations NOT projected out; ``E`` is the method's energy at the geometry (Eh). The
    molecule is ``geometry`` (Angstrom, as :func:`dfmp2.input.xyz.read_xyz` gives it) when
    given, else ``settings.molecule``. The record goes to ``settings.output`` (default
    ``runs/<molecule>-<basis>-freq.h5``) and resumes like `dfmp2 frequencies`. Under a world
    of several ranks every rank calls this; rank 0 gets the result, the others None.
    Bad input raises :class:`dfmp2.errors.InputError`, a failed calculation
    :class:`dfmp2.errors.RunFailure`.
    """
    outcome = run(settings, FrequencyOptions(step=step), world, geometry)
    return None if outcome is None else (outcome.hessian, outcome.e_tot)


def json_summary(outcome: FrequencyOutcome) -> dict:
    """The ``--json`` object: a shard's points, or the frequencies and thermochemistry."""
    ledger = read_kernel_ledger(outcome.record)
    summary = {"e_tot": outcome.e_tot, "record": str(outcome.path), "step": outcome.options.step,
               # Where the gradients' kernels ran, as run's --json says.
               "backend": None if ledger is None else ledger.backend,
               "precision": None if ledger is None else ledger.precision,
               "executors": executors_of(outcome.record),
               "fallbacks": fallbacks_of(outcome.record)}
    # The input geometry's SCF: an unstable or spin-contaminated reference makes every
    # point's numbers questionable, and a script reading the JSON had no way to tell.
    scf = ScfSection.read(outcome.record)
    if scf is not None:
        summary.update(reference_trust(scf))
    if outcome.vibrations is None:
        k, n = outcome.options.shard
        return {**summary, "shard": f"{k}/{n}", "points": outcome.points}
    vibrations, thermo = outcome.vibrations, outcome.thermochemistry
    return {**summary, "frequencies": vibrations.frequencies.tolist(),
            "ir_intensities": vibrations.ir_intensities.tolist(), "zpe": thermo.zpe,
            "enthalpy": thermo.enthalpy, "entropy": thermo.entropy, "gibbs": thermo.gibbs,
            "temperature": thermo.temperature, "pressure": thermo.pressure,
            "symmetry_number": thermo.symmetry_number,
            "imaginary": vibrations.imaginary, "linear": vibrations.linear,
            # Away from a stationary point the frequencies and thermochemistry mean nothing.
            "max_gradient": FrequenciesSection.read(outcome.record).max_gradient,
            "molden": None if outcome.options.molden is None else str(outcome.options.molden)}
