"""dfmp2: density-fitted MP2 (RI-MP2) on PySCF orbitals, with NKI and torch kernels."""
__version__ = "0.1.0"
