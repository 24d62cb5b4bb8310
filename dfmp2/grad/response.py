"""Orbital response of the DF-MP2 gradient: Lagrangian, Z-vector, relaxed and energy-weighted
densities, per spin channel (one closed-shell channel with spin-summed quantities, or UHF's
alpha and beta).

Notation (MO basis of a channel): frozen occupied I, active occupied i, j, k, l, all occupied
m, n, virtual a, b; n_c the channel's occupancy (2 closed shell, 1 per UHF spin); v[X] the
SCF's two-electron potential of a density X through the SCF's own JK-fit integrals (closed
shell J[X] - K[X]/2, UHF J[X_a + X_b] - K[X_sigma]), so the response is that of DF-SCF.

From the amplitudes (:mod:`dfmp2.grad.amplitudes`) and the RI pass
(:mod:`dfmp2.grad.integrals`) come the unrelaxed P_ij, P_ab and

    X_pq = 2 n_c sum_aP (pa|P) G_qa^P  (q active occupied)
    X_pq = 2 n_c sum_iP (pi|P) G_iq^P  (q virtual),          G = J^-1-fitted Gamma,

the derivative of E_corr with respect to orbital rotations through the integrals. Then

* frozen core: the frozen-active rotations are fixed by F_Ij = 0, which gives
  P_Ij = P_jI = -X_Ij / (2 (e_I - e_j));
* Lagrangian: L_ai = X_ai - X_ia + 2 n_c [v(P_unrelaxed + P_frozen)]_ai;
* Z-vector: (e_a - e_i) z_ai + n_c [v(C_v z C_o^T + C_o z^T C_v^T)]_ai = L_ai, a symmetric
  system (indefinite on an internally unstable reference) solved by preconditioned MINRES,
  or directly when MINRES falls short on a small system, and refused unless the true
  residual meets :data:`ZVECTOR_TOL`; P_ai = P_ia = -z_ai / 2;
* energy-weighted density W (the gradient gets -sum W_pq S^x_pq):
  W_mn = n_c v(P)_mn + n_c e_m delta_mn (the SCF's own part),
  W_kl += (X_kl + X_lk) / 4 + P_kl (e_k + e_l) / 2,
  W_ab = (X_ab + X_ba) / 4 + P_ab (e_a + e_b) / 2,
  W_ai = W_ia = X_ia / 2 + P_ai e_i,  W_Ij = W_jI += P_Ij e_j,
  with P the relaxed density.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse.linalg import LinearOperator, minres

from dfmp2.errors import RunFailure
from dfmp2.grad.kohn_sham import is_kohn_sham, response_function
from dfmp2.mp2.channels import Channel

# Largest norm ||A z - L|| accepted. The gradient's error is about the residual divided by the
# smallest eigenvalue (in magnitude) of the response matrix A: 1e-9 keeps it near 1e-7 Eh/Bohr
# down to eigenvalues of 0.01 Eh (NO2's unstable UHF in cc-pVDZ has -0.0017, measured).
ZVECTOR_TOL = 1e-9
# MINRES iterations (one J/K build each) over all its restarts; a stable reference needs 10 to
# 30 (measured on water, hydroxyl and NO2).
ZVECTOR_MAX_ITER = 200
# Unknowns up to which a system MINRES could not solve is solved densely: one J/K build per
# column, a few seconds for a small molecule (NO2/cc-pVDZ UHF has 701).
DENSE_MAX_SIZE = 2000


@dataclass(frozen=True)
class ResponseSolve:
    """How the Z-vector equations were solved: ``minres``, or ``dense`` after MINRES fell
    short; MINRES's iterations and the true residual norm ||A z - L|| of the solution."""

    solver: str
    iterations: int
    residual: float


@dataclass
class RelaxedDensities:
    """AO densities: the relaxed MP2 density per channel (spin-summed for a closed shell) and
    the total energy-weighted density of SCF plus MP2, and how the Z-vector was solved."""

    p_relaxed: list[np.ndarray]
    w_total: np.ndarray
    response: ResponseSolve


