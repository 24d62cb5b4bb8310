"""Double-hybrid density functionals: a Kohn-Sham reference, then scaled MP2 on its orbitals.

E = E_KS[xc] + c_os E_OS + c_ss E_SS, where E_KS is the Kohn-Sham energy with the functional's
exchange-correlation mix (its share of exact exchange included) and E_OS, E_SS are the
opposite- and same-spin MP2 correlation energies from the Kohn-Sham orbitals and orbital
energies, plus an empirical dispersion term where the functional has one (E_disp, from the
dftd3 or dftd4 library: :mod:`dfmp2.input.dispersion`). The named functionals and their sources
are in :data:`NAMED`; a name followed by -D3BJ, -D3ZERO or -D4 (or ``--dispersion``) adds that
dispersion to a functional without one, with the library's parameters for it. Any other mix
is given as PySCF's exchange-correlation string with both MP2 scales, and has no dispersion.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from pyscf.dft import libxc

try:
    from pyscf.dft.dft_parser import parse_dft
except ImportError:  # PySCF before 2.5 reads no dispersion from an exchange-correlation string
    parse_dft = None

from dfmp2.errors import InputError
from dfmp2.input.dispersion import LABELS, MODELS, NONE, Dispersion, damping

# Published SCS and double-hybrid scales, and the coefficients of an exchange-correlation mix,
# lie between 0 and 2; this bound only stops factors whose products with an energy would be
# meaningless or overflow (1e200*HF ended the SCF in a traceback).
MAX_SCALE_FACTOR = 100.0


@dataclass(frozen=True)
class DoubleHybrid:
    """One double hybrid: its name, PySCF exchange-correlation string and MP2 scales."""

    name: str
    xc: str
    os_scale: float
    ss_scale: float
    source: str = "user-defined"
    dispersion: Dispersion | None = None
    """The dispersion term this functional includes (None: none)."""
    dispersion_method: str | None = None
    """The libraries' name for this exchange-correlation mix and MP2 scales, under which their
    damping parameters are looked up (None: they have none fitted to it)."""

    def total(self, e_ks: float, e_os: float, e_ss: float, e_disp: float = 0.0) -> float:
        return e_ks + self.pt2(e_os, e_ss) + e_disp

    def pt2(self, e_os: float, e_ss: float) -> float:
        """The scaled second-order correlation added to the Kohn-Sham energy."""
        return self.os_scale * e_os + self.ss_scale * e_ss


# Libxc components as PySCF names them: B88 = GGA_X_B88, LYP = GGA_C_LYP, MPW91 = GGA_X_MPW91,
# PBE = GGA_X_PBE in the exchange part and GGA_C_PBE in the correlation part, P86 = GGA_C_P86.
# A -D name takes the damping parameters that dftd3 or dftd4 tabulate under dispersion_method;
# the numbers in its source are those tables' (checked against them in tests/test_dispersion.py).
_GRIMME_2006 = "S. Grimme, J. Chem. Phys. 124, 034108 (2006)"
_KARTON_2008 = ("A. Karton, A. Tarnopolsky, J.-F. Lamere, G. C. Schatz, J. M. L. Martin, "
                "J. Phys. Chem. A 112, 12868 (2008)")
_GOERIGK_2011 = "L. Goerigk, S. Grimme, Phys. Chem. Chem. Phys. 13, 6670 (2011), via dftd3"
NAMED: dict[str, DoubleHybrid] = {
    functional.name: functional for functional in (
        DoubleHybrid("B2PLYP", "0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27, _GRIMME_2006,
                     dispersion_method="b2plyp"),
        DoubleHybrid("B2GP-PLYP", "0.65*HF + 0.35*B88, 0.64*LYP", 0.36, 0.36, _KARTON_2008,
                     dispersion_method="b2gpplyp"),
        DoubleHybrid("mPW2PLYP", "0.55*HF + 0.45*MPW91, 0.75*LYP", 0.25, 0.25,
                     "T. Schwabe, S. Grimme, Phys. Chem. Chem. Phys. 8, 4398 (2006)",
                     dispersion_method="mpw2plyp"),
        # dftd3's "dsdpbep86" D3(BJ) parameters were fitted with the -D3BJ mix below, not with
        # this one, so this fit takes no dispersion.
        DoubleHybrid("DSD-PBEP86", "0.72*HF + 0.28*PBE, 0.44*P86", 0.51, 0.36,
                     "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013), the fit "
                     "without a dispersion term"),
        DoubleHybrid("PBE0-DH", "0.5*HF + 0.5*PBE, 0.875*PBE", 0.125, 0.125,
                     "E. Bremond, C. Adamo, J. Chem. Phys. 135, 024106 (2011)",
                     dispersion_method="pbe0dh"),
        DoubleHybrid("B2PLYP-D3BJ", "0.53*HF + 0.47*B88, 0.73*LYP", 0.27, 0.27,
                     f"{_GRIMME_2006}; D3(BJ) s6 0.64, a1 0.3065, s8 0.9147, a2 5.0570: "
                     f"{_GOERIGK_2011}", Dispersion("d3bj", "b2plyp"), "b2plyp"),
        DoubleHybrid("B2GP-PLYP-D3BJ", "0.65*HF + 0.35*B88, 0.64*LYP", 0.36, 0.36,
                     f"{_KARTON_2008}; D3(BJ) s6 0.56, a1 0, s8 0.2597, a2 6.3332: "
                     f"{_GOERIGK_2011}", Dispersion("d3bj", "b2gpplyp"), "b2gpplyp"),
        DoubleHybrid("DSD-PBEP86-D3BJ", "0.69*HF + 0.31*PBE, 0.44*P86", 0.52, 0.22,
                     "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013), the -D3BJ "
                     "fit; D3(BJ) s6 0.48, a1 0, s8 0, a2 5.6 from the same paper, via dftd3",
                     Dispersion("d3bj", "dsdpbep86"), "dsdpbep86"),
        DoubleHybrid("revDSD-PBEP86-D4", "0.69*HF + 0.31*PBE, 0.4210*P86", 0.5922, 0.0636,
                     "G. Santra, N. Sylvetsky, J. M. L. Martin, J. Phys. Chem. A 123, 5129 "
                     "(2019); D4 s6 0.5132, a1 0.44, a2 3.60, s8 0 (three-body s9 1) from the "
                     "same paper, via dftd4", Dispersion("d4", "revdsdpbep86"), "revdsdpbep86"),
    )
}
# PySCF's integration grids run from level 0 (coarsest) to 9.
GRID_LEVELS = range(10)
# Name endings that add a dispersion model, as _key writes them ("-D3(0)" is D3ZERO too).
_SUFFIXES = {**{_label.lower(): _model for _model, _label in LABELS.items()}, "d30": "d3zero"}


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_BY_KEY = {_key(name): functional for name, functional in NAMED.items()}


def known_names() -> str:
    return ", ".join(NAMED)


def _split_dispersion(name: str) -> tuple[DoubleHybrid, str] | None:
    """A named functional without dispersion and the model its name adds (B2PLYP-D3ZERO)."""
    key = _key(name)
    for suffix, model in _SUFFIXES.items():
        base = _BY_KEY.get(key[:-len(suffix)]) if key.endswith(suffix) else None
        if base is not None and base.dispersion is None:
            return base, model
    return None


def _combined(base: DoubleHybrid, model: str) -> DoubleHybrid:
    """``base`` (one with a ``dispersion_method``) with the dispersion ``model`` and the
    libraries' parameters for it: the named entry when there is one, so that B2PLYP with
    d3bj is B2PLYP-D3BJ."""
    name = f"{base.name}-{LABELS[model]}"
    named = _BY_KEY.get(_key(name))
    if named is not None:
        return named
    dispersion = Dispersion(model, str(base.dispersion_method))
    return replace(base, name=name, dispersion=dispersion,
                   source=f"{base.source}; {dispersion.label} parameters of "
                          f"'{dispersion.method}' from {dispersion.package}")


def named_functional(name: str) -> DoubleHybrid | None:
    """The named double hybrid, matched without regard to case, hyphens or spaces, with the
    dispersion a -D3BJ, -D3ZERO or -D4 ending adds (its parameters are not looked up here)."""
    named = _BY_KEY.get(_key(name))
    if named is not None:
        return named
    split = _split_dispersion(name)
    if split is None or split[0].dispersion_method is None:
        return None
    return _combined(*split)


def with_dispersion(functional: DoubleHybrid, model: str | None) -> DoubleHybrid:
    """``--dispersion`` applied to a named double hybrid: its own term, none, or a model
    whose parameters the library has for it."""
    own = functional.dispersion
    if model is None or (own is not None and model == own.model):
        return functional
    if own is not None:
        raise InputError(f"{functional.name} includes its own dispersion ({own.label}); "
                         "--dispersion applies to a double hybrid without one")
    if model == NONE:
        return functional
    if functional.dispersion_method is None:
        with_own = ", ".join(name for name, named in NAMED.items() if named.dispersion)
        raise InputError(f"{functional.name} has no dispersion parameters in dftd3 or dftd4; "
                         f"the named double hybrids with dispersion are {with_own}")
    return _combined(functional, model)


def resolve_functional(xc: str | None, mp2_os: float | None = None,
                       mp2_ss: float | None = None,
                       dispersion: str | None = None) -> DoubleHybrid | None:
    """``--xc`` with ``--mp2-os``/``--mp2-ss`` and ``--dispersion``: a named double hybrid
    (whose scales are part of its definition) with the dispersion its name or the option
    gives, a custom exchange-correlation string with both scales, or None."""
    if dispersion is not None and dispersion not in (*MODELS, NONE):
        raise InputError(f"unknown dispersion {dispersion!r}; choose one of "
                         f"{', '.join((*MODELS, NONE))}")
    if xc is None:
        if mp2_os is not None or mp2_ss is not None:
            raise InputError("--mp2-os and --mp2-ss scale the MP2 part of a double hybrid; "
                             "give --xc too")
        if dispersion is not None:
            raise InputError("--dispersion adds to a double hybrid; give --xc too")
        return None
    if not xc.strip():
        raise InputError(f"--xc is empty; give a double hybrid ({known_names()}) or an "
                         "exchange-correlation string with --mp2-os and --mp2-ss")
    named = named_functional(xc)
    split = _split_dispersion(xc) if named is None else None
    if split is not None:
        # A -D ending on a functional the libraries have no parameters for: say so.
        named = with_dispersion(*split)
    if named is not None:
        if mp2_os is not None or mp2_ss is not None:
            raise InputError(f"{named.name} fixes its own MP2 scales "
                             f"({named.os_scale} OS, {named.ss_scale} SS); --mp2-os and "
                             "--mp2-ss apply to a custom --xc string")
        functional = with_dispersion(named, dispersion)
        if functional.dispersion is not None:
            damping(functional.dispersion)  # the library is there and has the parameters
        return functional
    check_xc_string(xc)
    if mp2_os is None or mp2_ss is None:
        raise InputError(f"--xc {xc!r} is not a named double hybrid ({known_names()}); a "
                         "custom exchange-correlation string needs --mp2-os and --mp2-ss")
    if dispersion not in (None, NONE):
        raise InputError(f"--dispersion {dispersion} needs a named functional, whose damping "
                         "parameters dftd3 and dftd4 tabulate; a custom --xc string has none "
                         f"(named: {known_names()})")
    return DoubleHybrid(xc.strip(), xc.strip(), float(mp2_os), float(mp2_ss))


class UnknownFunctional(InputError):
    """A functional PySCF cannot read (not one it reads with a coefficient out of range)."""


def check_xc_string(xc: str) -> None:
    """Refuse what PySCF cannot parse, and range-separated exchange (the J/K engine builds
    full-range exchange only)."""
    try:
        libxc.parse_xc(xc)
        omega = libxc.rsh_coeff(xc)[0]
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        detail = exc.args[0] if exc.args else exc
        raise UnknownFunctional(f"unknown functional --xc {xc!r} ({detail}); known double hybrids: "
                         f"{known_names()}, or a PySCF exchange-correlation string such as "
                         "'0.53*HF + 0.47*B88, 0.73*LYP' with --mp2-os and --mp2-ss") from None
    _refuse_dispersion_ending(xc)
    if omega:
        raise InputError(f"--xc {xc!r} has range-separated exchange (omega = {omega}), which "
                         "dfmp2 does not build; use a global hybrid mix")
    (hybrid, _, _), terms = libxc.parse_xc(xc)
    for coefficient in (hybrid, *(factor for _, factor in terms)):
        if not abs(coefficient) <= MAX_SCALE_FACTOR:
            raise InputError(f"--xc {xc!r} has a coefficient of {coefficient!r}: give "
                             f"coefficients between -{MAX_SCALE_FACTOR:g} and "
                             f"{MAX_SCALE_FACTOR:g}")


def _refuse_dispersion_ending(xc: str) -> None:
    """PySCF's Kohn-Sham SCF takes a dispersion term its string names (b3lyp-d3bj, or cf22d,
    which carries D3) as its own, computed by pyscf-dispersion inside E_KS: the record would
    say no dispersion and the gradient would leave it out (without that package, the SCF
    ended in a traceback). dfmp2's dispersion comes only with a named functional."""
    if parse_dft is None:
        return
    try:
        _, _, term = parse_dft(xc)
    except NotImplementedError:
        raise InputError(f"--xc {xc!r} carries a dispersion or composite-method term that "
                         "PySCF does not run; give the exchange-correlation mix alone") from None
    if term:
        with_own = ", ".join(name for name, named in NAMED.items() if named.dispersion)
        raise InputError(f"a custom --xc string takes no dispersion term ({xc!r} carries "
                         f"{term.upper()}, which PySCF's SCF would add to E_KS): dispersion "
                         f"comes with a named double hybrid ({with_own}, or a name with -D3BJ, "
                         "-D3ZERO or -D4); give the exchange-correlation mix alone")


def stored_functional(name: str, xc: str, os_scale: float, ss_scale: float,
                      dispersion: Dispersion | None = None) -> DoubleHybrid | None:
    """The double hybrid a record describes (its stored string, scales and dispersion, not
    today's table), or None for a Hartree-Fock reference."""
    if not xc:
        return None
    named = named_functional(name)
    same = named is not None and named.xc == xc and named.dispersion == dispersion
    source = named.source if same else "user-defined"
    return DoubleHybrid(name, xc, os_scale, ss_scale, source, dispersion,
                        dispersion.method if dispersion is not None else None)
