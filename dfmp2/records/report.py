"""Readable views of a run record: the summary `run` and `show` print, the `--json` object,
and a dump of everything."""
from __future__ import annotations

import math

import numpy as np

from dfmp2.input.xyz import parse_xyz
from dfmp2.mp2.methods import SCS_OS_DEFAULT, SCS_SS_DEFAULT
from dfmp2.records.sections import (CalculationInputs, CheckSection, DoubleHybridSection,
                                    Mp2Section, ScfSection, Sizes, read_gradient, read_inputs,
                                    read_timings, text_list)
from dfmp2.records.ledger import executors_of, fallbacks_of, read_kernel_ledger
from dfmp2.records.properties_section import PropertiesSection, properties_lines
from dfmp2.records.frequencies_section import FrequenciesSection, frequency_lines
from dfmp2.records.tree import FREQUENCIES_SCHEMA, Node, error, schema, status
from dfmp2.scf.reference import UNSTABLE_BELOW
from dfmp2.scf.spin import exact_spin_square, spin_contaminated
from dfmp2.system.files import printable

TIMING_ORDER = ("scf", "metric", "integrals", "transform", "fit", "energy", "mp2", "gradient",
                "properties", "reference", "total")


def _energy_rows(scf: ScfSection | None, energies: Mp2Section | None,
                 double_hybrid: DoubleHybridSection | None) -> list[tuple[str, float]]:
    """The energies a run made. A double hybrid's are E_KS, the unscaled MP2 parts on its
    orbitals, the scaled sum, its dispersion (when it has one) and its total: SCS and SOS sums
    of Kohn-Sham orbitals are not methods, so they are not shown."""
    if double_hybrid is not None and energies is not None:
        dispersion = [("E_disp", double_hybrid.e_disp)] if double_hybrid.dispersion else []
        return [("E(KS)", double_hybrid.e_ks), ("E_OS", energies.e_os),
                ("E_SS", energies.e_ss), ("E_corr", energies.e_corr),
                ("E_PT2", double_hybrid.e_pt2), *dispersion, ("E_tot", double_hybrid.e_tot)]
    rows = []
    if scf is not None:
        rows.append(("E(SCF)", scf.e_tot))
    if energies is not None:
        rows += [("E_OS", energies.e_os), ("E_SS", energies.e_ss), ("E_corr", energies.e_corr),
                 ("E_SCS", energies.e_scs), ("E_SOS", energies.e_sos),
                 ("E_tot", energies.e_tot), ("E_tot(SCS)", energies.e_tot_scs),
                 ("E_tot(SOS)", energies.e_tot_sos)]
    return rows


def heading(root: Node, kind: str, described: str | None) -> list[str]:
    """The first lines of ``dfmp2 show``: the kind of record and how it ended, what it
    computed (``described``), and its error if it failed."""
    lines = [f"dfmp2 {kind} record: status {status(root)}"]
    # Each is one line: a newline in a file name must not forge another.
    if described is not None:
        lines.append(f"  {printable(described, one_line=True)}")
    if error(root):
        lines.append(f"  error    {printable(error(root), one_line=True)}")
    return lines