class ScfPotential:
    """v[X] per channel from the SCF object's own J/K (its JK-fit basis); for a Kohn-Sham
    reference J - a_x K plus the exchange-correlation kernel, PySCF's response function of
    ``mf`` (:func:`dfmp2.grad.kohn_sham.response_function`).

    In a distributed run ``mf.get_jk`` is collective (each rank builds J/K from its slice of
    the fit functions): every rank must make the same calls with the same densities. The
    response's inputs are summed with allreduce, the same bits on every rank, so the
    Z-vector solve takes the same path, and makes the same builds, everywhere."""

    def __init__(self, mf, closed_shell: bool) -> None:
        self.mf, self.closed_shell = mf, closed_shell
        self.builds = 0
        self._kohn_sham = response_function(mf) if is_kohn_sham(mf) else None

    def __call__(self, densities: list[np.ndarray]) -> list[np.ndarray]:
        self.builds += 1
        if self._kohn_sham is not None:
            stacked = densities[0] if self.closed_shell else np.asarray(densities)
            v = self._kohn_sham(stacked)
            return [v] if self.closed_shell else [v[0], v[1]]
        if self.closed_shell:
            vj, vk = self.mf.get_jk(self.mf.mol, densities[0], hermi=1)
            return [vj - 0.5 * vk]
        vj, vk = self.mf.get_jk(self.mf.mol, np.asarray(densities), hermi=1)
        coulomb = vj[0] + vj[1]
        return [coulomb - vk[0], coulomb - vk[1]]


def orbital_derivative(channel: Channel, xo_ao: np.ndarray, xv_ao: np.ndarray) -> np.ndarray:
    """X (nmo, nmo) from the RI pass's AO-row halves: columns of the active occupied
    and of the virtual orbitals (those of frozen orbitals are zero)."""
    x = np.zeros((channel.nmo, channel.nmo))
    scale = 2.0 * channel.occupancy
    x[:, channel.active] = scale * channel.mo_coeff.T @ xo_ao
    x[:, channel.virtual] = scale * channel.mo_coeff.T @ xv_ao
    return x


def _frozen_core_density(channel: Channel, x: np.ndarray) -> np.ndarray:
    frz, act, e = channel.frozen, channel.active, channel.mo_energy
    p = np.zeros((channel.nmo, channel.nmo))
    if len(frz):
        block = -0.5 * x[np.ix_(frz, act)] / (e[frz][:, None] - e[act][None, :])
        p[np.ix_(frz, act)] = block
        p[np.ix_(act, frz)] = block.T
    return p


