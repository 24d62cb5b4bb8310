"""The Kohn-Sham exchange-correlation integration split over the ranks of a distributed run.

Every rank runs the same SCF on the same grid (PySCF builds and prunes it identically on each).
:class:`SharedGridNumInt` integrates only this rank's contiguous share of the grid points and
sums the pieces over the ranks: the electron count, the exchange-correlation energy and the
potential matrix, O(nao^2) numbers per build. The sum reaches every rank with the same bits,
so the ranks' SCFs stay in step.

The response kernels of the stability check (``cache_xc_kernel``, ``nr_rks_fxc``,
``nr_uks_fxc``) are split the same way: the pointwise kernels this object caches belong to its
own share of the points, and only its own contractions, which then add up the potential over
the ranks, ever read them.
"""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
from pyscf import gto
from pyscf.dft import gen_grid, numint
from pyscf.gto.eval_gto import BLKSIZE

from dfmp2.system.distributed import World

REDUCING = "adding up the exchange-correlation integration"


class SharedGridNumInt(numint.NumInt):
    """PySCF's numerical integrator, each call over this rank's share of the grid points and
    its results summed over ``world``."""

    def __init__(self, world: World):
        super().__init__()
        self.world = world
        # The full grid the share was cut from (its point and screen arrays, by identity) and
        # the share: the SCF integrates on one grid every cycle, so it is cut once.
        self._source: tuple[Any, ...] = ()
        self._share: gen_grid.Grids | None = None

    def local_grids(self, grids: gen_grid.Grids) -> gen_grid.Grids:
        """A copy of ``grids`` holding only this rank's points, with the screen index PySCF
        computed for the full grid cut to them.

        The share is counted in PySCF's blocks of BLKSIZE (56) points, whose rows of the screen
        index (``non0tab``) it then keeps exactly, where a share cut mid-block would need the
        screen index evaluated again; and its length stays a multiple of 8 (PySCF pads the grid
        to 8 points), as PySCF's sparse contractions require."""
        if grids.coords is None:
            grids.build(with_non0tab=True)
        source = (grids, grids.coords, grids.weights, grids.non0tab, grids.screen_index)
        if self._share is None or any(a is not b for a, b in zip(self._source, source)):
            npoints = grids.weights.size
            blocks = self.world.share(-(-npoints // BLKSIZE))
            points = slice(blocks.start * BLKSIZE, min(blocks.stop * BLKSIZE, npoints))
            share = copy.copy(grids)
            share.coords = grids.coords[points]
            share.weights = grids.weights[points]
            for name in ("atm_idx", "quadrature_weights"):
                if getattr(grids, name) is not None:
                    setattr(share, name, getattr(grids, name)[points])
            rows = slice(blocks.start, blocks.stop)
            share.non0tab = None if grids.non0tab is None else grids.non0tab[rows]
            share.screen_index = (None if grids.screen_index is None
                                  else grids.screen_index[rows])
            self._source, self._share = source, share
        return self._share

    def nr_rks(self, mol: gto.Mole, grids: gen_grid.Grids, xc_code: str, dms, *args, **kwargs):
        return self._summed(super().nr_rks(mol, self.local_grids(grids), xc_code, dms, *args,
                                           **kwargs))

    def nr_uks(self, mol: gto.Mole, grids: gen_grid.Grids, xc_code: str, dms, *args, **kwargs):
        return self._summed(super().nr_uks(mol, self.local_grids(grids), xc_code, dms, *args,
                                           **kwargs))

    def nr_rks_fxc(self, mol: gto.Mole, grids: gen_grid.Grids, *args, **kwargs) -> np.ndarray:
        return self._summed((super().nr_rks_fxc(mol, self.local_grids(grids), *args,
                                                **kwargs),))[0]

    def nr_uks_fxc(self, mol: gto.Mole, grids: gen_grid.Grids, *args, **kwargs) -> np.ndarray:
        return self._summed((super().nr_uks_fxc(mol, self.local_grids(grids), *args,
                                                **kwargs),))[0]

    def cache_xc_kernel(self, mol: gto.Mole, grids: gen_grid.Grids, *args, **kwargs):
        """Density and kernels on this rank's points only (what its fxc contractions read)."""
        return super().cache_xc_kernel(mol, self.local_grids(grids), *args, **kwargs)

    def cache_xc_kernel1(self, mol: gto.Mole, grids: gen_grid.Grids, *args, **kwargs):
        """Density and kernels on this rank's points only (what its fxc contractions read)."""
        return super().cache_xc_kernel1(mol, self.local_grids(grids), *args, **kwargs)

    def _summed(self, parts: tuple) -> tuple:
        """``parts`` (numbers and real arrays) summed over the ranks in one allreduce, each in
        its own shape; a number comes back as a NumPy scalar, as PySCF returns it."""
        arrays = [np.asarray(part, dtype=np.float64) for part in parts]
        total = self.world.allreduce_sum(np.concatenate([a.ravel() for a in arrays]), REDUCING)
        offsets = np.cumsum([0] + [a.size for a in arrays])
        return tuple(total[start:stop].reshape(a.shape)[()]
                     for a, start, stop in zip(arrays, offsets[:-1], offsets[1:]))
