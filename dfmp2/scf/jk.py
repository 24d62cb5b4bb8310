"""Coulomb (J) and exchange (K) matrices from the JK-fit tensor, through a kernel set.

With B_P = X_P + X_P^T the fitted (P|mu nu) (see :mod:`dfmp2.scf.jk_tensor`):

    J = sum_P B_P rho_P,  rho_P = sum_{mu nu} B_P[mu, nu] D[mu, nu]     (the fitted density)
    K = sum_P B_P D B_P = sum_P (B_P F)(B_P F)^T                        for D = F F^T

K goes through the density's factor F: the occupied orbitals (times the square root of their
occupations) when PySCF tags the density with them, as it does in every SCF cycle; else the
eigenvectors of D, positive and negative parts separately. The half-transformed tensor
G[mu, (i, P)] = (F^T B_P)[i, mu] is built one AO function at a time: function mu's
significant pairs (:class:`dfmp2.scf.jk_tensor.PairIndex`, as row and as column of the
packed triangle) are gathered into one block of rows and multiplied by the factor's rows of
their partners, a matrix product whose inner size is mu's number of partners, one per
summation block (below) of the fit functions taken at once (gathered once for all). Then
K = G G^T by a symmetric rank-k update. Per build that is 2 naux nocc (2 n_pairs) + naux
nao^2 nocc multiply-adds, where n_pairs is the number of significant pairs (at most
nao (nao + 1) / 2), the rows that the tensor stores.

Summation order. The fit index P is cut into fixed blocks of SUMMATION_BLOCK functions; each
block's rho, J part and K part (G G^T of that block, in the kernel set's precision) are
formed on their own and added into fp64 J and K in block order. The tensor's rows are read
in chunks fixed by the sizes alone (:data:`dfmp2.scf.jk_tensor.CHUNK_PAIRS`); an AO
function's row of G adds the chunks' products in chunk order. The memory budget only
decides how many blocks are taken at once (gathered together, and read together from a
tensor file), so a build's bits do not depend on it, and an fp32 K is fp32 within a block
and fp64 across blocks.

J and K are both sums over the fit index P, so a tensor that holds only some of the fit
functions (one rank's slice, :mod:`dfmp2.scf.jk_tensor`) builds that rank's part of them; the
ranks' parts add up to J and K (:class:`dfmp2.scf.engine.KernelDF` adds them).
"""
from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from dfmp2.scf.jk_tensor import FP64_BYTES, JkTensor
from dfmp2.system.distributed import deal_pairs
from kernels import single_threaded_ops
from kernels.interface import KernelSet

# Eigenvalues of an untagged density below this (relative to the largest) carry no exchange
# worth a column of F: 1e-14 of it is far below the SCF's 1e-12 Eh energy threshold.
FACTOR_CUTOFF = 1e-14
# Work arrays of one build: the half-transformed tensor G of the fit functions taken at once
# (a window: one gather of each AO function's pairs serves all of its summation blocks).
DEFAULT_WORK_BYTES = 512 * 2**20
# Fit functions per partial sum of J and K. Every build adds the partial sums of consecutive
# blocks of this many fit functions in the same order, whatever the memory budget (which sets
# only how many blocks a build takes at once), so that a build's bits, and the
# SCF's cycle count, do not follow the budget (issue 21). Each block's K is one rank-k update
# of nao rows with an inner size of nocc 512 (40,960 for (H2O)16), near the dgemm rate.
SUMMATION_BLOCK = 512
# Below this many multiply-adds a build runs on one thread: its products are too small to
# gain from two, and a core busy with another process makes each parallel region wait.
SINGLE_THREAD_WORK = 2e8


@dataclass(frozen=True)
class DensityFactor:
    """One term of a density, D += sign * left right^T (right None: right = left)."""

    left: np.ndarray
    sign: float = 1.0
    right: np.ndarray | None = None


