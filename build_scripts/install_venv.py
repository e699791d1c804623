#!/usr/bin/env python3
"""Install the built wheel and the test requirements into the project's virtualenv.

Usage: python3 build_scripts/install_venv.py [--venv .venv] [--python python3]
                                             [--dist-dir dist] [--requirements requirements-test.txt]

- Creates the venv (`PYTHON -m venv`) when it has no bin/python.
- Reinstalls torch only when the wheel's content changed since the last install (a
  stamp in the venv records its sha256): `pip install --force-reinstall --no-deps WHEEL`.
  Reinstalling the ~700 MB of torch takes ~15 s, so a no-op `make install` must not.
- Installs torch's dependencies and requirements-test.txt when the venv has not had them
  yet or either changed: `pip install WHEEL -r requirements-test.txt`. pip leaves the
  torch just installed alone (same version) and adds only what is missing.
- Smoke test: imports torch, checks its version, and imports torch._compiled_autograd_C
  when the wheel ships that module.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from base_wheel import find_dist_info, parse_wheel_filename  # noqa: E402
from common import (  # noqa: E402
    EXTENSION_NAME, BuildError, fail, log, read_json, sha256_bytes, sha256_file, write_json,
)

STAMP_NAME = "pca-install.json"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options; the Makefile passes its PYTHON and paths."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=Path(".venv"))
    parser.add_argument("--python", default="python3", help="interpreter that creates the venv")
    parser.add_argument("--dist-dir", type=Path, default=Path("dist"))
    parser.add_argument("--requirements", type=Path, default=Path("requirements-test.txt"))
    return parser.parse_args(argv)


def the_wheel(dist_dir: Path) -> Path:
    """The single wheel the build left in dist/."""
    wheels = sorted(dist_dir.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected exactly one wheel in {dist_dir}, found {len(wheels)}: run `make build`")
    return wheels[0]


def run(command: list[str], what: str) -> None:
    """Run a pip/venv command, timing it; fail with its name when it fails."""
    log(f"{what}: {' '.join(command)}")
    start = time.monotonic()
    if subprocess.run(command).returncode != 0:
        raise BuildError(f"{what} failed (command above)")
    log(f"{what}: {time.monotonic() - start:.1f} s")


def wheel_facts(wheel: Path) -> tuple[list[str], bool]:
    """(Requires-Dist lines of its METADATA, whether it ships the C++ extension)."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"{find_dist_info(zf)}/METADATA").decode("utf-8")
        has_extension = any(n.startswith(f"torch/{EXTENSION_NAME}.") and n.endswith(".so") for n in zf.namelist())
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    return requires, has_extension


def smoke_test(venv_python: Path, version: str, has_extension: bool) -> None:
    """Import the installed torch (outside the repository, so nothing local shadows it)."""
    code = (
        "import torch; "
        f"assert torch.__version__ == {version!r}, torch.__version__; "
        + (f"import torch.{EXTENSION_NAME}; " if has_extension else "")
        + "print('[build] smoke test: torch', torch.__version__"
        + (f", 'with torch.{EXTENSION_NAME}'" if has_extension else ", '(no C++ extension in this wheel)'")
        + ")"
    )
    with tempfile.TemporaryDirectory() as cwd:
        if subprocess.run([str(venv_python), "-c", code], cwd=cwd).returncode != 0:
            raise BuildError(f"smoke test failed: {venv_python} -c {code!r}")


def install(args: argparse.Namespace) -> None:
    """Bring the venv up to date with the wheel and the test requirements."""
    venv_python = args.venv.absolute() / "bin" / "python"  # absolute: the smoke test runs elsewhere
    if not venv_python.exists():
        run([args.python, "-m", "venv", str(args.venv)], "create venv")
    wheel = the_wheel(args.dist_dir)
    requires, has_extension = wheel_facts(wheel)
    stamp_file = args.venv / STAMP_NAME
    stamp = read_json(stamp_file) or {}
    wanted = {
        # By content: a rebuild that produced the same bytes (the build is deterministic) costs no reinstall.
        "wheel": [wheel.name, sha256_file(wheel)],
        "deps": sha256_bytes(("\n".join(requires) + "\n" + args.requirements.read_text()).encode()),
    }
    pip = [str(venv_python), "-m", "pip", "install", "-q", "--progress-bar", "off"]
    if stamp.get("wheel") != wanted["wheel"]:
        stamp.pop("wheel", None)
        write_json(stamp_file, stamp)  # an interrupted reinstall must be redone
        run([*pip, "--force-reinstall", "--no-deps", str(wheel)], f"install {wheel.name}")
        stamp["wheel"] = wanted["wheel"]
        write_json(stamp_file, stamp)
    if stamp.get("deps") != wanted["deps"]:
        run([*pip, str(wheel), "-r", str(args.requirements)], "install torch's dependencies and test requirements")
        stamp["deps"] = wanted["deps"]
        write_json(stamp_file, stamp)
    smoke_test(venv_python, parse_wheel_filename(wheel.name).version, has_extension)


def main(argv: list[str]) -> int:
    """Entry point: install, turning BuildError into a clear failure."""
    try:
        install(parse_args(argv))
    except BuildError as exc:
        fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
