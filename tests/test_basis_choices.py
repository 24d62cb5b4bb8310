"""Basis choices dfmp2 runs but warns of, and basis names it must read as PySCF does."""
from __future__ import annotations

import json
import shutil

from pyscf import gto

from conftest import molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference

# Water's 3-21G with a d shell on oxygen, in NWChem's format as the Basis Set Exchange writes
# it (PySCF's reader finds an element's shells after a '#BASIS SET' line).
WATER_321G_D_NWCHEM = """BASIS "ao basis" PRINT
#BASIS SET: (3s) -> [2s]
H    S
      5.4471780              0.1562850
      0.8245470              0.9046910
H    S
      0.1831920              1.0000000
#BASIS SET: (6s,3p,1d) -> [3s,2p,1d]
O    S
    322.0370000              0.0592394
     48.4308000              0.3515000
     10.4206000              0.7076580
O    SP
      7.4029400             -0.4044530              0.2445860
      1.5762000              1.2215600              0.8539550
O    SP
      0.3736840              1.0000000              1.0000000
O    D
      0.8000000              1.0000000
END
"""


def test_a_file_named_like_a_pople_basis_pyscf_cannot_compose_is_read(run_cli, tmp_path,
                                                                        monkeypatch):
    """PySCF has no polarisation files for 3-21G, so a file named 3-21G(d) is the only basis
    of that name: it was refused as a library basis the file would shadow."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(molecule_path("water"), "water.xyz")
    (tmp_path / "3-21G(d)").write_text(WATER_321G_D_NWCHEM)
    result = run_cli("run", "water.xyz", "--basis", "3-21G(d)", "--threads", "1", "--json",
                     "-o", "w.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    # PySCF reads the file of that name here, as dfmp2 does.
    mol = gto.M(atom="\n".join(molecule_path("water").read_text().splitlines()[2:]),
                basis="3-21G(d)", verbose=0)
    assert mol.nao == 2 * 2 + 9 + 5
    mf = pyscf_df_rhf(mol)
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    assert abs(summary["e_corr"] - pyscf_dfmp2_reference(mf, 0).e_corr) <= 1e-8
    # A file that holds no water functions is refused for what it lacks, not for its name.
    (tmp_path / "3-21G(d)").write_text("notes\n")
    result = run_cli("run", "water.xyz", "--basis", "3-21G(d)", "-o", "n.h5")
    assert result.code == 2
    assert result.err.strip() == ("Error: --basis file '3-21G(d)' has no functions for O, H; "
                                  "add them to it, or choose a basis that covers every element")
