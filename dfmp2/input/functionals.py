"""Double-hybrid density functionals: a Kohn-Sham reference, then scaled MP2 on its orbitals.

E = E_KS[xc] + c_os E_OS + c_ss E_SS, where E_KS is the Kohn-Sham energy with the functional's
exchange-correlation mix (its share of exact exchange included) and E_OS, E_SS are the
opposite- and same-spin MP2 correlation energies from the Kohn-Sham orbitals and orbital
energies. The named functionals and their sources are in :data:`NAMED`; any other mix is
given as PySCF's exchange-correlation string with both MP2 scales.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pyscf.dft import libxc

from dfmp2.errors import InputError


@dataclass(frozen=True)
class DoubleHybrid:
    """One double hybrid: its name, PySCF exchange-correlation string and MP2 scales."""

    name: str
    xc: str
    os_scale: float
    ss_scale: float
    source: str = "user-defined"

    def total(self, e_ks: float, e_os: float, e_ss: float) -> float:
        return e_ks + self.pt2(e_os, e_ss)

    def pt2(self, e_os: float, e_ss: float) -> float:
        """The scaled second-order correlation added to the Kohn-Sham energy."""
        return self.os_scale * e_os + self.ss_scale * e_ss


# Libxc components as PySCF names them: B88 = GGA_X_B88, LYP = GGA_C_LYP, MPW91 = GGA_X_MPW91,
# PBE = GGA_X_PBE in the exchange part and GGA_C_PBE in the correlation part, P86 = GGA_C_P86.
NAMED: dict[str, DoubleHybrid] = {
    functional.name: functional for functional in (
        DoubleHybrid("B2PLYP", "0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27,
                     "S. Grimme, J. Chem. Phys. 124, 034108 (2006)"),
        DoubleHybrid("B2GP-PLYP", "0.65*HF + 0.35*B88, 0.64*LYP", 0.36, 0.36,
                     "A. Karton, A. Tarnopolsky, J.-F. Lamere, G. C. Schatz, J. M. L. Martin, "
                     "J. Phys. Chem. A 112, 12868 (2008)"),
        DoubleHybrid("mPW2PLYP", "0.55*HF + 0.45*MPW91, 0.75*LYP", 0.25, 0.25,
                     "T. Schwabe, S. Grimme, Phys. Chem. Chem. Phys. 8, 4398 (2006)"),
        DoubleHybrid("DSD-PBEP86", "0.72*HF + 0.28*PBE, 0.44*P86", 0.51, 0.36,
                     "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013), the fit "
                     "without a dispersion term"),
        DoubleHybrid("PBE0-DH", "0.5*HF + 0.5*PBE, 0.875*PBE", 0.125, 0.125,
                     "E. Bremond, C. Adamo, J. Chem. Phys. 135, 024106 (2011)"),
    )
}
# PySCF's integration grids run from level 0 (coarsest) to 9.
GRID_LEVELS = range(10)


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_KEY = {_key(name): functional for name, functional in NAMED.items()}


def known_names() -> str:
    return ", ".join(NAMED)


def named_functional(name: str) -> DoubleHybrid | None:
    """The named double hybrid, matched without regard to case, hyphens or spaces."""
    return _BY_KEY.get(_key(name))


def resolve_functional(xc: str | None, mp2_os: float | None = None,
                       mp2_ss: float | None = None) -> DoubleHybrid | None:
    """``--xc`` with ``--mp2-os``/``--mp2-ss``: a named double hybrid (whose scales are part of
    its definition), a custom exchange-correlation string with both scales, or None."""
    if xc is None:
        if mp2_os is not None or mp2_ss is not None:
            raise InputError("--mp2-os and --mp2-ss scale the MP2 part of a double hybrid; "
                             "give --xc too")
        return None
    if not xc.strip():
        raise InputError(f"--xc is empty; give a double hybrid ({known_names()}) or an "
                         "exchange-correlation string with --mp2-os and --mp2-ss")
    named = named_functional(xc)
    if named is not None:
        if mp2_os is not None or mp2_ss is not None:
            raise InputError(f"{named.name} fixes its own MP2 scales "
                             f"({named.os_scale} OS, {named.ss_scale} SS); --mp2-os and "
                             "--mp2-ss apply to a custom --xc string")
        return named
    check_xc_string(xc)
    if mp2_os is None or mp2_ss is None:
        raise InputError(f"--xc {xc!r} is not a named double hybrid ({known_names()}); a "
                         "custom exchange-correlation string needs --mp2-os and --mp2-ss")
    return DoubleHybrid(xc.strip(), xc.strip(), float(mp2_os), float(mp2_ss))


def check_xc_string(xc: str) -> None:
    """Refuse what PySCF cannot parse, and range-separated exchange (the J/K engine builds
    full-range exchange only)."""
    try:
        libxc.parse_xc(xc)
        omega = libxc.rsh_coeff(xc)[0]
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        detail = exc.args[0] if exc.args else exc
        raise InputError(f"unknown functional --xc {xc!r} ({detail}); known double hybrids: "
                         f"{known_names()}, or a PySCF exchange-correlation string such as "
                         "'0.53*HF + 0.47*B88, 0.73*LYP' with --mp2-os and --mp2-ss") from None
    if omega:
        raise InputError(f"--xc {xc!r} has range-separated exchange (omega = {omega}), which "
                         "dfmp2 does not build; use a global hybrid mix")


def stored_functional(name: str, xc: str, os_scale: float, ss_scale: float
                      ) -> DoubleHybrid | None:
    """The double hybrid a record describes (its stored string and scales, not today's
    table), or None for a Hartree-Fock reference."""
    if not xc:
        return None
    named = named_functional(name)
    source = named.source if named is not None and named.xc == xc else "user-defined"
    return DoubleHybrid(name, xc, os_scale, ss_scale, source)
