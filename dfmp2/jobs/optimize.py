"""`dfmp2 optimize`: geometry optimisation by geomeTRIC (the optimiser PySCF itself uses) on
our DF-MP2 (SCS, SOS) energy and analytic gradient.

Every step's geometry, energy and gradient go into the record as they finish, so a killed
optimisation resumes: the recorded steps are replayed to geomeTRIC (no calculation repeated)
and the optimisation goes on from there. Each step's SCF starts from the previous step's
density. The final geometry is written as XYZ beside the record.
"""
from __future__ import annotations

import contextlib
import json
import logging
import numbers
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
from pyscf.lib import param

from dfmp2.jobs.preamble import Job, make_plan, run_inputs, start_job
from dfmp2.jobs.session import RecordSession, guarded, same_inputs, settle_superseded
from dfmp2.jobs.stages import check_differentiable, differentiate
from dfmp2.df.store import ScratchArea
from dfmp2.grad.kernel import GradientResult
from dfmp2.input.calculation import Calculation
from dfmp2.records.checkpoint import RESUME, examine_previous, save_checkpoint
from dfmp2.errors import InputError, RunFailure
from dfmp2.records.report import basis_warnings, heading
from dfmp2.records.tree import OPTIMIZE_SCHEMA, Node, read_record, write_record
from dfmp2.records.job_sections import (OptimizationSection, Steps, read_steps, write_optimization,
                                        write_steps)
from dfmp2.records.sections import CalculationInputs, ScfSection, read_inputs, write_timings
from dfmp2.scf.reference import (ScfOptions, ScfResult, reference_warned_once,
                                 release_integrals, run_scf)
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import Geometry
from dfmp2.system import interrupts
from dfmp2.system.files import check_text_output, printable, refuse_overwriting, stage_text

log = logging.getLogger(__name__)

# geomeTRIC's convergence sets (energy Eh, RMS and max gradient Eh/Bohr, RMS and max step
# Angstrom), as geometric/params.py defines them. The step criteria are in Angstrom because
# geomeTRIC measures each atom's displacement in Angstrom (geometric.step.calc_drms_dmax),
# although the sets carry the numbers Gaussian applies in Bohr.
CONVERGENCE_SETS = ("GAU", "GAU_TIGHT", "GAU_VERYTIGHT", "GAU_LOOSE", "NWCHEM_LOOSE",
                    "TURBOMOLE", "INTERFRAG_TIGHT")
DEFAULT_MAX_STEPS = 100
# A double hybrid's gradient leaves out the XC grid's response: about 4e-6 Eh/Bohr against
# central differences on grid level 3, more on coarser grids and with P86's noisier grid.
DOUBLE_HYBRID_GRADIENT_ERROR = 1e-5
# A bound far above any optimisation's need, which the record's integers (int64) hold: a
# --max-steps of 2**64 let the optimisation converge, then failed to record it.
MAX_STEPS_LIMIT = 100_000
# A replayed step matches its record when every coordinate agrees to this (Bohr).
SAME_GEOMETRY_BOHR = 1e-9
# The optimised geometry goes beside the record, as <record>.xyz.
XYZ_REMEDY = "choose another -o"

Evaluation = tuple[float, np.ndarray]
Evaluator = Callable[[Geometry], Evaluation]


def optimised_molecule(start: Geometry, charge: int, multiplicity: int) -> Geometry:
    """``start`` with the comment line its optimised geometries carry: the charge and
    multiplicity the calculation ran with (from the command line or the file) and no units
    (they are written in Angstrom). The input's own comment would turn a ``units=bohr`` file
    into a molecule 0.53 times the size, and lose a --charge or --spin, when read back."""
    return replace(start, comment=f"charge={charge} multiplicity={multiplicity} optimised by "
                                  "dfmp2", charge=charge, multiplicity=multiplicity, unread=())


def geometry_at(start: Geometry, coords_bohr: np.ndarray) -> Geometry:
    """The molecule of ``start`` at other coordinates (Bohr in, Angstrom kept)."""
    coords = np.asarray(coords_bohr, dtype=float).reshape(-1, 3) * param.BOHR
    text = f"{start.natoms}\n{start.comment}\n" + "".join(
        f"{s} {x:.12f} {y:.12f} {z:.12f}\n" for s, (x, y, z) in zip(start.symbols, coords))
    return Geometry(start.symbols, coords, start.comment, start.charge, start.multiplicity,
                    text, start.source)


