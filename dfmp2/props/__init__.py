"""One-electron properties of a density: multipole moments, atomic charges, natural orbitals
(and their Molden file)."""