def summary(root: Node) -> str:
    inputs = read_inputs(root)
    kind = "frequencies" if schema(root) == FREQUENCIES_SCHEMA else "run"
    lines = [f"dfmp2 {kind} record: status {status(root)}"]
    if inputs is not None:
        lines.append(printable(f"  molecule {inputs.source}  basis {inputs.basis}  "
                               f"auxbasis {inputs.auxbasis}  charge {inputs.charge}  "
                               f"spin {inputs.spin}  frozen {inputs.frozen}", one_line=True))
        if inputs.ecp not in ("{}", ""):
            lines.append(f"  ECP      {inputs.ecp}")
        if inputs.ghost_atoms not in ("[]", ""):
            lines.append(f"  ghosts   atoms {inputs.ghost_atoms} (from 0): basis functions, "
                         "no charge")
    double_hybrid = DoubleHybridSection.read(root)
    if double_hybrid is not None:
        lines.append(f"  xc       {double_hybrid.name}: {double_hybrid.xc}; MP2 scales "
                     f"{double_hybrid.os_scale:g} OS, {double_hybrid.ss_scale:g} SS; grid level "
                     f"{double_hybrid.grid_level} ({double_hybrid.grid_points} points)")
        if double_hybrid.dispersion:
            lines.append(f"  disp     {double_hybrid.dispersion}")
    sizes = Sizes.read(root)
    if sizes is not None:
        lines.append(f"  sizes    nao {sizes.nao}  naux {sizes.naux}  nocc {sizes.nocc}  "
                     f"nvir {sizes.nvir}  nfrozen {sizes.nfrozen}")
    scf = ScfSection.read(root)
    if scf is not None and inputs is not None and scf.reference == "uhf" and not math.isnan(
            scf.s2):
        lines.append(f"  <S^2>    {scf.s2:.4f} (S(S+1) = {exact_spin_square(inputs.spin):.4f})")
    distributed = root.groups.get("distributed")
    if distributed is not None:
        lines.append(f"  ranks    {distributed.attrs.get('world_size')} "
                     f"({distributed.attrs.get('backend')}; per rank: show --all, /distributed)")
    ledger = read_kernel_ledger(root)
    if ledger is not None:
        lines.append(f"  backend  {ledger.backend} {ledger.precision} on {ledger.device}"
                     f"  fused_energy {ledger.fused_energy}  fallbacks {fallbacks_of(root)}")
        if ledger.calls:
            lines.append("  calls    " + ", ".join(f"{k}={v}" for k, v in ledger.calls.items()))
        if ledger.signatures is not None:
            lines.append(f"  NKI      mode {ledger.nki_mode}  distinct signatures "
                         f"{ledger.signatures}")
        if ledger.estimate:
            lines.append(f"  {ledger.estimate.get('label', 'estimate')}: "
                         f"{ledger.estimate.get('overlapped_seconds', float('nan')):.3e} s")
    if error(root):
        lines.append(f"  error    {printable(error(root), one_line=True)}")
    lines += [printable(f"  Warning: {warning}", one_line=True)
              for warning in basis_warnings(inputs)]
    if scf is not None and not scf.converged:
        # An older record has no orbital gradient (NaN).
        gradient = ("" if math.isnan(scf.orbital_gradient)
                    else f"orbital gradient {scf.orbital_gradient:.1e} ")
        lines.append(f"  Warning: the SCF did not converge ({gradient}after {scf.cycles} "
                     "cycles); these energies are of an unconverged reference")
    if scf is not None and scf.stability == "unstable":
        lines.append(f"  Warning: the {scf.reference.upper()} reference is internally unstable "
                     f"(lowest orbital-Hessian eigenvalue {scf.stability_eigenvalue:.4g}); a "
                     "lower SCF solution exists and MP2 on this one is questionable"
                     + ("" if scf.instabilities_followed else
                        "; --follow-instability converges to it"))
    if scf is not None and scf.stability == "undecided":
        lines.append(_undecided_line(scf))
    if scf is not None and scf.unpairing_eigenvalue < UNSTABLE_BELOW:
        lines.append(f"  Warning: the {scf.reference.upper()} reference is unstable toward an "
                     f"unrestricted one (lowest orbital-Hessian eigenvalue "
                     f"{scf.unpairing_eigenvalue:.4g} for rotations that turn alpha and beta "
                     "apart); a lower unrestricted solution exists and MP2 on this one is "
                     "questionable; --reference uhf --follow-instability converges to it")
    if scf is not None and inputs is not None and spin_contaminated(scf.s2, inputs.spin):
        lines.append(f"  Warning: the {scf.reference.upper()} reference is spin-contaminated "
                     f"(<S^2> {scf.s2:.4f} against S(S+1) = "
                     f"{exact_spin_square(inputs.spin):.4f}); MP2 on it is questionable")
    if scf is not None and scf.instabilities_followed:
        lines.append(f"  Note: the SCF followed {scf.instabilities_followed} "
                     f"instabilit{'y' if scf.instabilities_followed == 1 else 'ies'} down to "
                     f"this {scf.stability} solution (--follow-instability)")
    if scf is not None and scf.settled:
        lines.append(f"  Note: the SCF settled at an orbital gradient of "
                     f"{scf.orbital_gradient:.1e}, where it stalled short of its threshold")
        if "gradient" in root.groups:
            # NO2's followed UHF in 6-31G settles at 5.5e-8: its MP2 gradient differs from
            # central differences by 1.6e-5 Eh/Bohr, against 5e-7 on a converged SCF.
            lines.append("  Note: an analytic gradient assumes a stationary SCF, so this one "
                         "is less accurate than usual (NO2's: 1.6e-5 Eh/Bohr at an orbital "
                         "gradient of 5.5e-8); check it against central differences")
    if scf is not None and scf.removed_combinations:
        removed = scf.removed_combinations
        lines.append(f"  Note: the basis is nearly linearly dependent: {removed} "
                     f"combination{'' if removed == 1 else 's'} of its functions (the overlap's "
                     "eigenvectors below PySCF's threshold) "
                     f"{'is' if removed == 1 else 'are'} left out of the orbitals, as PySCF "
                     "leaves them out")
        if "gradient" in root.groups:
            lines.append("  Note: the analytic gradient takes the combinations left out as "
                         "fixed while they move with the atoms, so it is not exactly the "
                         "energy's derivative")
    lines.append("")
    energies = Mp2Section.read(root)
    for label, value in _energy_rows(scf, energies, double_hybrid):
        lines.append(f"  {label:<10} {value:20.10f} Eh")
    if (double_hybrid is None and energies is not None
            and (energies.scs_os_scale, energies.scs_ss_scale)
            != (SCS_OS_DEFAULT, SCS_SS_DEFAULT)):
        lines.append(f"  (SCS with os {energies.scs_os_scale:g}, ss {energies.scs_ss_scale:g}, "
                     f"not Grimme's {SCS_OS_DEFAULT:g}, 1/3)")
    check = CheckSection.read(root)
    if check is not None:
        lines.append(_check_line(check))
    gradient = read_gradient(root)
    if gradient is not None:
        lines += ["", *gradient_table(root, *gradient)]
    if PropertiesSection.group_name in root.groups:
        lines += ["", *properties_lines(root, _symbols(root))]
    if FrequenciesSection.group_name in root.groups:
        lines += ["", *frequency_lines(root)]
    timings = read_timings(root)
    if timings:
        lines.append("")
        parts = [f"{k} {timings[k]:.2f}s" for k in TIMING_ORDER if k in timings]
        lines.append("  timings  " + "  ".join(parts))
    return "\n".join(lines)


