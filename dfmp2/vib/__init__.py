"""Harmonic vibrations from the analytic gradient: the displaced geometries of a central-
difference Hessian (:mod:`displacements`), the dipole of a density (:mod:`dipole`), each
displaced gradient and dipole computed and shared over ranks (:mod:`hessian`), the harmonic
analysis, IR intensities and thermochemistry (:mod:`analysis`), and the Molden vibration file
(:mod:`molden`)."""
