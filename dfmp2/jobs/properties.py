"""``dfmp2 properties``: the MP2 one-particle density of one molecule (relaxed by default, the
derivative of the method's energy) and what it gives: dipole, quadrupole, Mulliken and Löwdin
charges, natural orbitals, each beside the SCF density's. Input -> reference -> MP2 density
(the gradient's own stages, without its derivative integrals) -> properties -> record (and a
Molden file of the natural orbitals).

The job runs like ``dfmp2 gradient``: the same preamble, record session (lock, resume of the
SCF, failure states) and stages; with a world of several ranks every rank joins the density,
and rank 0 alone writes the record and the Molden file.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from pyscf.data.nist import BOHR

from dfmp2.errors import InputError, RunFailure
from dfmp2.grad import kernel as gradient
from dfmp2.grad.density import Mp2Densities, mp2_densities
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import MAX_COORDINATE_ANGSTROM, Geometry
from dfmp2.jobs.preamble import active_sizes, make_plan, run_inputs, start_job
from dfmp2.jobs.session import (RecordSession, guarded, same_inputs, settle_superseded,
                                shared_previous_run)
from dfmp2.jobs.stages import (RunContext, check_differentiable, energy_scales, method_name,
                               record_rank_stages, reference_stage, write_energies)
from dfmp2.mp2.pairs import Mp2Energies
from dfmp2.props.analysis import analyse
from dfmp2.props.molden import check_molden_path, write_molden
from dfmp2.props.moments import nuclear_charge_centre
from dfmp2.records.checkpoint import RESUME, RecordSaver
from dfmp2.records.properties_section import PropertiesSection, write_properties
from dfmp2.records.sections import CalculationInputs, write_timings
from dfmp2.records.tree import Node
from dfmp2.scf.reference import ScfResult, release_integrals
from dfmp2.system.distributed import World
from dfmp2.system.files import refuse_overwriting, refuse_record_files

log = logging.getLogger(__name__)
TASK = "properties"
CENTRE = "centre of nuclear charge"
# Orbital-Hessian eigenvalues (Eh) this close to zero leave the response along them to rounding.
NEARLY_FREE_ROTATION = 1e-6


@dataclass(frozen=True)
class PropertiesRequest:
    """Which density (``relaxed`` or not), about which origin (Bohr; None: the centre of
    nuclear charge), and where to write its natural orbitals in Molden format (None: not)."""

    relaxed: bool = True
    origin: np.ndarray | None = None
    molden: Path | None = None


@dataclass
class PropertiesOutcome:
    record: Node
    path: Path
    exit_code: int


def check_request(settings: RunSettings, request: PropertiesRequest) -> None:
    """Refuse, before any work, what the properties cannot do."""
    if request.origin is not None and not (
            np.shape(request.origin) == (3,) and np.all(np.isfinite(request.origin))
            and np.abs(request.origin).max() <= MAX_COORDINATE_ANGSTROM / BOHR):
        raise InputError("the origin must be three finite coordinates x,y,z within "
                         f"{MAX_COORDINATE_ANGSTROM:g} Angstrom")
    if request.molden is not None:
        check_molden_path(Path(request.molden))


def run(settings: RunSettings, request: PropertiesRequest, world: World | None = None,
        geometry: Geometry | None = None,
        ghosts: frozenset[int] = frozenset()) -> PropertiesOutcome:
    """The whole job on the XYZ file of ``settings`` (or ``geometry``, with ``ghosts``); the
    settings' ``task`` is taken to be ``properties``."""
    world = world or World()
    check_request(settings, request)
    # A closed shell's reference is checked as an open shell's always is: a half-filled
    # degenerate pair in an RHF (singlet O2) sets its quadrupole by the guess, and only the
    # orbital Hessian's lowest eigenvalue tells (warn_of_a_free_rotation).
    settings = replace(settings, task=TASK, stability=True)
    job = start_job(settings, settings.output_path(), world, geometry)
    path, env = job.path, job.env
    if request.molden is not None:
        refuse_overwriting(Path(request.molden), "--molden",
                           {"input molecule": settings.molecule, "record": path},
                           "choose another --molden")
        refuse_record_files(Path(request.molden), "--molden", path, "choose another --molden")
    calc = job.calculation(settings.charge, settings.spin, ghosts)
    if request.relaxed:
        check_differentiable(calc)
    plan = make_plan(calc, settings, env)
    sizes = active_sizes(calc)
    gradient.check_budget(max(n for n, _ in sizes), max(v for _, v in sizes),
                          calc.auxbasis_functions(), calc.mol.nao_nr(), env.budget)
    inputs = run_inputs(calc, settings, env)
    asked = same_properties(inputs, method_name(calc, settings), density_kind(request),
                            origin_of(request, calc.mol))
    with RecordSession(path, env) as session:
        # A complete record of other properties (density, origin) is set aside, never
        # resumed in place: that rewrote it.
        previous = shared_previous_run(session, inputs, settings.resume, reuse_complete=False,
                                       same_result=asked)
        root = job.new_record()
        inputs.write(root)
        ctx = RunContext(calc, settings, env, root, session.scratch_area("run"), plan,
                         RecordSaver(path, root) if world.is_root else None,
                         previous.record if previous.action == RESUME else None,
                         outputs=session.outputs)

        def work() -> int:
            if ctx.saver is not None:
                ctx.saver.save()
            properties_stage(ctx, reference_stage(ctx, keep_integrals=True), request)
            record_rank_stages(ctx)
            session.complete(root)
            return 0

        exit_code = guarded(session, root, work)
        if world.is_root:
            settle_superseded(previous.superseded, asked)
    return PropertiesOutcome(root, path, exit_code)