def basis_warnings(inputs: CalculationInputs | None) -> list[str]:
    """The warnings on the bases a record's run gave (none in an older record)."""
    if inputs is None or inputs.basis_warnings is None:
        return []
    return text_list(inputs.basis_warnings, "/input basis_warnings",
                     "the list of warnings dfmp2 writes")


def _check_line(check: CheckSection) -> str:
    verdict = "PASS" if check.passed else "FAIL"
    if check.delta_e_tot is None:
        return (f"  PySCF DFMP2 E_corr {check.e_corr:.10f} Eh   dE = {check.delta_e_corr:.2e} Eh "
                f"(tolerance {check.tolerance:.0e}): {verdict}")
    return (f"  PySCF recipe E_tot {check.e_tot:.10f} Eh   dE_tot = {check.delta_e_tot:.2e} Eh, "
            f"dE_corr = {check.delta_e_corr:.2e} Eh (tolerance {check.tolerance:.0e}): "
            f"{verdict}")


def _symbols(root: Node, natoms: int = 0) -> list[str]:
    """The atoms' symbols from the record's input, or blanks without one."""
    inputs = read_inputs(root)
    return (list(parse_xyz(inputs.xyz, inputs.source).symbols) if inputs is not None
            else [""] * natoms)


def gradient_table(root: Node, section, gradient: np.ndarray) -> list[str]:
    symbols = _symbols(root, len(gradient))
    lines = [f"  {section.method.upper()} energy {section.e_tot:.10f} Eh; gradient dE/dR in "
             f"{section.units}:",
             f"  {'atom':>6} {'x':>16} {'y':>16} {'z':>16}"]
    for number, (symbol, row) in enumerate(zip(symbols, gradient), start=1):
        lines.append(f"  {number:>3} {symbol:<2} {row[0]:16.10f} {row[1]:16.10f} "
                     f"{row[2]:16.10f}")
    return lines


def reference_trust(scf: ScfSection) -> dict:
    """The ``--json`` keys that say how far the reference can be trusted: its stability, the
    lowest orbital-Hessian eigenvalue and <S^2> (None where JSON would need a NaN: an
    unchecked reference has no eigenvalue, an older record no <S^2>)."""
    return {"stability": scf.stability,
            "stability_eigenvalue": (None if np.isnan(scf.stability_eigenvalue)
                                     else scf.stability_eigenvalue),
            "s2": None if np.isnan(scf.s2) else scf.s2}


