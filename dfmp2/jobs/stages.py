"""The stages of one calculation, each handed one :class:`RunContext` and returning what it
made: the reference (SCF), the MP2 energy, the gradient. Each writes its sections into the
context's record node; with a saver the record is saved after the SCF and after every block
pair, and the work of an interrupted run (``previous``) is reused instead of recomputed.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np

from dfmp2.df.store import ScratchArea
from kernels.accounting import UNRECORDED_EXECUTOR, KernelAccounting
from dfmp2.errors import RunFailure
from dfmp2.grad import kernel as gradient
from dfmp2.grad.kernel import GradientResult
from dfmp2.grad.kohn_sham import refuse_undifferentiable
from dfmp2.input.calculation import Calculation
from dfmp2.input.dispersion import dispersion_gradient
from dfmp2.input.settings import RunSettings
from dfmp2.jobs.preamble import Environment, make_plan
from dfmp2.mp2 import kernel as mp2
from dfmp2.mp2.methods import SOS_OS_DEFAULT, method_scales
from dfmp2.mp2.pairs import Mp2Energies, PairLedger
from dfmp2.mp2.plan import BlockPlan
from dfmp2.records.checkpoint import RecordSaver, resumable_pairs, stored_occ_block
from dfmp2.records.sections import (DoubleHybridSection, GradientSection, Mp2Section, PlanSection,
                                    ScfEngineSection, Sizes, read_scf, write_distributed,
                                    write_gradient, write_rank_stages, write_scf, write_timings)
from dfmp2.records.ledger import absorb_ledger, hand_over_ledger, stored_calls, write_accounting
from dfmp2.records.tree import Node, set_resumed
from dfmp2.scf.engine import ScfKernels
from dfmp2.scf.reference import (ScfOptions, ScfResult, integrals_released_on_failure,
                                 orbital_problem, release_integrals, restored_scf, run_scf)
from dfmp2.system.memory import peak_resident_megabytes
from dfmp2.system.files import StagedText
from dfmp2.system.interrupts import written_whole

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """What every stage of one calculation is handed: what is computed (``calc``,
    ``settings``), where (``env``, ``scratch``), into which record node (saved by ``saver``
    as it goes), from which interrupted run (``previous``), with the block plan made once
    before the SCF, and the stage timings gathered so far."""

    calc: Calculation
    settings: RunSettings
    env: Environment
    node: Node
    scratch: ScratchArea
    plan: BlockPlan
    saver: RecordSaver | None = None
    previous: Node | None = None
    timings: dict[str, float] = field(default_factory=dict)
    outputs: list[StagedText] = field(default_factory=list)
    """Text files the job writes beside its record, in place once the record is complete
    (its session's :attr:`dfmp2.jobs.session.RecordSession.outputs`)."""


@dataclass(frozen=True)
class CalculationOutcome:
    scf: ScfResult
    mp2: mp2.Mp2Result


def obtain_reference(ctx: RunContext, keep_integrals: bool = False) -> ScfResult:
    """The SCF on every rank: each runs it (with our engine, building J/K together), or
    restores the one an interrupted run stored (read on rank 0, sent to the others). Every
    rank ends with a PySCF object whose orbitals are rank 0's."""
    world, settings = ctx.env.world, ctx.settings
    options = ScfOptions(settings.scf_engine, ctx.env.scf_kernels, ctx.env.budget, ctx.scratch,
                         keep_integrals, stability=settings.stability,
                         follow_instability=settings.follow_instability, world=world)
    stored, problem = None, None
    if world.is_root and ctx.previous is not None:
        stored = read_scf(ctx.previous)
        stored = stored if stored is not None and stored[1] is not None else None
        problem = stored and (orbital_problem(ctx.calc.mol, stored[1])
                              or ("come with a non-finite E(SCF)"
                                  if not math.isfinite(stored[0].e_tot) else None))
        if problem:
            log.warning("the interrupted run's SCF orbitals %s; the calculation starts again, "
                        "without its SCF or finished pairs", problem)
    stored, problem = world.broadcast((stored, problem), "sharing the stored SCF")
    if problem:
        # Its pairs were computed from those orbitals.
        ctx.previous, stored = None, None
    if stored is not None:
        result = restored_scf(ctx.calc, stored[0], stored[1], options)
        carry_scf_ledger(ctx)
    else:
        result = run_scf(ctx.calc, options)
    if world.size == 1:
        return result
    section, orbitals = world.broadcast((result.section, result.orbitals),
                                        "sharing the SCF orbitals")
    if not world.is_root:
        # The ranks' SCFs saw the same J/K bits, so these are normally their own orbitals
        # already; rank 0's are taken whatever happened, so that MP2 and the gradient agree.
        if not np.array_equal(orbitals.mo_coeff, result.orbitals.mo_coeff):
            log.warning("rank %d's SCF orbitals differ from rank 0's; rank 0's are used",
                        world.rank)
        result.mf.mo_coeff, result.mf.mo_energy = orbitals.mo_coeff, orbitals.mo_energy
        result.mf.mo_occ, result.mf.e_tot = orbitals.mo_occ, section.e_tot
        result = ScfResult(section, orbitals, result.mf, result.engine)
    return result


def reference_stage(ctx: RunContext, keep_integrals: bool = False) -> ScfResult:
    """The SCF into the context's node (saved when there is a saver); an unconverged SCF is a
    failure unless allowed."""
    t0 = time.perf_counter()
    scf_result = obtain_reference(ctx, keep_integrals)
    ctx.timings["scf"] = time.perf_counter() - t0
    # Kept for the gradient or density stage, the JK-fit tensor (and its file) goes if the
    # job stops before that stage takes it (a signal while the SCF is saved).
    with integrals_released_on_failure(scf_result.mf):
        _record_reference(ctx, scf_result)
    return scf_result


def _record_reference(ctx: RunContext, scf_result: ScfResult) -> None:
    """The SCF's sections, ledger and timings into the context's node, saved; an unconverged
    SCF is a failure unless allowed."""
    if scf_result.engine is not None:
        ctx.timings["jk_tensor"] = scf_result.engine.tensor_seconds
    set_resumed(ctx.node, ctx.previous is not None)
    write_scf(ctx.node, scf_result.section, scf_result.orbitals)
    if scf_result.engine is not None:
        scf_result.engine.write(ctx.node)
    gather_scf_calls(ctx)
    if ScfEngineSection.group_name in ctx.node.groups:
        write_scf_ledger(ctx.node, ctx.env.scf_kernels)
    write_timings(ctx.node, ctx.timings)
    if ctx.saver is not None and ctx.env.world.is_root:
        ctx.saver.save()
    if not scf_result.converged:
        section = scf_result.section
        if not ctx.settings.allow_unconverged:
            saddle = (" (it stalled on an unstable solution, from which --follow-instability "
                      "goes on to a lower one)" if section.stability == "unstable" else "")
            raise RunFailure(f"the SCF did not converge in {section.cycles} cycles{saddle}; "
                             "rerun with --allow-unconverged to accept it")
        log.warning("the SCF did not converge (orbital gradient %.1e after %d cycles): the "
                    "energies that follow are of an unconverged reference",
                    scf_result.section.orbital_gradient, scf_result.section.cycles)


def gather_scf_calls(ctx: RunContext) -> None:
    """With several ranks, every rank's SCF kernel calls (and NKI launches) into rank 0's
    ledger at the SCF's end (a collective): the record saved there, which a killed job leaves
    for its resume, held rank 0's alone. The other ranks then count afresh, so that their
    calls at the end (the orbital response's) are not counted twice."""
    world, engine = ctx.env.world, ctx.env.scf_kernels.fast
    if world.size == 1:
        return
    handed = world.gather(None if world.is_root else hand_over_ledger(engine),
                          "gathering every rank's SCF kernel calls")
    if world.is_root:
        for share in handed[1:]:
            absorb_ledger(engine, share)


def carry_scf_ledger(ctx: RunContext) -> None:
    """A restored SCF keeps the interrupted run's ``/scf_engine``, its builds' kernels
    included (a resumed record dropped it, and with it the SCF's NKI fallbacks)."""
    if ctx.previous is None or not ctx.env.world.is_root:
        return
    prior = ctx.previous.groups.get(ScfEngineSection.group_name)
    if prior is None:
        return
    ctx.node.groups[ScfEngineSection.group_name] = prior
    stored = stored_calls(ctx.previous, ScfEngineSection.group_name)
    if stored is not None:
        ctx.env.scf_kernels.accounting.absorb(stored)


def carry_ledger(previous: Node, count: int, accounting: KernelAccounting,
                 kernel: str = "mp2_energy") -> None:
    """The kernels of work taken from an earlier record (resumed pairs, a shard's points)
    into this run's ledger: that record's calls and fallbacks, or, when it was killed before
    writing them, ``count`` calls of ``kernel`` on an ``unrecorded`` executor (the ledger said
    everything ran where the resuming run's did, though the killed run's may have fallen back
    to torch)."""
    stored = stored_calls(previous)
    if stored is None or not stored[0]:
        accounting.record(kernel, UNRECORDED_EXECUTOR, count)
        return
    accounting.absorb(stored)
    accounting.holds_earlier_ledger = True
    # A job on several ranks killed before its end gather wrote rank 0's calls alone: the
    # other ranks' finished pairs are counted, as work of no known executor. (A record whose
    # ledger does not count ``kernel`` itself, a frequency job's, is whole.)
    recorded = sum(n for (name, _), n in stored[0].items() if name == kernel)
    if 0 < recorded < count:
        accounting.record(kernel, UNRECORDED_EXECUTOR, count - recorded)


def write_scf_ledger(node: Node, engine_kernels: ScfKernels) -> None:
    """``/scf_engine``'s kernel calls and fallbacks: the J/K engine's builds (the SCF's, and
    at the end the orbital response's)."""
    write_accounting(node, engine_kernels.accounting, engine_kernels.fast.report(),
                     ScfEngineSection.group_name)


def reconciled_plan(ctx: RunContext) -> BlockPlan:
    """The plan made before the SCF, unless an interrupted run's checkpoint used another block
    size and none was asked for: then that size, so that its finished pairs count."""
    stored = stored_occ_block(ctx.previous)
    if ctx.settings.occ_block is None and stored is not None and stored != ctx.plan.occ_block:
        return make_plan(ctx.calc, ctx.settings, ctx.env, stored)
    return ctx.plan


def mp2_stage(ctx: RunContext, scf_result: ScfResult) -> mp2.Mp2Result:
    """The MP2 stage into the context's node, each finished block pair saved when there is a
    saver; rank 0's plan and finished pairs on every rank."""
    world, calc = ctx.env.world, ctx.calc
    t_mp2 = time.perf_counter()
    orbitals = mp2.Orbitals(scf_result.orbitals.mo_energy, scf_result.orbitals.mo_coeff,
                            scf_result.orbitals.mo_occ, calc.nfrozen)
    fit = mp2.fit_basis(calc.mol, calc.auxbasis)
    ctx.timings["metric"] = time.perf_counter() - t_mp2
    shared = None
    if world.is_root:
        plan = reconciled_plan(ctx)
        shared = (plan, resumable_pairs(ctx.previous, plan))
        if shared[1]:
            carry_ledger(ctx.previous, len(shared[1]), ctx.env.kernel_set.accounting)
    plan, finished = world.broadcast(shared, "sharing the block plan")
    # The ledger adds the pairs this run finishes to the same mapping.
    resumed_pairs = len(finished)
    ledger = PairLedger(finished)
    if ctx.saver is not None and world.is_root:
        ctx.saver.start_pairs(plan.occ_block, finished)
        ledger.on_finish = ctx.saver.add_pair
    result = mp2.kernel(calc.mol, orbitals, fit, ctx.env.kernel_set, plan,
                        mp2.Execution(world, ctx.scratch, ledger, ctx.settings.show_progress))
    ctx.timings["mp2"] = time.perf_counter() - t_mp2
    ctx.timings.update(result.timings)
    write_mp2_result(ctx, scf_result, result, resumed_pairs)
    return result


@written_whole
def write_mp2_result(ctx: RunContext, scf_result: ScfResult, result: mp2.Mp2Result,
                     resumed_pairs: int) -> None:
    """The stage's sections; ``resumed_pairs``: block pairs taken from the interrupted run,
    which no rank of this one computed."""
    node, plan = ctx.node, result.plan
    write_timings(node, ctx.timings)
    nocc, nvir = result.nocc, result.nvir
    Sizes(result.nao, result.naux, result.naux_fit, nocc[0], nvir[0], result.nfrozen,
          ctx.calc.mol.natm, *((nocc[1], nvir[1]) if result.open_shell else ())).write(node)
    PlanSection(plan.occ_block, plan.nblocks, plan.out_of_core, plan.b_bytes, plan.energy_bytes,
                plan.build_block_bytes, plan.budget, result.metric_kind).write(node)
    mp2_section(result.energies, scf_result.e_tot, ctx.settings).write(node)
    if ctx.calc.functional is not None:
        double_hybrid_section(ctx.calc, scf_result, result.energies).write(node)
    world = ctx.env.world
    if world.size > 1:
        write_distributed(node, world.size, world.backend, result.ranks, resumed_pairs)


def calculate(ctx: RunContext) -> CalculationOutcome:
    """SCF and DF-MP2 of one calculation into the context's node."""
    scf_result = reference_stage(ctx)
    return CalculationOutcome(scf_result, mp2_stage(ctx, scf_result))


def energy_scales(calc: Calculation, settings: RunSettings) -> tuple[float, float]:
    """(opposite-spin, same-spin) scales of the correlation energy the job computes (and
    differentiates): the double hybrid's with ``--xc``, else the method's."""
    functional = calc.functional
    if functional is not None:
        return functional.os_scale, functional.ss_scale
    return method_scales(settings.method, settings.scs_os, settings.scs_ss)


def method_name(calc: Calculation, settings: RunSettings) -> str:
    """What the job's energy is: the double hybrid's name with ``--xc``, else the method."""
    return settings.method if calc.functional is None else calc.functional.name


def check_differentiable(calc: Calculation) -> None:
    """Refuse, before any work, a double hybrid whose gradient (or relaxed density) is not
    implemented."""
    if calc.functional is not None:
        refuse_undifferentiable(calc.functional.xc, int(calc.mol.spin))


def differentiate(calc: Calculation, settings: RunSettings, env: Environment, mf,
                  scratch: ScratchArea) -> GradientResult:
    """The relaxed gradient of the chosen method (or of the double hybrid, its dispersion
    included) on the converged SCF ``mf``, within the run's memory budget (its large tensors
    in ``scratch`` when they do not fit), spread over the ranks of ``env.world`` (every rank
    calls this with its own ``mf``)."""
    functional = calc.functional
    result = gradient.kernel(mf, calc.nfrozen, calc.auxbasis, calc.jk_auxbasis, env.kernel_set,
                             energy_scales(calc, settings), settings.occ_block, env.budget,
                             scratch, env.world)
    if functional is None or functional.dispersion is None:
        return result
    return dataclasses.replace(
        result, e_tot=result.e_tot + calc.e_disp, e_disp=calc.e_disp,
        gradient=result.gradient + dispersion_gradient(functional.dispersion, calc.mol,
                                                       calc.ghosts))


def gradient_stage(ctx: RunContext, scf_result: ScfResult) -> GradientResult:
    """The relaxed DF-MP2 gradient of the chosen method into the context's node, with the MP2
    energies it computed on the way, and with several ranks each one's share of the amplitude
    sweep in ``/distributed``."""
    settings, node = ctx.settings, ctx.node
    t0 = time.perf_counter()
    try:
        result = differentiate(ctx.calc, settings, ctx.env, scf_result.mf, ctx.scratch)
    finally:
        release_integrals(scf_result.mf)
    ctx.timings["gradient"] = time.perf_counter() - t0
    ctx.timings.update({f"gradient_{k}": v for k, v in result.timings.items()})
    write_timings(node, ctx.timings)
    write_energies(ctx, scf_result, Mp2Energies(result.e_os, result.e_ss), result.e_scf)
    method = method_name(ctx.calc, settings)
    if not np.all(np.isfinite(result.gradient)):
        raise RunFailure(f"the {method} gradient overflowed to non-finite numbers; "
                         "give --scs-os/--scs-ss values of an ordinary size")
    write_gradient(node, GradientSection(method, result.e_tot, *result.scales,
                                         result.jk_builds,
                                         tensors="scratch" if result.out_of_core else "memory",
                                         response_solver=result.response.solver,
                                         response_iterations=result.response.iterations,
                                         response_residual=result.response.residual),
                   result.gradient)
    world = ctx.env.world
    if world.size > 1:
        write_distributed(node, world.size, world.backend, result.ranks)
    return result


def record_rank_stages(ctx: RunContext) -> None:
    """At the calculation's end, ``/scf_engine`` again: its J/K engine's kernel calls now
    include the orbital response's (a gradient's, relaxed properties'), which one process
    recorded nowhere. With several ranks, every rank's seconds per stage and peak memory into
    the context's node, and every rank's kernel calls and fallbacks into rank 0's ledgers (a
    collective: every rank calls it). Rank 0's ledgers alone hid another rank's calls and
    fallbacks."""
    world, env = ctx.env.world, ctx.env
    if world.size == 1:
        if ScfEngineSection.group_name in ctx.node.groups:
            write_scf_ledger(ctx.node, env.scf_kernels)
        return
    ledgers = ((None, None) if world.is_root else
               (hand_over_ledger(env.kernel_set), hand_over_ledger(env.scf_kernels.fast)))
    ranks = world.gather((ctx.timings, peak_resident_megabytes(), *ledgers),
                         "gathering every rank's stage times and kernel calls")
    write_rank_stages(ctx.node, world.size, world.backend, [r[0] for r in ranks],
                      [r[1] for r in ranks])
    if not world.is_root:
        return
    for _, _, mp2_share, scf_share in ranks[1:]:
        absorb_ledger(env.kernel_set, mp2_share)
        absorb_ledger(env.scf_kernels.fast, scf_share)
    if ScfEngineSection.group_name in ctx.node.groups:
        write_scf_ledger(ctx.node, env.scf_kernels)


@written_whole
def write_energies(ctx: RunContext, scf_result: ScfResult, energies: Mp2Energies,
                   e_scf: float) -> None:
    """The MP2 energies of a gradient or density into the context's node, and with ``--xc``
    the double hybrid's."""
    mp2_section(energies, e_scf, ctx.settings).write(ctx.node)
    if ctx.calc.functional is not None:
        double_hybrid_section(ctx.calc, scf_result, energies).write(ctx.node)


def mp2_section(energies: Mp2Energies, e_scf: float, settings: RunSettings) -> Mp2Section:
    """MP2, SCS-MP2 (with its scale factors) and SOS-MP2 (1.3 E_OS)."""
    e_scs = energies.e_scs(settings.scs_os, settings.scs_ss)
    return finite(Mp2Section(energies.e_corr, energies.e_os, energies.e_ss, e_scs,
                             energies.e_sos(), e_scf + energies.e_corr, e_scf + e_scs,
                             e_scf + energies.e_sos(), settings.scs_os, settings.scs_ss,
                             SOS_OS_DEFAULT, **energies.components),
                  "--scs-os/--scs-ss")


def finite(section, scales: str):
    """``section`` when every number in it is finite. Finite options can still overflow in a
    product (``--scs-os 1.7e308``), and neither the record nor ``--json`` can hold the
    result, so it is a failure that names the options to blame."""
    bad = [name for name, value in dataclasses.asdict(section).items()
           if isinstance(value, float) and not math.isfinite(value)]
    if bad:
        raise RunFailure(f"{', '.join(bad)} overflowed to a non-finite number; give {scales} "
                         "values of an ordinary size")
    return section


def double_hybrid_section(calc: Calculation, scf_result: ScfResult,
                          energies: Mp2Energies) -> DoubleHybridSection:
    functional, scf = calc.functional, scf_result.section
    dispersion = functional.dispersion
    return finite(DoubleHybridSection(functional.name, functional.xc, functional.os_scale,
                                      functional.ss_scale, functional.source, scf.grid_level,
                                      scf.grid_points, scf.e_tot,
                                      functional.pt2(energies.e_os, energies.e_ss),
                                      functional.total(scf.e_tot, energies.e_os,
                                                       energies.e_ss, calc.e_disp),
                                      calc.e_disp,
                                      dispersion.describe() if dispersion else ""),
                  "--mp2-os/--mp2-ss")
