"""DF-MP2: the kernel function and class, the block plan, the block-pair energy sums, the
spin channels and the methods with their scales."""