def job_scf(job: Job, calc: Calculation, scratch: ScratchArea,
            initial_density: np.ndarray | None, keep_integrals: bool) -> ScfResult:
    """Our SCF of ``calc`` with the job's engine, kernels and budget, from ``initial_density``
    (None: PySCF's guess)."""
    settings, env = job.settings, job.env
    return run_scf(calc, ScfOptions(settings.scf_engine, env.scf_kernels, env.budget, scratch,
                                    keep_integrals=keep_integrals,
                                    initial_density=initial_density,
                                    stability=settings.stability,
                                    follow_instability=settings.follow_instability))


def scf_and_gradient(job: Job, calc: Calculation, scratch: ScratchArea,
                     initial_density: np.ndarray | None, where: str,
                     start: ScfSection | None = None) -> tuple[ScfResult, GradientResult]:
    """Our SCF of ``calc`` from ``initial_density``, then the relaxed gradient of the job's
    method on it; an SCF that does not converge fails the run, naming ``where`` (and, when
    the SCF that made ``initial_density``, ``start``, was unstable, the likely cause). The
    SCF's JK-fit integrals are released either way: the gradient was their last use."""
    reference = job_scf(job, calc, scratch, initial_density, keep_integrals=True)
    try:
        if not reference.converged:
            raise RunFailure(f"the SCF did not converge at {where}{unstable_start(start)}")
        result = differentiate(calc, job.settings, job.env, reference.mf, scratch)
    finally:
        release_integrals(reference.mf)
    return reference, result


def unstable_start(start: ScfSection | None) -> str:
    """Why an SCF started from an unstable reference's density may not converge, and the
    remedy; empty when ``start`` was not unstable."""
    if start is None or start.stability != "unstable":
        return ""
    return (f", started from an internally unstable {start.reference.upper()} reference "
            f"(lowest orbital-Hessian eigenvalue {start.stability_eigenvalue:.4g}) that "
            "falls toward its lower solution nearby; rerun with --follow-instability to "
            "work on that solution")


class AnalyticEvaluator:
    """Energy and analytic gradient of the settings' method at a geometry: our SCF (from the
    previous step's density) and the relaxed DF-MP2 gradient."""

    def __init__(self, job: Job, scratch: ScratchArea) -> None:
        self.job, self.scratch = job, scratch
        self.density: np.ndarray | None = None
        self.start: ScfSection | None = None

    def __call__(self, geometry: Geometry) -> Evaluation:
        settings = self.job.settings
        calc = self.job.calculation(settings.charge, settings.spin, geometry=geometry)
        reference, result = scf_and_gradient(self.job, calc, self.scratch, self.density,
                                             "an optimisation step", self.start)
        self.density, self.start = reference.mf.make_rdm1(), reference.section
        return result.e_tot, result.gradient


@dataclass
class StepLog:
    """The steps so far (recorded ones first, on a resume) and how to save a new one."""

    steps: Steps
    on_step: Callable[[Steps], None]
    replayed: int = 0

    def find(self, coords: np.ndarray) -> int | None:
        for n, recorded in enumerate(self.steps.coords):
            if np.allclose(recorded, coords, rtol=0.0, atol=SAME_GEOMETRY_BOHR):
                return n
        return None

    def through(self, coords: np.ndarray) -> Steps:
        """The steps up to the one at ``coords`` (Bohr), which the engine evaluated."""
        last = self.find(coords)
        if last is None:
            raise RuntimeError("the optimiser ended at a geometry it never evaluated")
        return Steps(self.steps.coords[:last + 1], self.steps.energies[:last + 1],
                     self.steps.gradients[:last + 1])

    def add(self, coords: np.ndarray, energy: float, grad: np.ndarray) -> None:
        self.steps = Steps(np.concatenate([self.steps.coords, coords[None]]),
                           np.append(self.steps.energies, energy),
                           np.concatenate([self.steps.gradients, grad[None]]))
        self.on_step(self.steps)


