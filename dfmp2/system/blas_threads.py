"""One thread for numpy's and scipy's BLAS while torch does the heavy linear algebra.

torch brings its own BLAS and OpenMP pool. PySCF's SCF driver (DIIS, diagonalisation, the
orbital gradient) and our own glue call numpy between torch's products, and after each call
OpenBLAS keeps its threads spinning for a while, so on a small machine they take the cores
that torch's threads are waiting for. Measured on 2 cores, whole `dfmp2 run`: benzene/cc-pVDZ
2.9 s -> 1.06 s, the (H2O)8 gradient's SCF 7.3 s -> 4.0 s, (H2O)16 SCF 45.7 s -> 43.8 s.
PySCF's own J/K (``--scf-engine pyscf``) and PySCF's DF-MP2 (``--check``, ``bench``) need
numpy's threads and run without this limit.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from threadpoolctl import threadpool_limits


@contextlib.contextmanager
def torch_owns_the_cores() -> Iterator[None]:
    with threadpool_limits(limits=1, user_api="blas"):
        yield