def factorize(dm: np.ndarray, hermi: int, mo_coeff=None, mo_occ=None) -> list[DensityFactor]:
    """Factors of one density: from its orbitals and occupations when given, else from its
    eigenvectors (symmetric densities) or singular vectors (any other)."""
    if mo_coeff is not None and mo_occ is not None:
        occupied = np.asarray(mo_occ) > 0
        left = np.asarray(mo_coeff)[:, occupied] * np.sqrt(np.asarray(mo_occ)[occupied])
        return [DensityFactor(np.ascontiguousarray(left))]
    if hermi == 1:
        eigval, eigvec = np.linalg.eigh(dm)
        cutoff = FACTOR_CUTOFF * max(1.0, float(np.abs(eigval).max(initial=0.0)))
        factors = []
        for sign, keep in ((1.0, eigval > cutoff), (-1.0, eigval < -cutoff)):
            if keep.any():
                factors.append(DensityFactor(np.ascontiguousarray(
                    eigvec[:, keep] * np.sqrt(np.abs(eigval[keep]))), sign))
        return factors
    left, singular, right_t = np.linalg.svd(dm)
    keep = singular > FACTOR_CUTOFF * max(1.0, float(singular.max(initial=0.0)))
    return [DensityFactor(np.ascontiguousarray(left[:, keep] * singular[keep]), 1.0,
                          np.ascontiguousarray(right_t[keep].T))]


@dataclass
class JkBuild:
    """One J/K build as the record lists it."""

    seconds: float
    precision: str
    executor: str
    factor_columns: int


