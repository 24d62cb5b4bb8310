"""The README's QCEngine and ASE examples run as written (in a fresh interpreter)."""
from __future__ import annotations

import re
import subprocess

import pytest

from conftest import REPO, python_exe


def readme_python_blocks(section: str) -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", text[start:end], re.DOTALL)


@pytest.mark.parametrize("section, expected_lines", [("QCSchema and QCEngine", 4),
                                                     ("ASE", 5)])
def test_readme_example_runs(section, expected_lines, tmp_path):
    blocks = readme_python_blocks(section)
    assert len(blocks) == 1
    done = subprocess.run([python_exe(), "-c", blocks[0]], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.strip().splitlines()) >= expected_lines
    assert "Traceback" not in done.stderr
