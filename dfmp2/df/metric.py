"""The Coulomb metric of the auxiliary basis and its factor for the fit."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.linalg
import torch
from pyscf import gto

log = logging.getLogger(__name__)

# Eigenvalues of J below these are treated as linear dependence, as PySCF does: 1e-10 for the
# MP2 fit (THRESH_LINDEP, pyscf/mp/dfmp2.py), 1e-7 for the SCF's JK fit (LINEAR_DEP_THR,
# pyscf/df/incore.py).
MP2_LINDEP_THRESHOLD = 1e-10
JK_LINDEP_THRESHOLD = 1e-7


@dataclass
class FitMetric:
    """J = L L^T (``cholesky``: ``factor`` is L) or, when J is not positive definite,
    J^-1 ~ U e^-1 U^T over eigenvalues above the threshold (``eigen``: ``factor`` = U e^-1/2,
    naux x naux_fit). Either way B = L^-1 Y or B = factor^T Y, always in fp64."""

    kind: str
    factor: torch.Tensor
    naux: int
    naux_fit: int

    @cached_property
    def fit_gain(self) -> float:
        """An upper bound on |B row| / |Y row|, the norm of the fit's operator: the Frobenius
        norm of L^-1 (one triangular inverse, naux^3 / 3 flops, about 1% of the fit of
        (H2O)16's tensor) or the largest column norm of U e^-1/2, e_min^-1/2, exactly."""
        if self.kind == "cholesky":
            # A Cholesky factor's diagonal is positive, so dtrtri cannot fail on it.
            inverse, _ = scipy.linalg.lapack.dtrtri(self.factor.numpy(), lower=1)
            return float(np.linalg.norm(np.tril(inverse)))
        return float(torch.linalg.vector_norm(self.factor, dim=0).max())


def build_metric(auxmol: gto.Mole, lindep: float = MP2_LINDEP_THRESHOLD) -> FitMetric:
    j2c = auxmol.intor("int2c2e", hermi=1)
    naux = j2c.shape[0]
    try:
        lower = scipy.linalg.cholesky(j2c, lower=True, check_finite=False)
    except scipy.linalg.LinAlgError:
        eigval, eigvec = np.linalg.eigh(j2c)
        keep = eigval > lindep
        condition = float(abs(eigval).max() / abs(eigval).min())
        log.warning("auxiliary metric is not positive definite (condition %.2e): keeping %d of "
                    "%d fit vectors", condition, int(keep.sum()), naux)
        factor = eigvec[:, keep] / np.sqrt(eigval[keep])
        return FitMetric("eigen", torch.from_numpy(np.ascontiguousarray(factor)), naux,
                         int(keep.sum()))
    return FitMetric("cholesky", torch.from_numpy(lower), naux, naux)
