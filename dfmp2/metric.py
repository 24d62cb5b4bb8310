"""The Coulomb metric of the auxiliary basis and its factor for the fit."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch
from pyscf import gto

log = logging.getLogger(__name__)

# Eigenvalues of J below this are treated as linear dependence (PySCF's DF-MP2 uses the same).
LINDEP_THRESHOLD = 1e-10


@dataclass
class FitMetric:
    """J = L L^T (``cholesky``: ``factor`` is L) or, when J is not positive definite,
    J^-1 ~ U e^-1 U^T over eigenvalues above the threshold (``eigen``: ``factor`` = U e^-1/2,
    naux x naux_fit). Either way B = L^-1 Y or B = factor^T Y, always in fp64."""

    kind: str
    factor: torch.Tensor
    naux: int
    naux_fit: int
    condition: float


def build_metric(auxmol: gto.Mole) -> FitMetric:
    j2c = auxmol.intor("int2c2e", hermi=1)
    naux = j2c.shape[0]
    try:
        lower = scipy.linalg.cholesky(j2c, lower=True, check_finite=False)
    except scipy.linalg.LinAlgError:
        eigval, eigvec = np.linalg.eigh(j2c)
        keep = eigval > LINDEP_THRESHOLD
        condition = float(abs(eigval).max() / abs(eigval).min())
        log.warning("auxiliary metric is not positive definite (condition %.2e): keeping %d of "
                    "%d fit vectors", condition, int(keep.sum()), naux)
        factor = eigvec[:, keep] / np.sqrt(eigval[keep])
        return FitMetric("eigen", torch.from_numpy(np.ascontiguousarray(factor)), naux,
                         int(keep.sum()), condition)
    diag = np.diag(lower)
    condition = float((diag.max() / diag.min()) ** 2)
    return FitMetric("cholesky", torch.from_numpy(lower), naux, naux, condition)