def density_kind(request: PropertiesRequest) -> str:
    return "relaxed" if request.relaxed else "unrelaxed"


def origin_of(request: PropertiesRequest, mol) -> np.ndarray:
    """The origin of the moments (Bohr): the one asked for, else the centre of nuclear
    charge."""
    if request.origin is not None:
        return np.asarray(request.origin, dtype=float)
    return nuclear_charge_centre(mol)


def same_properties(inputs: CalculationInputs, method: str, density: str,
                    origin: np.ndarray) -> Callable[[Node], bool]:
    """Whether a record holds these properties: the same calculation, method, density
    (relaxed or not) and origin."""
    def same(old: Node) -> bool:
        theirs = PropertiesSection.read(old)
        return (same_inputs(inputs)(old) and theirs is not None
                and (theirs.method, theirs.density) == (method, density)
                and np.allclose(theirs.origin, origin, rtol=0.0, atol=1e-12))
    return same


def density_of(ctx: RunContext, scf_result: ScfResult, relaxed: bool) -> Mp2Densities:
    """The MP2 density of the run's method on its SCF, within its budget and ranks."""
    settings, env = ctx.settings, ctx.env
    try:
        return mp2_densities(scf_result.mf, ctx.calc.nfrozen, ctx.calc.auxbasis,
                             env.kernel_set, energy_scales(ctx.calc, settings),
                             settings.occ_block, env.budget, ctx.scratch, env.world, relaxed)
    finally:
        release_integrals(scf_result.mf)


def warn_of_a_free_rotation(scf_result: ScfResult, relaxed: bool) -> None:
    """Along an orbital rotation that costs almost no energy (a half-filled degenerate pair,
    as in a 2Pi radical's UHF) the SCF solution is one of a family: which orbital of the
    pair holds the hole follows the guess and the rounding, and so do the SCF density's and
    the unrelaxed MP2 density's parts along it (OH: the quadrupole's xy block differed from
    PySCF's UHF by 0.43 au, its eigenvalues agreeing). The relaxed density solves the
    orbital response, whose matrix is the orbital Hessian, so along that rotation it is set
    by rounding too (NO: the quadrupole moved by 1e-2 au, a natural occupation by 4e-3, with
    the orbital block size). The dipole and charges do not move."""
    eigenvalue = scf_result.section.stability_eigenvalue
    if abs(eigenvalue) < NEARLY_FREE_ROTATION:
        log.warning("the reference has a nearly free orbital rotation (lowest orbital-Hessian "
                    "eigenvalue %.2g, as for a half-filled degenerate pair): the SCF solution "
                    "along it follows the guess and the rounding%s, so the quadrupole and "
                    "natural orbitals may differ between runs and programs (the dipole and "
                    "charges do not)", eigenvalue,
                    ", and the relaxed density's response is not determined" if relaxed else "")


def properties_stage(ctx: RunContext, scf_result: ScfResult,
                     request: PropertiesRequest) -> None:
    """The density's properties and the SCF density's into the context's node (and the
    natural orbitals into the Molden file, on rank 0)."""
    settings, node, mol = ctx.settings, ctx.node, ctx.calc.mol
    warn_of_a_free_rotation(scf_result, request.relaxed)
    t0 = time.perf_counter()
    densities = density_of(ctx, scf_result, request.relaxed)
    ctx.timings["properties"] = time.perf_counter() - t0
    ctx.timings.update({f"properties_{k}": v for k, v in densities.timings.items()})
    write_timings(node, ctx.timings)
    write_energies(ctx, scf_result, Mp2Energies(densities.e_os, densities.e_ss),
                   densities.e_scf)
    method = method_name(ctx.calc, settings)
    if not all(np.all(np.isfinite(d)) for d in densities.total):
        raise RunFailure(f"the {method} density overflowed to non-finite numbers; "
                         "give --scs-os/--scs-ss values of an ordinary size")
    given = request.origin is not None
    origin = origin_of(request, mol)
    mo_coeff = scf_result.mf.mo_coeff
    mp2 = analyse(mol, densities.total, mo_coeff, origin)
    scf = analyse(mol, densities.scf, mo_coeff, origin)
    molden = ""
    if request.molden is not None and ctx.env.world.is_root:
        staged = write_molden(Path(request.molden), mol, mp2.natural_orbitals,
                              mp2.natural_occupations)
        ctx.outputs.append(staged)
        molden = str(staged.path)
    response = densities.response
    section = PropertiesSection(
        method, density_kind(request),
        densities.e_tot + ctx.calc.e_disp,
        densities.e_scf, origin.tolist(), "given" if given else CENTRE,
        response_solver=response.solver if response else "",
        response_iterations=response.iterations if response else -1,
        response_residual=response.residual if response else float("nan"),
        response_jk_builds=densities.jk_builds, molden=molden)
    write_properties(node, section, mp2, scf, densities.total)
