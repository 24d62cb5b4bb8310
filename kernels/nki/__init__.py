"""NKI (AWS Trainium) kernels of dfmp2: gemm, syrk, trsm, mp2_energy (plain and fused), their
launcher (hardware / simulator / interpreter) and the project's CPU interpreter of NKI 0.3.0."""
