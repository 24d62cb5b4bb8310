"""The relaxed analytic DF-MP2 gradient: amplitudes, orbital response, derivative
integrals."""