def _solve_zvector(channels: list[Channel], potential: ScfPotential,
                   lagrangians: list[np.ndarray]) -> tuple[list[np.ndarray], ResponseSolve]:
    shapes = [lag.shape for lag in lagrangians]
    bounds = np.cumsum([0] + [lag.size for lag in lagrangians])
    diagonal = np.concatenate([(c.mo_energy[c.virtual][:, None]
                                - c.mo_energy[c.occupied][None, :]).ravel() for c in channels])
    rhs = np.concatenate([lag.ravel() for lag in lagrangians])
    size = rhs.size

    def blocks(x: np.ndarray) -> list[np.ndarray]:
        return [x[b0:b1].reshape(shape) for b0, b1, shape in zip(bounds[:-1], bounds[1:], shapes)]

    def apply(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        orbitals = [(c.mo_coeff[:, c.virtual], c.mo_coeff[:, c.occupied]) for c in channels]
        densities = []
        for (c_vir, c_occ), z in zip(orbitals, blocks(x)):
            half = c_vir @ z @ c_occ.T
            densities.append(half + half.T)
        coupling = [c.occupancy * c_vir.T @ v @ c_occ
                    for c, (c_vir, c_occ), v in zip(channels, orbitals, potential(densities))]
        return diagonal * x + np.concatenate([block.ravel() for block in coupling])

    def residual_of(x: np.ndarray) -> float:
        return float(np.linalg.norm(apply(x) - rhs))

    operator = LinearOperator((size, size), matvec=apply, dtype=np.float64)
    # e_a - e_i > 0 on any aufbau reference: MINRES needs a positive definite preconditioner,
    # and this one is exact for the uncoupled part.
    preconditioner = LinearOperator((size, size), matvec=lambda x: np.ravel(x) / diagonal,
                                    dtype=np.float64)
    iterations = 0

    def count(_) -> None:
        nonlocal iterations
        iterations += 1

    # No correlation (one electron, or none paired: H2+) gives no right-hand side: z = 0.
    z, residual = rhs / diagonal, np.inf if rhs.any() else 0.0
    # MINRES's own stopping test is on a preconditioned estimate; restarting from its answer
    # until the true residual is met keeps the test on the quantity that matters.
    while residual > ZVECTOR_TOL and iterations < ZVECTOR_MAX_ITER:
        before = iterations
        z, _ = minres(operator, rhs, x0=z, rtol=0.1 * ZVECTOR_TOL / np.linalg.norm(rhs),
                      maxiter=ZVECTOR_MAX_ITER - iterations, M=preconditioner, callback=count)
        residual = residual_of(z)
        if iterations == before:
            break
    solver = "minres"
    if residual > ZVECTOR_TOL and size <= DENSE_MAX_SIZE:
        matrix = np.column_stack([apply(unit) for unit in np.eye(size)])
        with np.errstate(all="ignore"):
            dense = np.linalg.solve(matrix, rhs)
        dense_residual = residual_of(dense)
        if dense_residual < residual:
            z, residual, solver = dense, dense_residual, "dense"
    if not residual <= ZVECTOR_TOL:
        raise RunFailure(f"the orbital response (Z-vector) did not converge: residual "
                         f"{residual:.1e} > {ZVECTOR_TOL:.0e} after {iterations} iterations; "
                         "the reference is probably unstable (see the stability analysis)")
    return blocks(z), ResponseSolve(solver, iterations, residual)


def relax(channels: list[Channel], potential: ScfPotential, x_list: list[np.ndarray],
          p_occ: list[np.ndarray], p_vir: list[np.ndarray]) -> RelaxedDensities:
    """The relaxed densities and W from X, P_ij and P_ab of every channel."""
    unrelaxed = []
    for channel, x, poo, pvv in zip(channels, x_list, p_occ, p_vir):
        p = _frozen_core_density(channel, x)
        p[np.ix_(channel.active, channel.active)] = poo
        p[np.ix_(channel.virtual, channel.virtual)] = pvv
        unrelaxed.append(p)
    v_unrelaxed = potential([c.to_ao(p) for c, p in zip(channels, unrelaxed)])
    lagrangians = []
    for channel, x, v in zip(channels, x_list, v_unrelaxed):
        occ, vir = channel.occupied, channel.virtual
        c_occ, c_vir = channel.mo_coeff[:, occ], channel.mo_coeff[:, vir]
        lagrangians.append(x[np.ix_(vir, occ)] - x[np.ix_(occ, vir)].T
                           + 2.0 * channel.occupancy * c_vir.T @ v @ c_occ)
    z_list, response = _solve_zvector(channels, potential, lagrangians)

    relaxed = []
    for channel, p, z in zip(channels, unrelaxed, z_list):
        p = p.copy()
        p[np.ix_(channel.virtual, channel.occupied)] = -0.5 * z
        p[np.ix_(channel.occupied, channel.virtual)] = -0.5 * z.T
        relaxed.append(p)
    # v is linear: only the Z-vector part of the relaxed density needs a new build.
    v_z = potential([c.to_ao(r - u) for c, r, u in zip(channels, relaxed, unrelaxed)])
    w_total = sum(channel.to_ao(_energy_weighted(channel, x, p, v1 + v2))
                  for channel, x, p, v1, v2 in zip(channels, x_list, relaxed, v_unrelaxed, v_z))
    return RelaxedDensities([c.to_ao(p) for c, p in zip(channels, relaxed)], w_total, response)


def _energy_weighted(channel: Channel, x: np.ndarray, p: np.ndarray,
                     v_relaxed: np.ndarray) -> np.ndarray:
    e, n = channel.mo_energy, channel.occupancy
    occ, act, frz, vir = channel.occupied, channel.active, channel.frozen, channel.virtual
    c_occ = channel.mo_coeff[:, occ]
    w = np.zeros((channel.nmo, channel.nmo))
    w[np.ix_(occ, occ)] = n * (c_occ.T @ v_relaxed @ c_occ + np.diag(e[occ]))
    for block in (act, vir):
        xb = x[np.ix_(block, block)]
        w[np.ix_(block, block)] += 0.25 * (xb + xb.T) + 0.5 * p[np.ix_(block, block)] * (
            e[block][:, None] + e[block][None, :])
    w_vo = 0.5 * x[np.ix_(occ, vir)].T + p[np.ix_(vir, occ)] * e[occ][None, :]
    w[np.ix_(vir, occ)] = w_vo
    w[np.ix_(occ, vir)] = w_vo.T
    if len(frz):
        w_fa = p[np.ix_(frz, act)] * e[act][None, :]
        w[np.ix_(frz, act)] += w_fa
        w[np.ix_(act, frz)] += w_fa.T
    return w
