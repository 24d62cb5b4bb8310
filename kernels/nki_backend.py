"""The kernel set on NKI: fp32 kernels run through :class:`kernels.nki.launcher.Launcher`.

Same methods and attributes as :class:`kernels.torch_backend.TorchKernels` (torch tensors in and
out; energies as Python floats summed in fp64 on the host). The host side here:

- makes the kernel layouts (lhsT for gemm, L^T and the fp64 inverses of the 128x128 diagonal
  blocks of L for trsm, cached per metric tensor);
- pads every dimension to a canonical size so that one molecule needs few compiled kernels:
  sizes round up to the ladder 128 x {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, ...} (zero
  rows / columns contribute exactly zero); naux rounds up to a multiple of 128 (one value per
  run); the energy kernels take groups of G occupied orbitals per side, G a power of two, padded
  orbitals carrying zero B columns (or zero T) and finite denominators;
- splits work that would unroll too many instructions or overflow SBUF into several launches
  of the same signature (gemm: row / column / contraction chunks; syrk: diagonal syrk blocks
  plus gemm off-diagonal blocks; trsm: column chunks, one launch whenever the instruction budget
  allows; energies: G x G tiles of the pair space, diagonal tiles with ``lower_pairs=1``;
  opposite-spin energies: (rows x cols) chunks of the flat (i, a) x (j, b) block);
- reduces the energy kernels' per-partition partials in fp64 and applies the pair weights.

A kernel failure falls back to the torch fp32 kernel with a warning and a count in the
accounting (never silently); with ``DFMP2_REQUIRE_NKI=1`` it raises instead.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np
import torch

from kernels.accounting import KernelAccounting, NkiRequired
from kernels.nki.launcher import Launcher
from kernels.torch_backend import TorchKernels, resolve_device



TILE = 128
# Canonical sizes: 128 times these factors (ratio <= 1.5 between neighbours).
LADDER_FACTORS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)

# gemm launch limits (see kernels/nki/gemm.py)
GEMM_MAX_M = 512  # output rows per launch
GEMM_MAX_N = 1024  # output columns per launch (2 PSUM banks per row block)
GEMM_MAX_K = 8192  # contraction per launch; larger K is chunked and summed on the host
RESIDENT_BYTES = 96 * 1024  # per-partition SBUF for the resident strip of gemm / syrk

# syrk launch limit (see kernels/nki/syrk.py)
SYRK_MAX_N = 1024

# Per-launch instruction budgets (unrolled instructions of one kernel launch).
TRSM_MAX_INSTRUCTIONS = 8192
ENERGY_MAX_INSTRUCTIONS = 8192
ENERGY_GROUPS = (1, 2, 4, 8, 16, 32)  # orbitals per side of one energy launch
# per-partition SBUF budget of one energy launch (trn1 has 192 KiB; keep headroom)
ENERGY_SBUF_BYTES = 176 * 1024
ENERGY_STRIP_BYTES = 49152  # = STRIP_BYTES of kernels/nki/mp2_energy_fused.py
# opposite-spin energy launches (kernels/nki/mp2_energy_os.py, mp2_energy_os_fused.py)
OS_MAX_COLS = 2048  # beta (j, b) columns per launch: 4 PSUM banks of 512 per row tile
OS_STRIP_BYTES = 98304  # = STRIP_BYTES of kernels/nki/mp2_energy_os_fused.py


def ladder(size: int, cap: int | None = None) -> int:
    """The canonical size for ``size`` (>= 1): the smallest ladder value >= size. With ``cap``
    (a ladder value) sizes above it become a multiple of ``cap`` (the host then launches
    ``size / cap`` chunks of the same signature)."""
    size = max(1, int(size))
    if cap is not None and size > cap:
        return cap * math.ceil(size / cap)
    for f in LADDER_FACTORS:
        if TILE * f >= size:
            return TILE * f
    top = TILE * LADDER_FACTORS[-1]
    return top * math.ceil(size / top)


def ladder_floor(limit: int) -> int:
    """The largest ladder value <= limit (at least 128)."""
    best = TILE
    for f in LADDER_FACTORS:
        if TILE * f <= limit:
            best = TILE * f
    return best


def round_up(size: int, multiple: int) -> int:
    return multiple * max(1, math.ceil(size / multiple))


def _np32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float32).numpy()


def _np64(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def _padded(array: np.ndarray, rows: int, cols: int) -> np.ndarray:
    out = np.zeros((rows, cols), dtype=np.float32)
    out[:array.shape[0], :array.shape[1]] = array
    return out


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def _single(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class NkiKernels:
    """The kernel set on NKI (fp32), with the same interface as TorchKernels."""

    precision = "fp32"
    dtype = torch.float32
    backend = "nki"

    def __init__(self, accounting: KernelAccounting | None = None,
                 device: torch.device | None = None, launcher: Launcher | None = None,
                 require_nki: bool = False) -> None:
        self.require_nki = require_nki
        self.accounting = accounting if accounting is not None else KernelAccounting()
        self.device = device if device is not None else resolve_device(None)
        self.launcher = launcher if launcher is not None else Launcher()
        self.executor = self.launcher.executor
        self._torch = TorchKernels(precision="fp32", device=self.device, accounting=self.accounting)
        self._trsm_cache: tuple | None = None

    # ------------------------------------------------------------------ plumbing
    def _launch(self, kernel_name: str, *args) -> np.ndarray:
        kernel = self.launcher.kernel(kernel_name)
        return np.asarray(_single(self.launcher.launch(kernel_name, kernel, *args)),
                          dtype=np.float32)

    def _run(self, kernel: str, nki_call: Callable, torch_call: Callable):
        """Run ``nki_call``; on failure warn, count a fallback and run ``torch_call`` (which
        records itself under the torch executor), unless NKI is required."""
        try:
            result = nki_call()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if self.require_nki:
                raise NkiRequired(
                    f"NKI kernel {kernel} failed on {self.executor} and NKI is required "
                    f"(DFMP2_REQUIRE_NKI=1), so there is no torch fallback: {reason}") from exc
            warnings.warn(f"NKI kernel {kernel} failed on {self.executor}; falling back to torch "
                          f"fp32: {reason}", RuntimeWarning, stacklevel=3)
            self.accounting.record_fallback(kernel, reason)
            return torch_call()
        self.accounting.record(kernel, self.executor)
        return result

    def _out(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    # ------------------------------------------------------------------ gemm
    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self._run("gemm", lambda: self._gemm(a, b),
                         lambda: self._torch.gemm(a.to(torch.float32), b.to(torch.float32)))

    def _gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if b.dim() == 3:
            # a (m, k) times each b[p] (k, n): one launch on b laid out as (k, p*n).
            nb, k, n = b.shape
            m = a.shape[0]
            moving = np.ascontiguousarray(_np32(b).transpose(1, 0, 2).reshape(k, nb * n))
            c = self.matmul_lhs_t(np.ascontiguousarray(_np32(a).T), moving)
            return self._out(np.ascontiguousarray(c.reshape(m, nb, n).transpose(1, 0, 2)))
        *batch, m, k = a.shape
        n = b.shape[1]
        a_t = np.ascontiguousarray(_np32(a.reshape(-1, k)).T)  # lhsT (k, rows)
        c = self.matmul_lhs_t(a_t, _np32(b))
        return self._out(c.reshape(*batch, m, n))

    def matmul_lhs_t(self, a_t: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``a_t.T @ b`` (fp32 numpy) through gemm_kernel launches of canonical shapes."""
        k, m = a_t.shape
        n = b.shape[1]
        if m == 0 or n == 0 or k == 0:
            return np.zeros((m, n), dtype=np.float32)
        kp = ladder(k, GEMM_MAX_K)
        kc = min(kp, GEMM_MAX_K)
        kt = kc // TILE
        n_cap = ladder_floor(min(GEMM_MAX_N, RESIDENT_BYTES // (4 * kt)))
        np_ = ladder(n, n_cap)
        nc = min(np_, n_cap)
        mp = ladder(m, GEMM_MAX_M)
        mc = min(mp, GEMM_MAX_M)
        a_pad = _padded(a_t, kp, mp)
        b_pad = _padded(b, kp, np_)
        out = np.zeros((mp, np_), dtype=np.float64 if kp > kc else np.float32)
        for k0 in range(0, kp, kc):
            for m0 in range(0, mp, mc):
                a_chunk = np.ascontiguousarray(a_pad[k0:k0 + kc, m0:m0 + mc])
                for n0 in range(0, np_, nc):
                    b_chunk = np.ascontiguousarray(b_pad[k0:k0 + kc, n0:n0 + nc])
                    out[m0:m0 + mc, n0:n0 + nc] += self._launch("gemm", a_chunk, b_chunk)
        return np.asarray(out[:m, :n], dtype=np.float32)

    # ------------------------------------------------------------------ syrk
    def syrk(self, a: torch.Tensor, block: int) -> torch.Tensor:
        return self._run("syrk", lambda: self._syrk(a),
                         lambda: self._torch.syrk(a.to(torch.float32), block))

    def _syrk(self, a: torch.Tensor) -> torch.Tensor:
        n, k = a.shape
        if n == 0 or k == 0:
            return self._out(np.zeros((n, n), dtype=np.float32))
        a_t = np.ascontiguousarray(_np32(a).T)  # (k, n): contraction on partitions
        kp = ladder(k, GEMM_MAX_K)
        kc = min(kp, GEMM_MAX_K)
        kt = kc // TILE
        s_cap = ladder_floor(min(SYRK_MAX_N, RESIDENT_BYTES // (4 * kt)))
        np_ = ladder(n, s_cap)
        s = min(np_, s_cap)
        a_pad = _padded(a_t, kp, np_)
        c = np.zeros((np_, np_), dtype=np.float64 if kp > kc else np.float32)
        for k0 in range(0, kp, kc):
            for i0 in range(0, np_, s):
                diag = np.ascontiguousarray(a_pad[k0:k0 + kc, i0:i0 + s])
                c[i0:i0 + s, i0:i0 + s] += self._launch("syrk", diag)
        for i0 in range(s, np_, s):  # off-diagonal blocks below the diagonal through gemm
            for j0 in range(0, i0, s):
                c[i0:i0 + s, j0:j0 + s] += self.matmul_lhs_t(a_pad[:, i0:i0 + s],
                                                              a_pad[:, j0:j0 + s])
        c = np.asarray(c[:n, :n], dtype=np.float32)
        # The kernel computes 128-blocks on and below the diagonal (zeros above); mirror them so
        # that every block of any ``block`` size is defined (a @ a.T is symmetric).
        blk = np.arange(n) // TILE
        upper = blk[None, :] > blk[:, None]
        c[upper] = c.T[upper]
        return self._out(c)

    # ------------------------------------------------------------------ trsm
    def trsm(self, l: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        x = self._run("trsm", lambda: self._trsm(l, b),
                      lambda: self._torch.trsm(l.to(torch.float32), b.to(torch.float32)))
        return x if out is None else out.copy_(x)

    def _trsm_prepare(self, l: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """L^T (padded with an identity block) and the stacked inv(L_kk)^T blocks, in fp32 from
        fp64 inverses; cached for the metric tensor ``l`` (same object, same version)."""
        key = (id(l), getattr(l, "_version", 0), tuple(l.shape), l.data_ptr())
        cached = self._trsm_cache
        if cached is not None and cached[0] is l and cached[1] == key:
            return cached[2], cached[3]
        n = l.shape[0]
        npad = round_up(n, TILE)
        lp = np.eye(npad, dtype=np.float64)
        lp[:n, :n] = np.tril(_np64(l))
        dinv_t = np.zeros((npad, TILE), dtype=np.float64)
        eye = torch.eye(TILE, dtype=torch.float64)
        for k0 in range(0, npad, TILE):
            blk = torch.from_numpy(lp[k0:k0 + TILE, k0:k0 + TILE])
            inv = torch.linalg.solve_triangular(blk, eye, upper=False).numpy()
            dinv_t[k0:k0 + TILE] = inv.T
        lt = np.ascontiguousarray(lp.T, dtype=np.float32)
        dinv = np.ascontiguousarray(dinv_t, dtype=np.float32)
        self._trsm_cache = (l, key, lt, dinv)
        return lt, dinv

    def _trsm(self, l: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = l.shape[0]
        vector = b.dim() == 1
        b2 = b.reshape(n, -1)
        m = b2.shape[1]
        if n == 0 or m == 0:
            return self._out(np.zeros(tuple(b.shape), dtype=np.float32))
        lt, dinv_t = self._trsm_prepare(l)
        npad = lt.shape[0]
        nb = npad // TILE
        per_strip = nb * (nb - 1) + 7 * nb  # DMA + matmul per L block, 7 per diagonal block
        strips = max(1, TRSM_MAX_INSTRUCTIONS // per_strip)
        cap = ladder_floor(strips * 512)
        mp = ladder(m, cap)
        mc = min(mp, cap)
        b_pad = _padded(_np32(b2), npad, mp)
        x = np.empty((npad, mp), dtype=np.float32)
        for c0 in range(0, mp, mc):
            x[:, c0:c0 + mc] = self._launch("trsm", lt, dinv_t,
                                            np.ascontiguousarray(b_pad[:, c0:c0 + mc]))
        out = x[:n, :m]
        return self._out(out.reshape(n) if vector else out)

    # ------------------------------------------------------------------ energies
    def mp2_energy(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                   denom_col: torch.Tensor, nvir: int, lower_pairs: bool) -> tuple[float, float]:
        return self._run(
            "mp2_energy",
            lambda: self._energy(None, None, pair_block, denom_row, denom_col, nvir, lower_pairs),
            lambda: self._torch.mp2_energy(pair_block.to(torch.float32), denom_row, denom_col,
                                           nvir, lower_pairs))

    def mp2_energy_fused(self, b_row: torch.Tensor, b_col: torch.Tensor, denom_row: torch.Tensor,
                         denom_col: torch.Tensor, nvir: int,
                         lower_pairs: bool) -> tuple[float, float]:
        return self._run(
            "mp2_energy",
            lambda: self._energy(b_row, b_col, None, denom_row, denom_col, nvir, lower_pairs),
            lambda: self._torch.mp2_energy_fused(b_row.to(torch.float32),
                                                 b_col.to(torch.float32), denom_row, denom_col,
                                                 nvir, lower_pairs))

    def mp2_energy_os(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                      denom_col: torch.Tensor, nvir_row: int, nvir_col: int) -> float:
        return self._run(
            "mp2_energy",
            lambda: self._energy_os(None, None, pair_block, denom_row, denom_col, nvir_row,
                                    nvir_col),
            lambda: self._torch.mp2_energy_os(pair_block.to(torch.float32), denom_row,
                                              denom_col, nvir_row, nvir_col))

    def mp2_energy_os_fused(self, b_row: torch.Tensor, b_col: torch.Tensor,
                            denom_row: torch.Tensor, denom_col: torch.Tensor, nvir_row: int,
                            nvir_col: int) -> float:
        return self._run(
            "mp2_energy",
            lambda: self._energy_os(b_row, b_col, None, denom_row, denom_col, nvir_row,
                                    nvir_col),
            lambda: self._torch.mp2_energy_os_fused(b_row.to(torch.float32),
                                                    b_col.to(torch.float32), denom_row,
                                                    denom_col, nvir_row, nvir_col))

    @staticmethod
    def energy_pair_instructions(nvir: int, x_tiles: int, fused: bool) -> int:
        """Unrolled instructions per (i, j) pair of the energy kernels (for launch sizing)."""
        a_tiles = math.ceil(nvir / TILE)
        b_tiles = math.ceil(nvir / 512)
        subs = math.ceil(nvir / TILE)
        count = a_tiles * subs + 7 * a_tiles * b_tiles  # transposes + Vector work
        if fused:
            resident = x_tiles * nvir * 4 <= ENERGY_STRIP_BYTES
            dma = x_tiles if resident else a_tiles * x_tiles * (1 + b_tiles)
            count += dma + a_tiles * x_tiles * b_tiles + a_tiles * b_tiles
        else:
            count += a_tiles
        return count

    @classmethod
    def energy_group(cls, nvir: int, x_tiles: int, n_orb: int, fused: bool) -> int:
        """Orbitals per side of one energy launch: the largest G of ENERGY_GROUPS within the
        instruction and SBUF budgets, and no larger than n_orb needs."""
        a_tiles = math.ceil(nvir / TILE)
        b_tiles = math.ceil(nvir / 512)
        per_pair = cls.energy_pair_instructions(nvir, x_tiles, fused)
        need = _pow2_ceil(n_orb)
        best = 1
        for g in ENERGY_GROUPS:
            if g > need:
                break
            instructions = g * g * per_pair + g * (x_tiles + 3 * b_tiles + a_tiles) + 8
            slots = g * g * a_tiles * b_tiles * 2
            sbuf = (2 * a_tiles * nvir + g * nvir + slots + g * a_tiles) * 4 + 24 * 1024
            if fused and x_tiles * nvir * 4 <= ENERGY_STRIP_BYTES:
                sbuf += 2 * x_tiles * nvir * 4
            if g == 1 or (instructions <= ENERGY_MAX_INSTRUCTIONS and sbuf <= ENERGY_SBUF_BYTES):
                best = g
            else:
                break
        return best

    def _energy(self, b_row, b_col, pair_block, denom_row, denom_col, nvir: int,
                lower_pairs: bool) -> tuple[float, float]:
        fused = pair_block is None
        nvir = int(nvir)
        if fused:
            ni, nj = b_row.shape[1] // nvir, b_col.shape[1] // nvir
        else:
            ni, nj = pair_block.shape[0] // nvir, pair_block.shape[1] // nvir
        if ni == 0 or nj == 0:
            return 0.0, 0.0
        if lower_pairs and ni != nj:
            raise ValueError(f"lower_pairs needs a diagonal block, got {ni} x {nj} orbitals")
        dr = _np64(denom_row).reshape(ni, nvir)
        dc = _np64(denom_col).reshape(nj, nvir)
        # Padded orbitals: zero B columns / T entries, and denominators that keep every D of the
        # tile finite with |D| >= 1 (their T is zero, so they add exactly zero).
        pad_row = -(float(np.abs(dc).max()) + 1.0)
        pad_col = -(float(np.abs(dr).max()) + 1.0)

        if fused:
            naux = b_row.shape[0]
            xp = round_up(naux, TILE)
            x_tiles = xp // TILE
        else:
            x_tiles = 0
        g = self.energy_group(nvir, x_tiles, max(ni, nj), fused)
        # rows and columns of one launch: g orbitals, fewer (a power of two) for a small side
        gr = g if lower_pairs else min(g, _pow2_ceil(ni))
        gc = g if lower_pairs else min(g, _pow2_ceil(nj))
        ni_p, nj_p = round_up(ni, gr), round_up(nj, gc)
        dr_p = np.full((ni_p, nvir), pad_row, dtype=np.float32)
        dr_p[:ni] = dr
        dc_p = np.full((nj_p, nvir), pad_col, dtype=np.float32)
        dc_p[:nj] = dc
        if fused:
            br = _padded(_np32(b_row), xp, ni_p * nvir)
            bc = br if (lower_pairs and b_col is b_row) else _padded(_np32(b_col), xp, nj_p * nvir)
        else:
            t = _padded(_np32(pair_block), ni_p * nvir, nj_p * nvir)

        a_tiles = math.ceil(nvir / TILE)
        b_tiles = math.ceil(nvir / 512)
        lower_w = np.tril(np.full((g, g), 2.0), -1) + np.eye(g)
        direct = 0.0
        exchange = 0.0
        wr, wc = gr * nvir, gc * nvir
        for it in range(ni_p // gr):
            for jt in range(nj_p // gc):
                if lower_pairs and jt > it:
                    continue
                diag = bool(lower_pairs and it == jt)
                flag = 1 if diag else 0
                rows = slice(it * wr, (it + 1) * wr)
                cols = slice(jt * wc, (jt + 1) * wc)
                d_row = np.ascontiguousarray(dr_p[it * gr:(it + 1) * gr].reshape(wr, 1))
                d_col = np.ascontiguousarray(dc_p[jt * gc:(jt + 1) * gc])
                if fused:
                    out = self._launch("mp2_energy_fused", np.ascontiguousarray(br[:, rows]),
                                       np.ascontiguousarray(bc[:, cols]), d_row, d_col, flag)
                else:
                    out = self._launch("mp2_energy", np.ascontiguousarray(t[rows, cols]),
                                       d_row, d_col, flag)
                sums = out.astype(np.float64).reshape(TILE, gr, gc, a_tiles, b_tiles, 2)
                sums = sums.sum(axis=(0, 3, 4))
                weights = lower_w if diag else (2.0 if lower_pairs else 1.0)
                direct += float(np.sum(weights * sums[..., 0]))
                exchange += float(np.sum(weights * sums[..., 1]))
        return direct, exchange

    @staticmethod
    def os_row_instructions(n_cols: int, x_tiles: int, fused: bool) -> int:
        """Unrolled instructions per 128-row tile of an opposite-spin launch of n_cols columns."""
        c_tiles = math.ceil(n_cols / 512)
        count = 1 + 5 * c_tiles  # row denominators; Vector work per T tile
        if not fused:
            return count + 1  # one DMA of the T strip
        if x_tiles * (n_cols + TILE) * 4 <= OS_STRIP_BYTES:
            return count + x_tiles + c_tiles * x_tiles  # b_row strip DMAs, matmuls
        groups = math.ceil(c_tiles / 4)
        return count + groups * x_tiles + 2 * c_tiles * x_tiles  # streamed tiles

    def _energy_os(self, b_row, b_col, pair_block, denom_row, denom_col, nvir_row: int,
                   nvir_col: int) -> float:
        """Opposite-spin direct sum over the flat (rows x cols) block: the denominator is
        separable and there is no exchange or pair weight, so launches are plain 2-D tiles of
        the (i, a) x (j, b) matrix, padded to ladder sizes."""
        fused = pair_block is None
        nvir_row, nvir_col = int(nvir_row), int(nvir_col)
        if fused:
            rows, cols = b_row.shape[1], b_col.shape[1]
        else:
            rows, cols = pair_block.shape
        if rows == 0 or cols == 0:
            return 0.0
        if nvir_row <= 0 or nvir_col <= 0 or rows % nvir_row or cols % nvir_col:
            raise ValueError(f"block of {rows} x {cols} is not whole orbitals of "
                             f"{nvir_row} x {nvir_col} virtuals")
        if fused and b_row.shape[0] != b_col.shape[0]:
            raise ValueError(f"b_row has {b_row.shape[0]} auxiliary rows, b_col "
                             f"{b_col.shape[0]}")
        dr = _np64(denom_row).reshape(-1)
        dc = _np64(denom_col).reshape(-1)
        if dr.size != rows or dc.size != cols:
            raise ValueError(f"denominators of {dr.size} and {dc.size} values for a "
                             f"{rows} x {cols} block")
        # Padded rows / columns: zero B columns (or zero T) and denominators that keep every D
        # of the tile finite with |D| >= 1 (their T is zero, so they add exactly zero).
        pad_row = -(float(np.abs(dc).max()) + 1.0)
        pad_col = -(float(np.abs(dr).max()) + 1.0)

        x_tiles = round_up(b_row.shape[0], TILE) // TILE if fused else 0
        col_cap = OS_MAX_COLS
        if fused:
            col_cap = min(col_cap, ladder_floor(OS_STRIP_BYTES // (4 * x_tiles) - TILE))
        cp = ladder(cols, col_cap)
        cc = min(cp, col_cap)
        c_tiles = math.ceil(cc / 512)
        fixed = 8 + 2 * c_tiles + x_tiles
        per_row = self.os_row_instructions(cc, x_tiles, fused)
        row_cap = ladder_floor(TILE * max(1, (ENERGY_MAX_INSTRUCTIONS - fixed) // per_row))
        rp = ladder(rows, row_cap)
        rc = min(rp, row_cap)

        dr_p = np.full(rp, pad_row, dtype=np.float32)
        dr_p[:rows] = dr
        dc_p = np.full(cp, pad_col, dtype=np.float32)
        dc_p[:cols] = dc
        if fused:
            br = _padded(_np32(b_row), x_tiles * TILE, rp)
            bc = _padded(_np32(b_col), x_tiles * TILE, cp)
        else:
            t = _padded(_np32(pair_block), rp, cp)

        direct = 0.0
        for r0 in range(0, rp, rc):
            d_row = np.ascontiguousarray(dr_p[r0:r0 + rc].reshape(rc, 1))
            if fused:
                b_r = np.ascontiguousarray(br[:, r0:r0 + rc])
            for c0 in range(0, cp, cc):
                d_col = np.ascontiguousarray(dc_p[c0:c0 + cc].reshape(1, cc))
                if fused:
                    out = self._launch("mp2_energy_os_fused", b_r,
                                       np.ascontiguousarray(bc[:, c0:c0 + cc]), d_row, d_col)
                else:
                    out = self._launch("mp2_energy_os",
                                       np.ascontiguousarray(t[r0:r0 + rc, c0:c0 + cc]),
                                       d_row, d_col)
                direct += float(out.astype(np.float64).sum())
        return direct

    # ------------------------------------------------------------------ record
    def report(self) -> dict:
        """JSON-friendly summary of the NKI launches for the run record."""
        launcher = self.launcher
        out: dict = {
            "nki_mode": launcher.mode,
            "executor": self.executor,
            "signatures": launcher.signatures,
            "launches": launcher.launch_counts(),
            "estimate": None,
            "instructions": None,
            "dma_bytes": None,
            "matmul_flops": None,
        }
        profile = launcher.profile
        if profile is not None:
            out["estimate"] = profile.estimate_trn1().as_dict()
            out["instructions"] = {k: int(v) for k, v in profile.instructions.items()}
            out["dma_bytes"] = int(profile.dma_bytes)
            out["matmul_flops"] = int(profile.matmul_flops)
        return out