def _engine(start: Geometry, evaluate: Evaluator, steps: StepLog):
    """A geomeTRIC engine whose calculations are ``evaluate`` (or a recorded step)."""
    from geometric.engine import Engine
    from geometric.molecule import Molecule

    class DfMp2Engine(Engine):
        def calc(self, coords, dirname, read_data=False, copydir=None):
            """geomeTRIC's calculation at ``coords``, kept as its own calc keeps it, without
            the folder its calc makes for a program's files: this engine writes none, and a
            killed optimisation left that folder in $TMPDIR."""
            key = hash(coords.tobytes())
            if key not in self.stored_calcs:
                self.stored_calcs[key] = {"coords": coords,
                                          "result": self.calc_new(coords, dirname)}
            return self.stored_calcs[key]["result"]

        def calc_new(self, coords, dirname):
            coords = np.asarray(coords, dtype=float).reshape(-1, 3)
            known = steps.find(coords)
            if known is not None:
                steps.replayed += 1
                energy, grad = steps.steps.energies[known], steps.steps.gradients[known]
            else:
                energy, grad = evaluate(geometry_at(start, coords))
                steps.add(coords, energy, np.asarray(grad))
                log.info("optimisation step %d: E = %.10f Eh, max |g| = %.2e Eh/Bohr",
                         len(steps.steps.energies), energy, np.abs(grad).max())
            return {"energy": float(energy), "gradient": np.asarray(grad).ravel()}

    molecule = Molecule()
    molecule.elem = list(start.symbols)
    molecule.xyzs = [np.asarray(start.coords, dtype=float)]
    return DfMp2Engine(molecule), molecule


