"""The Kohn-Sham parts of a double hybrid's gradient.

A double hybrid's energy is E_KS[D] + c_os E_OS + c_ss E_SS (+ E_disp) on Kohn-Sham orbitals.
Its gradient takes the MP2 machinery of :mod:`dfmp2.grad.kernel` with three changes:

* the orbital response is that of the Kohn-Sham reference: v[X] = J[X] - a_x K[X] (per spin)
  plus the exchange-correlation kernel f_xc[X], PySCF's own response function of ``mf``
  (:func:`response_function`);
* the JK-fit derivative terms carry exact exchange scaled by a_x, the functional's share
  (:func:`exact_exchange_share`);
* the exchange-correlation energy's nuclear derivative, through the basis functions that move
  with the atoms (:func:`xc_gradient`): with D the SCF density (per spin), P the relaxed
  correction and rho[X] the density of X on the grid (with its gradient for a GGA),

      dE/dR = int v_xc[rho[D]] . d rho[D + P]/dR + int (f_xc[rho[D]] rho[P]) . d rho[D]/dR,

  where d rho[X]/dR differentiates only the basis functions on the moving atom. The first
  term is the Kohn-Sham gradient's own (with D) and the Fock matrix's derivative traced with
  P; the second is how v_xc changes when the basis functions under D move.

The quadrature weights move with the atoms too; that term (grid response) is left out, as in
PySCF's default Kohn-Sham gradients: on grid level 3 and above the analytic gradient then
agrees with central differences of the energy to better than 2e-5 Eh/Bohr (measured in
tests/test_dh_gradient.py), and the forces add up to zero within about 5e-6 Eh/Bohr.
"""
from __future__ import annotations

import numpy as np
from pyscf import dft, gto

from dfmp2.errors import InputError
from dfmp2.system.distributed import World

# Which second-derivative component of PySCF's AO array (deriv=2) is d2/(dx_c dx_i):
# rows 4..9 hold xx, xy, xz, yy, yz, zz.
_SECOND = ((4, 5, 6), (5, 7, 8), (6, 8, 9))


def is_kohn_sham(mf) -> bool:
    return hasattr(mf, "xc") and hasattr(mf, "_numint")


def exact_exchange_share(mf) -> float:
    """a_x of a global hybrid; range-separated and non-local (VV10) functionals are refused."""
    if not is_kohn_sham(mf):
        return 1.0
    refuse_undifferentiable(mf.xc, mf.mol.spin, mf._numint, bool(getattr(mf, "nlc", "")))
    return float(mf._numint.rsh_and_hybrid_coeff(mf.xc, spin=mf.mol.spin)[2])


def refuse_undifferentiable(xc: str, spin: int = 0, numint=None, nlc: bool = False) -> None:
    """Refuse an exchange-correlation mix whose gradient is not implemented (range-separated,
    non-local, meta-GGA); the jobs call it before any work, since found after the SCF it
    had moved a complete record aside."""
    numint = numint or dft.numint.NumInt()
    if numint.rsh_and_hybrid_coeff(xc, spin=spin)[0] != 0:
        raise InputError(f"analytic gradients and relaxed densities of range-separated "
                         f"functionals ({xc}) are not implemented; use a global hybrid mix")
    if nlc or numint.libxc.is_nlc(xc):
        raise InputError(f"analytic gradients and relaxed densities with non-local "
                         f"correlation ({xc}) are not implemented")
    xc_type = numint._xc_type(xc)
    if xc_type not in ("HF", "LDA", "GGA"):
        raise InputError(f"analytic gradients and relaxed densities of {xc_type} functionals "
                         f"({xc}) are not implemented; use an LDA or GGA mix")


def response_function(mf):
    """X -> v[X] for symmetric AO densities X (one matrix for a closed shell, a stacked alpha,
    beta pair for UHF/UKS): the SCF's own J/K (and for Kohn-Sham its f_xc), PySCF's response
    of ``mf``."""
    return mf.gen_response(hermi=1)


