"""The typed kernel interface: what every kernel set provides, and how a stage adds kernels.

``kernels.load(...)`` returns a :class:`KernelSet`: :class:`kernels.torch_backend.TorchKernels`
or :class:`kernels.nki_host.kernel_set.NkiKernels`. Both are checked against it (it is
``runtime_checkable``: ``isinstance(kernel_set, KernelSet)`` checks that every member exists).

Conventions for every method: operands and results are torch tensors on the set's ``device``
(inputs may be any float dtype and may be transposed views; contractions compute in the set's
``dtype``); energy sums come back as Python floats accumulated in fp64; every call is counted in
``accounting`` under the kernel's name and the executor that really ran it.

A stage that needs more kernels declares its own Protocol extending this one, so that the stage
states exactly what it calls and every backend is checked against it the same way::

    class CoulombKernelSet(KernelSet, Protocol):
        def coulomb(self, b_jk: torch.Tensor, density: torch.Tensor) -> torch.Tensor:
            '''J = B_jk^T (B_jk . D) ...'''

(add ``@runtime_checkable`` to it too), implement the methods on TorchKernels and NkiKernels,
and let the stage's functions take a ``CoulombKernelSet``.
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from kernels.accounting import KernelAccounting


@runtime_checkable
class KernelSet(Protocol):
    """The DF-MP2 kernels and the facts about where they run."""

    backend: str
    """``torch`` or ``nki``."""
    precision: str
    """``fp64`` or ``fp32``: what the contractions compute in."""
    dtype: torch.dtype
    """The torch dtype of ``precision``."""
    device: torch.device
    """Where result tensors live."""
    executor: str
    """Where calls run when they succeed, e.g. ``torch-cpu`` or ``nki-interpreter``."""
    accounting: KernelAccounting
    """Calls per (kernel, executor) and fallbacks to torch, for the run record."""

    def gemm(self, a: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """``a @ b`` for ``a`` (..., m, k) and ``b`` (k, n), or for ``a`` (m, k) and a batch
        ``b`` (p, k, n) (then the result is (p, m, n)). Used by the energy step, where fp32
        contraction is accurate enough. ``out`` (the result's shape, the set's dtype and
        device), when given, receives the result: a caller reusing it saves a fresh array's
        page faults per call."""
        ...

    def transform_gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """``a @ b`` with gemm's shapes, for the DF transform (C_occ^T (P|mu nu), (P|i nu) C_vir)
        and the eigen-metric fit: products whose sums cancel strongly on diffuse bases. On NKI
        an exact-head split makes the fp32 Tensor Engine nearly fp64-accurate and the result is
        fp64 (kernels/nki_host/gemm_split.py); on torch it is the plain product in ``dtype``."""
        ...

    def syrk(self, a: torch.Tensor, row_unit: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """``a @ a.T`` (n, n) for ``a`` (n, k). Rows of ``a`` come in units of ``row_unit``
        rows; only blocks on and below the diagonal, in those units, are guaranteed, the
        others are unspecified. ``out`` as for :meth:`gemm`."""
        ...

    def trsm(self, l: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        """``X`` with ``l @ X = b`` for lower-triangular ``l`` (n, n) and ``b`` (n, m) or (n,);
        only the lower triangle of ``l`` is read. ``out`` may be ``b`` itself, to solve in
        place."""
        ...

    def mp2_energy(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                   denom_col: torch.Tensor, nvir: int,
                   diagonal_block: bool) -> tuple[float, float]:
        """Same-spin (direct, exchange) sums of ``T = pair_block`` (ni*nvir, nj*nvir), rows
        (i, a) and columns (j, b) orbital-major: sum T[(i,a),(j,b)]^2 / D and
        sum T[(i,a),(j,b)] T[(i,b),(j,a)] / D with D = denom_row[(i,a)] + denom_col[(j,b)]
        (denominators e_i - e_a, flat (ni*nvir,) and (nj*nvir,)). With ``diagonal_block`` the
        rows and columns are the same orbitals: only pairs i >= j are read, i > j counted
        twice."""
        ...

    def mp2_energy_fused(self, b_row: torch.Tensor, b_col: torch.Tensor,
                         denom_row: torch.Tensor, denom_col: torch.Tensor, nvir: int,
                         diagonal_block: bool) -> tuple[float, float]:
        """:meth:`mp2_energy` of ``T = b_row.T @ b_col`` from two fitted blocks
        (naux, ni*nvir) and (naux, nj*nvir), auxiliary index first; T is formed tile by tile
        and never materialised whole."""
        ...

    def mp2_energy_os(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                      denom_col: torch.Tensor, nvir_row: int, nvir_col: int) -> float:
        """Opposite-spin direct sum sum T^2 / D of an alpha-beta block ``T = pair_block``
        (ni*nvir_row, nj*nvir_col): rows (i, a) alpha, columns (j, b) beta, D as in
        :meth:`mp2_energy`. No exchange term, no pair weight."""
        ...

    def mp2_energy_os_fused(self, b_row: torch.Tensor, b_col: torch.Tensor,
                            denom_row: torch.Tensor, denom_col: torch.Tensor, nvir_row: int,
                            nvir_col: int) -> float:
        """:meth:`mp2_energy_os` of ``T = b_row.T @ b_col`` from the alpha block
        (naux, ni*nvir_row) and the beta block (naux, nj*nvir_col), never materialised."""
        ...

    def report(self) -> dict:
        """JSON-friendly facts for the run record beyond the call counts (NKI: mode,
        signatures, launches and the estimate; torch: nothing)."""
        ...

    def hand_over_launches(self) -> Any:
        """What :meth:`report` counted so far (NKI: launches and interpreter costs; torch:
        None), then counting afresh: another rank's share for rank 0's record."""
        ...

    def absorb_launches(self, tally: Any) -> None:
        """Add another rank's :meth:`hand_over_launches`, so that :meth:`report` covers every
        rank, as the call counts in ``accounting`` do."""
        ...
