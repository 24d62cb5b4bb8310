"""Density fitting: auxiliary bases, the Coulomb metric, the fitted tensor B and where it
lives (memory or a scratch file)."""
