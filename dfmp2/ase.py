"""``from dfmp2.ase import DFMP2``: the ASE calculator (documented entry point; it lives in
:mod:`dfmp2.interfaces.ase`)."""
from dfmp2.interfaces.ase import DFMP2

__all__ = ["DFMP2"]