def _xc_type(mf) -> str:
    return mf._numint._xc_type(mf.xc)


def _grid_terms(mf, scf_densities: list[np.ndarray], corrections: list[np.ndarray],
                ao: np.ndarray, weight: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weighted potential, density it multiplies) pairs of one grid block: v_xc with D + P
    and f_xc rho[P] with D, per spin (one total-density pair for a closed shell)."""
    ni, xc_type = mf._numint, _xc_type(mf)
    values = ao[0] if xc_type == "LDA" else ao[:4]
    nvar = 1 if xc_type == "LDA" else 4

    def density(dm: np.ndarray) -> np.ndarray:
        return ni.eval_rho(mf.mol, values, dm, None, xc_type, hermi=1).reshape(nvar, -1)

    rho0 = np.array([density(d) for d in scf_densities])
    rho1 = np.array([density(p) for p in corrections])
    spin = 0 if len(scf_densities) == 1 else 1
    vxc, fxc = ni.eval_xc_eff(mf.xc, rho0[0] if spin == 0 else rho0, deriv=2,
                              xctype=xc_type, spin=spin)[1:3]
    vxc = vxc.reshape(len(scf_densities), nvar, -1)
    nspin = len(scf_densities)
    kernel_times_p = np.einsum("sxtyg,tyg->sxg", fxc.reshape(nspin, nvar, nspin, nvar, -1),
                               rho1)
    pairs = []
    for s, (d, p) in enumerate(zip(scf_densities, corrections)):
        pairs.append((vxc[s] * weight, d + p))
        pairs.append((kernel_times_p[s] * weight, d))
    return pairs


def _contract(ao: np.ndarray, potential: np.ndarray, density: np.ndarray) -> np.ndarray:
    """t[c, mu] = sum_g,nu D_mu nu [w0 d_c phi_mu phi_nu + sum_i w_i (d_c d_i phi_mu phi_nu
    + d_c phi_mu d_i phi_nu)]: -2 t summed over an atom's functions is int w . d rho/dR_c."""
    phi_d = ao[0] @ density
    carried = potential[0][:, None] * phi_d
    gga = potential.shape[0] == 4
    if gga:
        for i in range(3):
            carried += potential[i + 1][:, None] * (ao[i + 1] @ density)
    terms = np.einsum("cgm,gm->cm", ao[1:4], carried)
    if gga:
        for c in range(3):
            for i in range(3):
                terms[c] += np.einsum("gm,g,gm->m", ao[_SECOND[c][i]], potential[i + 1],
                                      phi_d)
    return terms


def xc_gradient(mf, scf_densities: list[np.ndarray], corrections: list[np.ndarray],
                world: World | None = None, max_memory: float = 2000) -> np.ndarray:
    """The exchange-correlation terms of the double hybrid's gradient (natm, 3), Eh/Bohr,
    for the SCF densities and relaxed corrections per channel (the closed shell's spin-summed,
    else alpha and beta). Each rank integrates its share of the grid blocks; the result is
    summed over the ranks."""
    world = world or World()
    mol: gto.Mole = mf.mol
    xc_type = _xc_type(mf)
    if xc_type == "HF":
        return np.zeros((mol.natm, 3))
    nao = mol.nao_nr()
    per_function = np.zeros((3, nao))
    ao_deriv = 1 if xc_type == "LDA" else 2
    grids = mf.grids
    if grids.coords is None:
        grids.build(with_non0tab=True)
    for n, (ao, _, weight, _) in enumerate(mf._numint.block_loop(mol, grids, nao, ao_deriv,
                                                                  max_memory=max_memory)):
        if n % world.size != world.rank:
            continue
        for potential, density in _grid_terms(mf, scf_densities, corrections, ao, weight):
            per_function += _contract(ao, potential, density)
    grad = np.zeros((mol.natm, 3))
    for atom, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        grad[atom] = -2.0 * per_function[:, p0:p1].sum(axis=1)
    return world.allreduce_sum(grad, "summing the exchange-correlation gradient")
