"""Host side of the NKI kernel set: launch planning, layouts and padding, launches through
:class:`kernels.nki.launcher.Launcher`, fp64 reduction of the kernels' outputs, and the
fallback policy. Numpy in and out, except :mod:`kernels.nki_host.kernel_set` (torch tensors)."""