class JkEngine:
    """J and K of densities, built from ``tensor``: K through ``kernel_set`` (a
    :class:`kernels.interface.KernelSet`: ``gemm`` and ``syrk``), J through ``coulomb_set``.

    J is a pair of matrix-vector products over the tensor (bandwidth-bound, a few percent of
    a build) but its elements are large (hundreds of Eh for (H2O)16), so its fp32 error would
    be the largest error of an fp32 Fock matrix: J always runs in fp64. The tensor stays in
    fp64; K is contracted in the kernel set's precision, and both are summed in fp64."""

    def __init__(self, tensor: JkTensor, kernel_set: KernelSet,
                 coulomb_set: KernelSet | None = None, work_bytes: int = DEFAULT_WORK_BYTES):
        self.tensor = tensor
        self.kernel_set = kernel_set
        self.coulomb_set = coulomb_set if coulomb_set is not None else kernel_set
        self.work_bytes = work_bytes
        self.builds: list[JkBuild] = []
        self._buffers: dict[tuple, torch.Tensor] = {}

    def build(self, dms: np.ndarray, factors: list[list[DensityFactor]] | None,
              with_j: bool = True, with_k: bool = True, k_scale: float = 1.0
              ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """J and ``k_scale`` K (a hybrid functional's exact-exchange share) of densities
        ``dms`` (nset, nao, nao), whose exchange goes through ``factors`` (one list per
        density)."""
        start = time.perf_counter()
        nset, nao, _ = dms.shape
        columns = sum(f.left.shape[1] * (1 if f.right is None else 2)
                      for fs in (factors if with_k else []) for f in fs)
        small = 3.0 * self.tensor.width * nao * nao * max(columns, nset) < SINGLE_THREAD_WORK
        ledgers = {id(s.accounting): s.accounting for s in (self.kernel_set, self.coulomb_set)}
        before = {key: ledger.snapshot() for key, ledger in ledgers.items()}
        with single_threaded_ops() if small else contextlib.nullcontext():
            vj, vk = self._build(dms, factors, with_j, with_k, k_scale, columns)
        self.builds.append(JkBuild(time.perf_counter() - start, self.kernel_set.precision,
                                   _executors_since(ledgers, before), columns))
        return vj, vk

    def _build(self, dms: np.ndarray, factors: list[list[DensityFactor]] | None,
               with_j: bool, with_k: bool, k_scale: float, columns: int
               ) -> tuple[np.ndarray | None, np.ndarray | None]:
        nset, nao, _ = dms.shape
        ks, js = self.kernel_set, self.coulomb_set
        pairs = self.tensor.pairs
        vj = np.zeros((nset, len(pairs.stored))) if with_j else None
        vk = np.zeros((nset, nao, nao)) if with_k else None
        density = torch.as_tensor(
            (dms + dms.transpose(0, 2, 1))[:, pairs.stored_mu, pairs.stored_nu],
            dtype=js.dtype, device=js.device) if with_j else None
        sides = [(n, f.sign, torch.as_tensor(f.left, dtype=ks.dtype, device=ks.device),
                  None if f.right is None else
                  torch.as_tensor(f.right, dtype=ks.dtype, device=ks.device))
                 for n, fs in enumerate(factors if with_k else []) for f in fs]
        for w0, w1 in self._windows(nao, max(columns, 1)):
            sums = [(s0, min(w1, s0 + SUMMATION_BLOCK)) for s0 in range(w0, w1, SUMMATION_BLOCK)]
            halves = [[self._halves(nao, slot, j, s1 - s0, left, right)
                       for slot, (_, _, left, right) in enumerate(sides)]
                      for j, (s0, s1) in enumerate(sums)]
            rho = [torch.zeros((nset, s1 - s0), dtype=js.dtype, device=js.device)
                   for s0, s1 in sums]
            self._half_transform(w0, w1, sums, density, sides, halves, rho)
            for block_halves in halves:
                self._exchange(sides, block_halves, vk, k_scale, nao)
            if with_j:
                self._coulomb(rho, w0, w1, sums, vj)
        if with_k:
            for n, fs in enumerate(factors):
                if all(f.right is None for f in fs):
                    vk[n] = _symmetric_from_lower(vk[n])
        if with_j:
            square = np.zeros((nset, nao, nao))
            square[:, pairs.stored_mu, pairs.stored_nu] = vj
            vj = square + square.transpose(0, 2, 1)
        return vj, vk

    def _windows(self, nao: int, columns: int) -> list[tuple[int, int]]:
        """The fit functions taken at once: as many whole summation blocks as the work budget
        holds of their G (and, from a tensor file, of their rows read), at least one. Each
        AO function's pairs are gathered once per window, and a file's narrow column chunks
        are read in fewer, wider pieces. Only this span follows the budget."""
        width = self.tensor.width
        itemsize = torch.tensor([], dtype=self.kernel_set.dtype).element_size()
        per_aux = itemsize * 2 * nao * columns
        if self.tensor.store.location != "memory":
            per_aux += FP64_BYTES * max(len(chunk.stored) for chunk in self.tensor.pairs.chunks)
        span = SUMMATION_BLOCK * max(1, self.work_bytes // (per_aux * SUMMATION_BLOCK))
        return [(w0, min(width, w0 + span)) for w0 in range(0, width, span)]

    def _half_transform(self, w0: int, w1: int, sums: list[tuple[int, int]],
                        density: torch.Tensor | None, sides: list, halves: list,
                        rho: list[torch.Tensor]) -> None:
        """Each summation block's G (and, with ``density`` = D + D^T on the stored pairs,
        its fitted density rho) from the tensor's window [w0, w1), chunk by chunk."""
        js = self.coulomb_set
        pairs = self.tensor.pairs
        for index, chunk in enumerate(pairs.chunks):
            window = self.tensor.chunk(index, w0, w1)
            if density is not None:
                for j, (s0, s1) in enumerate(sums):
                    rho[j] += js.gemm(density[:, chunk.stored.start:chunk.stored.stop],
                                      window[:, s0 - w0:s1 - w0].to(dtype=js.dtype,
                                                                    device=js.device))
            if sides:
                self._transform_chunk(index, window, sides,
                                      [(block_halves, s0 - w0, s1 - w0)
                                       for block_halves, (s0, s1) in zip(halves, sums)])
        for block_halves in halves:
            for g_left, g_right in block_halves:
                for g in (g_left, g_right):
                    if g is not None:
                        g[pairs.unpaired] = 0.0

    def _transform_chunk(self, index: int, rows: torch.Tensor, sides: list,
                         targets: list) -> None:
        """Every AO function's part of G from one chunk's rows (fp64, the window's fit
        functions), the functions dealt to the host's threads (:meth:`_function_shares`)."""
        shares = self._function_shares(self.tensor.pairs.chunks[index])
        if len(shares) == 1:
            self._transform_functions(index, rows, sides, targets, shares[0], 0)
            return
        with single_threaded_ops(), ThreadPoolExecutor(max_workers=len(shares)) as pool:
            list(pool.map(lambda worker: self._transform_functions(
                index, rows, sides, targets, shares[worker], worker), range(len(shares))))

    def _function_shares(self, chunk_pairs) -> list[list[int]]:
        """The chunk's AO functions dealt to the threads, by number of pairs. On the host each
        function's products are thin (nocc rows by its partners by a summation block), and
        BLAS's two threads on one such product gained little: the half transform of a
        (H2O)16 build took 0.42-0.48 s that way, 0.32-0.37 s with the functions dealt to two
        threads of one BLAS thread each (docs/performance.md). A function is done by one
        thread, in the same calls whatever the deal, so the bits do not follow it."""
        functions = [int(mu) for mu in chunk_pairs.functions]
        workers = torch.get_num_threads() if self.kernel_set.executor == "torch-cpu" else 1
        if workers < 2 or len(functions) < 2 * workers:
            return [functions]
        starts = chunk_pairs.starts
        shares = deal_pairs(functions, lambda mu: starts[mu + 1] - starts[mu], workers)
        return [sorted(share) for share in shares if share]

    def _transform_functions(self, index: int, rows: torch.Tensor, sides: list,
                             targets: list, functions: list[int], worker: int) -> None:
        """Functions' parts of G from one chunk: each one's pairs gathered once where the
        tensor is, then for each summation block of ``targets`` (its G and its columns in the
        window) times the factor's rows of their partners; written at the function's first
        chunk, added at later ones. Each block's product is the same whatever the window, so
        are its bits. ``worker`` names this thread's work arrays."""
        ks = self.kernel_set
        chunk_pairs = self.tensor.pairs.chunks[index]
        partners_on_device = self._device_partners(index)
        first = self.tensor.pairs.first_chunk
        width = rows.shape[1]
        gathered = self._buffer(("gathered", worker), (self.tensor.layout.nao + 1) * width,
                                rows.dtype, rows.device)
        for mu in functions:
            a, b = chunk_pairs.starts[mu], chunk_pairs.starts[mu + 1]
            block = self._in_kernel_precision(torch.index_select(
                rows, 0, chunk_pairs.rows[a:b], out=gathered[:(b - a) * width].view(b - a, -1)),
                worker)
            partners = partners_on_device[a:b]
            for slot, (_, _, left, right) in enumerate(sides):
                for side, factor in enumerate((left, right)):
                    if factor is None:
                        continue
                    transposed = factor[partners].T
                    for block_halves, b0, b1 in targets:
                        g = block_halves[slot][side][mu]
                        if first[mu] == index:
                            ks.gemm(transposed, block[:, b0:b1], out=g)
                        else:
                            g += ks.gemm(transposed, block[:, b0:b1])

    def _device_partners(self, index: int) -> torch.Tensor:
        """One chunk's partner index on the kernel set's device."""
        partners = self.tensor.pairs.chunks[index].partners
        device = self.kernel_set.device
        if partners.device == device:
            return partners
        key = ("partners", index, device)
        if key not in self._buffers:
            self._buffers[key] = partners.to(device)
        return self._buffers[key]

    def _exchange(self, sides: list, block_halves: list, vk: np.ndarray, k_scale: float,
                  nao: int) -> None:
        """One summation block's K, in the kernel set's precision, added to ``vk`` in fp64."""
        ks = self.kernel_set
        for (n, sign, _, _), (g_left, g_right) in zip(sides, block_halves):
            g_left = g_left.reshape(nao, -1)
            if g_right is None:
                product = torch.tril(ks.syrk(g_left, 1).to(torch.float64))
            else:
                product = ks.gemm(g_left, g_right.reshape(nao, -1).T).to(torch.float64)
            vk[n] += sign * k_scale * product.cpu().numpy()

    def _in_kernel_precision(self, block: torch.Tensor, worker: int) -> torch.Tensor:
        """One function's gathered rows in the exchange kernels' dtype and device. A
        conversion goes into storage kept from build to build (one per thread): a fresh
        array per function would be paid again in page faults every build."""
        ks = self.kernel_set
        if block.dtype == ks.dtype and block.device == ks.device:
            return block
        staging = self._buffer(("staging", worker),
                               (self.tensor.layout.nao + 1) * block.shape[1])
        return staging[:block.numel()].view(block.shape).copy_(block)

    def _buffer(self, name: tuple, numel: int, dtype: torch.dtype | None = None,
                device: torch.device | None = None) -> torch.Tensor:
        """Storage kept from build to build, in the kernel set's dtype and device unless
        given."""
        dtype = dtype if dtype is not None else self.kernel_set.dtype
        device = device if device is not None else self.kernel_set.device
        key = (*name, dtype, device, numel)
        if key not in self._buffers:
            self._buffers[key] = torch.empty(numel, dtype=dtype, device=device)
        return self._buffers[key]

    def _halves(self, nao: int, slot: int, index: int, width: int, left: torch.Tensor,
                right: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """G of one factor (and of its right side) for summation block ``index`` of a
        window."""
        return (self._half(nao, left.shape[1], width, (2 * slot, index)),
                None if right is None else
                self._half(nao, right.shape[1], width, (2 * slot + 1, index)))

    def _half(self, nao: int, columns: int, naux: int, slot: tuple[int, int]) -> torch.Tensor:
        """G (nao, columns, naux) for one summation block, in storage kept from build to build
        and sized for a whole block, so that a narrower last block reuses it (a fresh 100 MB
        array would be paid again in page faults every cycle); every row is written before
        it is added to, so it needs no zeroing."""
        key = (slot, nao, columns, self.kernel_set.dtype, self.kernel_set.device)
        if key not in self._buffers:
            self._buffers = {k: v for k, v in self._buffers.items() if k[0] != slot}
            self._buffers[key] = torch.empty(
                nao * columns * min(SUMMATION_BLOCK, self.tensor.width),
                dtype=self.kernel_set.dtype, device=self.kernel_set.device)
        return self._buffers[key][:nao * columns * naux].view(nao, columns, naux)

    def _coulomb(self, rho: list[torch.Tensor], w0: int, w1: int,
                 sums: list[tuple[int, int]], vj: np.ndarray) -> None:
        """vj[:, pair] += sum_P X_P[pair] rho_P over the stored pairs, one summation block
        after the other."""
        js = self.coulomb_set
        for index, chunk in enumerate(self.tensor.pairs.chunks):
            window = self.tensor.chunk(index, w0, w1)
            for j, (s0, s1) in enumerate(sums):
                rows = window[:, s0 - w0:s1 - w0].to(dtype=js.dtype, device=js.device)
                part = js.gemm(rows, rho[j].T).to(torch.float64)
                vj[:, chunk.stored.start:chunk.stored.stop] += part.cpu().numpy().T


def _executors_since(ledgers: dict, before: dict) -> str:
    """Where a build's kernel calls ran, from the ledgers' counts: ``+``-joined executors
    (an NKI build's K on ``nki-interpreter`` and its fp64 J on ``torch-cpu``; a K that fell
    back shows its torch executor), ``none`` for a build that called no kernel."""
    ran = {executor for key, ledger in ledgers.items()
           for _, executor in ledger.since(before[key])[0]}
    return "+".join(sorted(ran)) or "none"


def _symmetric_from_lower(lower: np.ndarray) -> np.ndarray:
    return lower + np.tril(lower, -1).T

