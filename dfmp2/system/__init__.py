"""The machine: memory, disk, BLAS threads, progress bars, torch.distributed, files that
never follow links."""