@contextlib.contextmanager
def _quiet_geometric():
    """geomeTRIC logs every step at INFO (its modules set their own loggers' levels); ours
    says what matters, so its loggers show warnings only, unless we log at DEBUG."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
               if name == "geometric" or name.startswith("geometric.")]
    levels = [logger.level for logger in loggers]
    if logging.getLogger().level > logging.DEBUG:
        for logger in loggers:
            logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def optimize(start: Geometry, evaluate: Evaluator, steps: StepLog, convergence: str,
             max_steps: int) -> Geometry:
    """Run geomeTRIC from ``start``, at most ``max_steps`` steps beyond those ``steps`` holds
    (a rerun after --max-steps goes on, as the README says, instead of stopping among its
    replayed steps); the converged geometry, or a RunFailure."""
    from geometric.errors import GeomOptNotConvergedError
    from geometric.internal import DelocalizedInternalCoordinates
    from geometric.optimize import Optimize
    from geometric.params import OptParams

    engine, molecule = _engine(start, evaluate, steps)
    # The recorded steps are the starting point and the iterations after it.
    done = max(len(steps.steps.energies) - 1, 0)
    params = OptParams(convergence_set=convergence, maxiter=max_steps + done)
    with _quiet_geometric():
        # Building them logs too (an 'artificial bond' to each isolated atom, at INFO).
        coordinates = DelocalizedInternalCoordinates(molecule, build=True, connect=False,
                                                     addcart=False)
        try:
            # No folder: geomeTRIC hands it to the engine alone (whose calc above makes none)
            # and to Hessian and frequency steps, which these parameters never take.
            progress = Optimize(np.asarray(start.coords).ravel() / param.BOHR, molecule,
                                coordinates, engine, None, params, print_info=False)
        except GeomOptNotConvergedError:
            raise RunFailure(f"the geometry did not converge in {max_steps} steps "
                             f"({convergence} criteria); raise --max-steps or start from a "
                             "better geometry") from None
    return geometry_at(start, np.asarray(progress.xyzs[-1]) / param.BOHR)


def criteria(convergence: str) -> dict[str, float]:
    from geometric.params import OptParams
    params = OptParams(convergence_set=convergence)
    return {"energy": params.Convergence_energy, "grms": params.Convergence_grms,
            "gmax": params.Convergence_gmax, "drms": params.Convergence_drms,
            "dmax": params.Convergence_dmax}


@dataclass
class OptimizeOutcome:
    record: Node
    path: Path
    geometry: Geometry
    xyz_path: Path
    energy: float
    steps: int
    criteria: dict[str, float] = field(default_factory=dict)


def run(settings: RunSettings, convergence: str = "GAU", max_steps: int = DEFAULT_MAX_STEPS,
        evaluator: Evaluator | None = None) -> OptimizeOutcome:
    """Optimise the molecule of ``settings``; ``evaluator`` replaces the analytic gradient
    (tests compare with a finite-difference optimisation this way)."""
    if convergence.upper() not in CONVERGENCE_SETS:
        raise InputError(f"unknown convergence set {convergence!r}; choose one of "
                         f"{', '.join(CONVERGENCE_SETS)}")
    convergence = convergence.upper()
    # numpy's integers are whole numbers too; a bool is not a count.
    if isinstance(max_steps, bool) or not isinstance(max_steps, numbers.Integral) or not (
            1 <= max_steps <= MAX_STEPS_LIMIT):
        raise InputError(f"max_steps {max_steps!r} must be a whole number from 1 to "
                         f"{MAX_STEPS_LIMIT}")
    max_steps = int(max_steps)
    settings = replace(settings, task="optimize", show_progress=False)
    job = start_job(settings, settings.output_path("-opt"))
    path, env, start = job.path, job.env, job.geometry
    if start.natoms < 2:
        raise InputError("an optimisation needs at least two atoms")
    xyz_path = path.with_suffix(".xyz")
    if xyz_path == path:
        raise InputError(f"-o {path} names the record, and the optimised geometry goes beside "
                         "it with the suffix .xyz; give the record another suffix, e.g. "
                         f"-o {path.with_suffix('.h5')}")
    refuse_overwriting(xyz_path, "the optimised geometry's file (beside the record)",
                       {"input molecule": settings.molecule},
                       f"choose another -o (e.g. {path.with_name(path.stem + '-opt.h5')})")
    # Before the record is touched: a refusal after it had set the complete record aside
    # left nothing at -o and did not say where the result went.
    check_text_output(xyz_path, "the optimised geometry's file", XYZ_REMEDY)
    refuse_foreign_geometry(xyz_path, path)
    calc = job.calculation(settings.charge, settings.spin)
    check_differentiable(calc)
    warn_of_unreachable_criteria(calc, convergence)
    start = optimised_molecule(start, int(calc.mol.charge), int(calc.mol.spin) + 1)
    make_plan(calc, settings, env)
    inputs = run_inputs(calc, settings, env)
    def same_optimisation(old: Node) -> bool:
        section = OptimizationSection.read(old)
        return (same_inputs(inputs)(old) and section is not None
                and section.convergence_set == convergence)

    with RecordSession(path, env) as session:
        # The recorded steps are the method's own energies and gradients: only a run of the
        # same scales and dispersion may replay them.
        previous = examine_previous(path, OPTIMIZE_SCHEMA, inputs, settings.resume, False,
                                    CalculationInputs.SCALED_FIELDS, same_optimisation)
        session.superseded = previous.superseded
        moved_geometry = _set_geometry_aside(xyz_path, previous.superseded)
        if moved_geometry is not None:
            session.superseded_outputs.append((moved_geometry, xyz_path))
        recorded = read_steps(previous.record) if previous.action == RESUME else None
        root = job.new_record(OPTIMIZE_SCHEMA)
        inputs.write(root)

        def save(steps: Steps) -> None:
            write_steps(root, steps)
            save_checkpoint(path, root)

        log_steps = StepLog(recorded or Steps.empty(start.natoms), save)
        evaluate = evaluator or AnalyticEvaluator(job, session.scratch_area("opt"))

        def work() -> OptimizeOutcome:
            # The record is the checkpoint: the steps resumed from stay in it until the end.
            if recorded is not None:
                write_steps(root, recorded)
            write_record(path, root)
            t0 = time.perf_counter()
            with reference_warned_once():
                final = optimize(start, evaluate, log_steps, convergence, max_steps)
            # A resume with looser criteria may converge on a replayed step before the
            # recorded last one: the trajectory, and the energy, end at the final geometry.
            steps = log_steps.through(np.asarray(final.coords) / param.BOHR)
            write_steps(root, steps)
            session.outputs.append(stage_text(xyz_path, lambda handle: handle.write(final.text),
                                              XYZ_REMEDY))
            write_timings(root, {"optimize": time.perf_counter() - t0})
            energy = float(steps.energies[-1])
            write_optimization(root, OptimizationSection(
                True, convergence, json.dumps(criteria(convergence)), max_steps,
                len(steps.energies), log_steps.replayed, energy, final.text, str(xyz_path)))
            session.complete(root)
            return OptimizeOutcome(root, path, final, xyz_path, energy, len(steps.energies),
                                   criteria(convergence))

        outcome = guarded(session, root, work)
        # The geometry set aside goes with its record, a signal meanwhile notwithstanding.
        with interrupts.signals_held():
            if settle_superseded(previous.superseded, same_optimisation) and moved_geometry:
                moved_geometry.unlink(missing_ok=True)
        return outcome


def warn_of_unreachable_criteria(calc, convergence: str) -> None:
    """Warn when a double hybrid's gradient is asked for more than it holds: below its
    RMS gradient criterion the left-out grid response decides, and the optimisation wanders
    (water in B2PLYP-D3BJ under GAU_VERYTIGHT: max|g| about 3e-5 until --max-steps)."""
    rms_gradient = criteria(convergence)["grms"]
    if calc.functional is not None and rms_gradient < DOUBLE_HYBRID_GRADIENT_ERROR:
        log.warning("%s asks for an RMS gradient of %g Eh/Bohr, below what a double "
                    "hybrid's gradient holds (it leaves out the XC grid's response, about "
                    "%g Eh/Bohr): the optimisation may wander without converging; use "
                    "GAU_TIGHT or looser", convergence, rms_gradient,
                    DOUBLE_HYBRID_GRADIENT_ERROR)


def refuse_foreign_geometry(xyz_path: Path, path: Path) -> None:
    """Refuse, before any work, a file at the optimised geometry's name that is not the final
    geometry of the complete record at ``path`` (which goes aside with that record): another
    molecule's XYZ file there (``optimize hf.xyz -o water.h5`` beside water.xyz) was replaced
    by the optimised geometry without a word."""
    if not xyz_path.is_file():
        return
    try:
        section = OptimizationSection.read(read_record(path)) if path.is_file() else None
    except InputError:
        section = None
    if (section is not None
            and xyz_path.read_text(encoding="utf-8", errors="replace") == section.final_xyz):
        return
    raise InputError(f"{printable(str(xyz_path), one_line=True)} exists, and the optimised "
                     f"geometry goes there (beside the record, as .xyz), but it is not the "
                     f"final geometry of the record {printable(str(path), one_line=True)}; "
                     "move it away, or choose another -o")


def _set_geometry_aside(xyz_path: Path, superseded: Path | None) -> Path | None:
    """The optimised geometry written beside a complete record goes aside with it (a failed
    rerun of other inputs left it beside the new record, a result that looked current)."""
    if superseded is None or xyz_path.is_symlink() or not xyz_path.is_file():
        return None
    target = superseded.with_suffix(".xyz")
    section = OptimizationSection.read(read_record(superseded))
    if (section is None or target.exists()
            or xyz_path.read_text(encoding="utf-8", errors="replace") != section.final_xyz):
        return None
    os.rename(xyz_path, target)
    log.info("moved %s, the optimised geometry of %s, to %s", xyz_path, superseded, target)
    return target


def json_summary(outcome: OptimizeOutcome) -> dict:
    return {"e_tot": outcome.energy, "steps": outcome.steps, "converged": True,
            "geometry": [[s, *map(float, xyz)] for s, xyz in
                         zip(outcome.geometry.symbols, outcome.geometry.coords)],
            "units": "Angstrom", "criteria": outcome.criteria, "xyz": str(outcome.xyz_path),
            "record": str(outcome.path)}


def format_summary(outcome: OptimizeOutcome) -> str:
    c = outcome.criteria
    lines = [f"optimised in {outcome.steps} steps: E = {outcome.energy:.10f} Eh",
             f"criteria: energy {c['energy']:g} Eh, RMS/max gradient {c['grms']:g}/"
             f"{c['gmax']:g} Eh/Bohr, RMS/max step {c['drms']:g}/{c['dmax']:g} Angstrom",
             "final geometry (Angstrom):"]
    lines += [f"  {s:<2} {x:14.8f} {y:14.8f} {z:14.8f}"
              for s, (x, y, z) in zip(outcome.geometry.symbols, outcome.geometry.coords)]
    lines += [f"\ngeometry written to {printable(str(outcome.xyz_path), one_line=True)}",
              f"record written to {printable(str(outcome.path), one_line=True)}"]
    return "\n".join(lines)


def summary(root: Node) -> str:
    """``dfmp2 show`` of an optimisation record: how it ended, each step's energy and largest
    gradient component, and the final geometry when it converged."""
    inputs = read_inputs(root)
    lines = heading(root, "optimize", None if inputs is None else (
        f"molecule {inputs.source}  basis {inputs.basis}  charge {inputs.charge}  "
        f"spin {inputs.spin}  frozen {inputs.frozen}  method {inputs.xc or inputs.method}"))
    lines += [printable(f"  Warning: {warning}", one_line=True)
              for warning in basis_warnings(inputs)]
    steps = read_steps(root)
    if steps is not None:
        lines += ["", f"  {'step':>4} {'E / Eh':>20} {'max |g| / (Eh/Bohr)':>22}"]
        lines += [f"  {n:>4} {energy:20.10f} {np.abs(gradient).max():22.3e}"
                  for n, (energy, gradient) in enumerate(zip(steps.energies, steps.gradients),
                                                         start=1)]
    section = OptimizationSection.read(root)
    if section is not None and section.converged:
        lines += ["", f"  converged ({section.convergence_set}) in {section.steps} steps: "
                      f"E = {section.e_tot:.10f} Eh; final geometry (Angstrom):"]
        lines += [f"    {line}" for line in section.final_xyz.splitlines()[2:]]
    return "\n".join(lines)
