"""The acceptance script of PyTorch PR #138101 passes unmodified."""

import os
import subprocess
import sys

from conftest import SHARED


def test_seed_r2_script_passes_unmodified(tmp_path):
    script = SHARED / "seed" / "r2.py"
    assert script.exists(), f"{script} not found; set PCA_SHARED to the shared/ directory"
    # Its C++ extensions build into a private cache so that runs never share
    # half-built modules.
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")}
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