def json_summary(root: Node, path: str) -> dict:
    """The ``--json`` object of ``dfmp2 run``."""
    energies, scf = Mp2Section.read(root), ScfSection.read(root)
    ledger = read_kernel_ledger(root)
    summary = {"e_scf": scf.e_tot, "e_corr": energies.e_corr, "e_os": energies.e_os,
               "e_ss": energies.e_ss, "e_scs": energies.e_scs, "e_sos": energies.e_sos,
               "e_tot": energies.e_tot, "record": path, "status": status(root),
               "backend": ledger.backend, "precision": ledger.precision,
               "executors": executors_of(root),
               "fallbacks": fallbacks_of(root), "scf_converged": scf.converged,
               # JSON has no NaN: an older record has no orbital gradient.
               "orbital_gradient": (None if np.isnan(scf.orbital_gradient)
                                    else scf.orbital_gradient),
               "scf_settled": scf.settled, **reference_trust(scf),
               "unpairing_eigenvalue": (None if np.isnan(scf.unpairing_eigenvalue)
                                        else scf.unpairing_eigenvalue),
               "instabilities_followed": scf.instabilities_followed,
               "removed_combinations": scf.removed_combinations,
               # What was computed, beside its energies (e_scs is of these scales).
               "scs_os": energies.scs_os_scale, "scs_ss": energies.scs_ss_scale}
    inputs = read_inputs(root)
    if inputs is not None:
        summary.update({"basis": inputs.basis, "charge": inputs.charge, "spin": inputs.spin,
                        "frozen": inputs.frozen, "reference": inputs.reference,
                        "basis_warnings": basis_warnings(inputs)})
    double_hybrid = DoubleHybridSection.read(root)
    if double_hybrid is not None:
        for key in ("e_scs", "e_sos", "scs_os", "scs_ss"):
            del summary[key]
        summary.update({"xc": double_hybrid.name, "xc_functional": double_hybrid.xc,
                        "mp2_os": double_hybrid.os_scale, "mp2_ss": double_hybrid.ss_scale,
                        "grid_level": double_hybrid.grid_level,
                        "grid_points": double_hybrid.grid_points,
                        "e_pt2": double_hybrid.e_pt2, "e_disp": double_hybrid.e_disp,
                        "dispersion": double_hybrid.dispersion or None,
                        "e_tot": double_hybrid.e_tot})
    check = CheckSection.read(root)
    if check is not None:
        summary.update({"reference_e_corr": check.e_corr, "delta_e_corr": check.delta_e_corr,
                        "check_passed": check.passed})
        if check.delta_e_tot is not None:
            summary.update({"reference_e_tot": check.e_tot, "delta_e_tot": check.delta_e_tot})
    gradient = read_gradient(root)
    if gradient is not None:
        section, values = gradient
        summary.update({"method": section.method, "e_tot": section.e_tot,
                        "gradient": np.asarray(values).tolist(), "units": section.units})
    return summary


def method_energy(root: Node, method: str) -> float:
    """The total energy of ``method`` (mp2, scs-mp2, sos-mp2, or the run's double hybrid) in a
    complete record: a gradient record's own energy, else the matching sum."""
    gradient = read_gradient(root)
    if gradient is not None:
        return gradient[0].e_tot
    double_hybrid = DoubleHybridSection.read(root)
    if double_hybrid is not None:
        return double_hybrid.e_tot
    energies = Mp2Section.read(root)
    return {"mp2": energies.e_tot, "scs-mp2": energies.e_tot_scs,
            "sos-mp2": energies.e_tot_sos}[method.strip().lower()]


def _format_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def dump(root: Node, indent: str = "") -> str:
    """Every group, attribute and dataset of a record (datasets by shape, small ones inline)."""
    lines = []
    for key, value in sorted(root.attrs.items()):
        if key == "xyz":
            value = value.strip().replace("\n", " | ")
        lines.append(f"{indent}{key} = {_format_value(value)}")
    for key, array in sorted(root.datasets.items()):
        array = np.asarray(array)
        shown = np.array2string(array, precision=6, threshold=8) if array.size <= 8 else ""
        lines.append(f"{indent}{key}: dataset {array.dtype} {array.shape} {shown}".rstrip())
    for key, child in sorted(root.groups.items()):
        lines.append(f"{indent}/{key}")
        lines.append(dump(child, indent + "  "))
    return "\n".join(line for line in lines if line)


def _undecided_line(scf: ScfSection) -> str:
    """The warning of a stability check that did not converge. An unrestricted solution
    that the other check proved (stretched H2) is no longer in doubt, and an open shell has
    no check toward unrestricted (its value is NaN)."""
    name = scf.reference.upper()
    values = f"eigenvalue so far: internal {scf.stability_eigenvalue:.4g}"
    if not math.isnan(scf.unpairing_eigenvalue):
        values = (f"eigenvalues so far: internal {scf.stability_eigenvalue:.4g}, toward "
                  f"unrestricted {scf.unpairing_eigenvalue:.4g}")
    unknown = (f"a lower {name}" if scf.unpairing_eigenvalue < UNSTABLE_BELOW
               else "a lower SCF")
    return (f"  Warning: the check of the {name} reference's stability did not converge "
            f"(lowest orbital-Hessian {values}; an unconverged one is an "
            f"upper bound); whether {unknown} solution exists is not known")
