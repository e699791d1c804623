"""Small synthetic torch wheels, so the build scripts can be tested in milliseconds."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

from common import record_hash

PY_TAG = f"cp{sys.version_info.major}{sys.version_info.minor}"

DEFAULT_FILES = {
    "torch/__init__.py": b"from torch.version import __version__\n",
    "torch/version.py": b"__version__ = '2.13.0+cpu'\ngit_version = 'abc'\n",
    "torch/_dynamo/compiled_autograd.py": b"".join(b"line %d\n" % i for i in range(1, 21)),
    "torch/old.py": b"to be deleted\n",
    "functorch/__init__.py": b"",
}


def make_wheel(directory: Path, version: str = "2.13.0+cpu", files: dict[str, bytes] | None = None,
               filename_version: str | None = None, py_tag: str = PY_TAG) -> Path:
    """Write a small, valid torch wheel (correct RECORD) and return its path."""
    files = dict(DEFAULT_FILES if files is None else files)
    dist_info = f"torch-{version}.dist-info"
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.4\nName: torch\nVersion: {version}\nRequires-Dist: filelock\n\nBody\n".encode()
    )
    files[f"{dist_info}/WHEEL"] = f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {py_tag}-{py_tag}-linux_x86_64\n".encode()
    files[f"{dist_info}/licenses/LICENSE"] = b"license text\n"
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / f"torch-{filename_version or version}-{py_tag}-{py_tag}-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 2, 3, 4, 6))
            info.external_attr = 0o100644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return path
