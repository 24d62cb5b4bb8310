"""Orbital response of the DF-MP2 gradient: Lagrangian, Z-vector, relaxed and energy-weighted
densities, per spin channel (one closed-shell channel with spin-summed quantities, or UHF's
alpha and beta).

Notation (MO basis of a channel): frozen occupied I, active occupied i, j, k, l, all occupied
m, n, virtual a, b; n_c the channel's occupancy (2 closed shell, 1 per UHF spin); v[X] the
SCF's two-electron potential of a density X through the SCF's own JK-fit integrals (closed
shell J[X] - K[X]/2, UHF J[X_a + X_b] - K[X_sigma]), so the response is that of DF-SCF.

From the amplitudes (:mod:`dfmp2.gradient_amplitudes`) and the RI pass
(:mod:`dfmp2.gradient_integrals`) come the unrelaxed P_ij, P_ab and

    X_pq = 2 n_c sum_aP (pa|P) G_qa^P  (q active occupied)
    X_pq = 2 n_c sum_iP (pi|P) G_iq^P  (q virtual),          G = J^-1-fitted Gamma,

the derivative of E_corr with respect to orbital rotations through the integrals. Then

* frozen core: the frozen-active rotations are fixed by F_Ij = 0, which gives
  P_Ij = P_jI = -X_Ij / (2 (e_I - e_j));
* Lagrangian: L_ai = X_ai - X_ia + 2 n_c [v(P_unrelaxed + P_frozen)]_ai;
* Z-vector: (e_a - e_i) z_ai + n_c [v(C_v z C_o^T + C_o z^T C_v^T)]_ai = L_ai, solved by
  PySCF's CPHF (UCPHF) Krylov solver; P_ai = P_ia = -z_ai / 2;
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
from pyscf.scf import cphf, ucphf

from dfmp2.errors import InputError

# Krylov residual norm asked of PySCF's solver; it also stops once a new direction falls below
# its linear-dependence threshold (norm ~3e-8), which came first in every case measured and
# leaves the gradient converged to better than 1e-9 Eh/Bohr.
ZVECTOR_TOL = 1e-10
ZVECTOR_MAX_CYCLE = 60


@dataclass(frozen=True)
class Channel:
    """One spin channel of the reference: its orbitals, which are frozen, and its occupancy."""

    mo_coeff: np.ndarray
    mo_energy: np.ndarray
    mo_occ: np.ndarray
    nfrozen: int
    occupancy: float

    @property
    def occupied(self) -> np.ndarray:
        return np.flatnonzero(self.mo_occ > 0)

    @property
    def frozen(self) -> np.ndarray:
        return self.occupied[:self.nfrozen]

    @property
    def active(self) -> np.ndarray:
        return self.occupied[self.nfrozen:]

    @property
    def virtual(self) -> np.ndarray:
        return np.flatnonzero(self.mo_occ == 0)

    @property
    def nmo(self) -> int:
        return self.mo_coeff.shape[1]

    def to_ao(self, mo_matrix: np.ndarray) -> np.ndarray:
        return self.mo_coeff @ mo_matrix @ self.mo_coeff.T


def channels_of(mf, nfrozen: int) -> list[Channel]:
    """The closed-shell channel of an RHF object, or the alpha and beta channels of UHF.
    Singly occupied orbitals of a restricted reference (ROHF) are refused: the closed-shell
    formulas would count them twice."""
    mo_coeff = np.asarray(mf.mo_coeff)
    if mo_coeff.ndim == 2:
        mo_occ = np.asarray(mf.mo_occ)
        if not np.all((mo_occ == 0) | (mo_occ == 2)):
            raise InputError("the restricted reference has singly occupied orbitals (ROHF); "
                             "open shells need a UHF reference")
        return [Channel(mo_coeff, np.asarray(mf.mo_energy), mo_occ, nfrozen, 2.0)]
    return [Channel(c, e, o, nfrozen, 1.0)
            for c, e, o in zip(mo_coeff, np.asarray(mf.mo_energy), np.asarray(mf.mo_occ))]


@dataclass
class RelaxedDensities:
    """AO densities: the relaxed MP2 density per channel (spin-summed for a closed shell) and
    the total energy-weighted density of SCF plus MP2."""

    p_relaxed: list[np.ndarray]
    w_total: np.ndarray


class ScfPotential:
    """v[X] per channel from the SCF object's own J/K (its JK-fit basis)."""

    def __init__(self, mf, closed_shell: bool) -> None:
        self.mf, self.closed_shell = mf, closed_shell
        self.builds = 0

    def __call__(self, densities: list[np.ndarray]) -> list[np.ndarray]:
        self.builds += 1
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
                   lagrangians: list[np.ndarray]) -> list[np.ndarray]:
    def densities_of(z_blocks):
        dms = []
        for channel, z in zip(channels, z_blocks):
            c_vir = channel.mo_coeff[:, channel.virtual]
            c_occ = channel.mo_coeff[:, channel.occupied]
            half = c_vir @ z @ c_occ.T
            dms.append(half + half.T)
        return dms

    def projected(potentials):
        return [channel.occupancy * channel.mo_coeff[:, channel.virtual].T @ v
                @ channel.mo_coeff[:, channel.occupied]
                for channel, v in zip(channels, potentials)]

    if len(channels) == 1:
        channel = channels[0]

        def fvind(x):
            x = x.reshape(-1, len(channel.virtual), len(channel.occupied))
            return np.stack([projected(potential(densities_of([xi])))[0] for xi in x])

        z, _ = cphf.solve(fvind, channel.mo_energy, channel.mo_occ, -lagrangians[0],
                          max_cycle=ZVECTOR_MAX_CYCLE, tol=ZVECTOR_TOL)
        return [z.reshape(lagrangians[0].shape)]

    sizes = [lag.size for lag in lagrangians]

    def fvind_open(x):
        x = x.reshape(-1, sum(sizes))
        out = []
        for row in x:
            blocks = [row[:sizes[0]].reshape(lagrangians[0].shape),
                      row[sizes[0]:].reshape(lagrangians[1].shape)]
            out.append(np.concatenate([p.ravel() for p in
                                       projected(potential(densities_of(blocks)))]))
        return np.stack(out)

    z, _ = ucphf.solve(fvind_open, [c.mo_energy for c in channels],
                       [c.mo_occ for c in channels], [-lag for lag in lagrangians],
                       max_cycle=ZVECTOR_MAX_CYCLE, tol=ZVECTOR_TOL)
    return [np.asarray(zi).reshape(lag.shape) for zi, lag in zip(z, lagrangians)]


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
    z_list = _solve_zvector(channels, potential, lagrangians)

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
    return RelaxedDensities([c.to_ao(p) for c, p in zip(channels, relaxed)], w_total)


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
