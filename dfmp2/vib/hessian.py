"""The points of a finite-difference Hessian: each one a relaxed analytic gradient and dipole
at one geometry, dealt out over the ranks of a world.

Each rank computes whole gradients alone (a world of one: no collective inside a gradient),
the ranks taking the pending points in rounds of one point each; after every round the
finished points are gathered, so rank 0 can save them in the record before the next round.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dfmp2.df.store import ScratchArea
from dfmp2.errors import Dfmp2Error, Interrupted, RunFailure
from dfmp2.grad.kernel import GradientResult
from dfmp2.input.calculation import Calculation
from dfmp2.input.settings import RunSettings
from dfmp2.jobs.optimize import geometry_at, job_scf, scf_and_gradient
from dfmp2.jobs.preamble import Job
from dfmp2.jobs.stages import double_hybrid_section, method_name, mp2_section
from dfmp2.mp2.pairs import Mp2Energies
from dfmp2.records.frequencies_section import Point, ReferenceSections
from dfmp2.records.ledger import absorb_ledger, hand_over_ledger
from dfmp2.records.sections import GradientSection, ScfSection
from dfmp2.scf.reference import ScfResult
from dfmp2.system.distributed import World
from dfmp2.system.progress import Progress
from dfmp2.vib.dipole import dipole_moment
from dfmp2.vib.displacements import REFERENCE_POINT
from kernels.interface import KernelSet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finished:
    """A computed point, with the record's sections of the calculation when it is the input
    geometry."""

    point: Point
    reference: ReferenceSections | None = None


def reference_sections(calc: Calculation, settings: RunSettings, scf: ScfResult,
                       result: GradientResult) -> ReferenceSections:
    """The input geometry's SCF, MP2 energies and gradient as ``dfmp2 gradient`` records them."""
    response = result.response
    section = GradientSection(method_name(calc, settings), result.e_tot, *result.scales,
                              result.jk_builds,
                              tensors="scratch" if result.out_of_core else "memory",
                              response_solver=response.solver,
                              response_iterations=response.iterations,
                              response_residual=response.residual)
    energies = Mp2Energies(result.e_os, result.e_ss)
    return ReferenceSections(scf.section, scf.orbitals,
                             mp2_section(energies, result.e_scf, settings),
                             section, np.asarray(result.gradient),
                             None if calc.functional is None else
                             double_hybrid_section(calc, scf, energies))


def _where(index: int) -> str:
    return "the input geometry" if index == REFERENCE_POINT else f"displaced geometry {index}"


class PointEvaluator:
    """The optimiser's SCF and relaxed gradient at a geometry
    (:func:`dfmp2.jobs.optimize.scf_and_gradient`, from a given density), keeping what
    frequencies need beside the energy and gradient: the relaxed density's dipole, and at the
    input geometry the SCF for the record. Every SCF starts from one density, the input geometry's
    (:meth:`start_from`), not from the previous point's as in an optimisation: a point is then
    the same whichever rank computes it, in whichever order, resumed or not, while an SCF
    0.005 Bohr away still converges in a few cycles."""

    def __init__(self, job: Job, scratch: ScratchArea) -> None:
        self.job, self.scratch = job, scratch
        self.density: np.ndarray | None = None
        self.start: ScfSection | None = None

    def _calculation(self, coords: np.ndarray) -> Calculation:
        settings = self.job.settings
        return self.job.calculation(settings.charge, settings.spin,
                                    geometry=geometry_at(self.job.geometry, coords))

    def start_from(self, coords: np.ndarray) -> None:
        """Converge the SCF at ``coords`` (the input geometry) for the first guess of every
        later SCF."""
        scf = job_scf(self.job, self._calculation(coords), self.scratch, self.density,
                      keep_integrals=False)
        if not scf.converged:
            raise RunFailure("the SCF did not converge at the input geometry")
        self.density, self.start = scf.mf.make_rdm1(), scf.section

    def evaluate(self, index: int, coords: np.ndarray) -> Finished:
        settings = self.job.settings
        calc = self._calculation(coords)
        scf, result = scf_and_gradient(self.job, calc, self.scratch, self.density,
                                       _where(index), self.start)
        if not np.all(np.isfinite(result.gradient)):
            raise RunFailure(f"the {method_name(calc, settings)} gradient overflowed to "
                             f"non-finite numbers at {_where(index)}")
        dipole = dipole_moment(calc.mol, sum(result.relaxed_densities))
        point = Point(index, np.asarray(coords, dtype=float), float(result.e_tot),
                      np.asarray(result.gradient), dipole)
        log.info("point %d: E = %.10f Eh, dipole %s a.u.", index, point.energy,
                 np.array2string(dipole, precision=6))
        if index == REFERENCE_POINT:
            return Finished(point, reference_sections(calc, settings, scf, result))
        return Finished(point)


def compute_points(pending: list[int], evaluate: Callable[[int], Finished], world: World,
                   keep: Callable[[list[Finished]], None], progress: Progress,
                   kernel_sets: Sequence[KernelSet]) -> None:
    """Compute the ``pending`` points, each rank one point per round; after each round every
    rank hands the finished ones to ``keep`` (rank 0 saves them), and rank 0's ``kernel_sets``
    (the MP2 stage's and the SCF's) take the kernel calls and NKI launches the other ranks
    made for them: a job that fails, or is stopped, after a round counts the calls behind
    every point it kept.
    A point that fails on one rank fails the job on every rank, after the points that did
    finish are kept."""
    for start in range(0, len(pending), world.size):
        batch = pending[start:start + world.size]
        mine, failure = None, None
        if world.rank < len(batch):
            try:
                mine = evaluate(batch[world.rank])
            except Interrupted:
                raise
            except Dfmp2Error as exc:
                if world.size == 1:
                    raise
                failure = exc
        calls = None if world.is_root else [hand_over_ledger(ks) for ks in kernel_sets]
        # A round's points take the same time on every rank but the last round's, where a
        # rank with no point waits a whole point's time: longer than DFMP2_DIST_TIMEOUT, a
        # collective's wait failed every such job at its end (and its every resume).
        shared = world.gather_when_all_arrive(
            (mine, None if failure is None else str(failure), calls),
            "gathering the displaced gradients")
        if world.is_root:
            for _, _, handed in shared[1:]:
                for kernel_set, share in zip(kernel_sets, handed):
                    absorb_ledger(kernel_set, share)
        finished = [done for done, _, _ in shared if done is not None]
        if finished:
            keep(finished)
        progress.advance(len(finished))
        if failure is not None:
            raise failure
        for rank, (_, message, _) in enumerate(shared):
            if message is not None:
                raise RunFailure(f"rank {rank}: {message}")
