"""NKI (AWS Trainium) side of dfmp2's kernels: the kernel sources, one per file (gemm,
gemm_split, syrk, trsm, mp2_energy, mp2_energy_fused, mp2_energy_os, mp2_energy_os_fused), the
helpers traced with them (tiling, pair_reduction), the launcher (hardware / simulator /
interpreter) and the project's CPU interpreter of NKI 0.3.0 (interpreter/)."""
