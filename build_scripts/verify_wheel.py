#!/usr/bin/env python3
"""Check a built wheel the way an installer would, and more strictly.

Usage: python3 build_scripts/verify_wheel.py [WHEEL_OR_DIR ...]   (default: dist/)

Checks:
  - every member decompresses and matches its CRC (zipfile checks it while reading);
  - no member name appears twice;
  - RECORD lists every file exactly once with the right sha256 and size, lists itself
    with an empty hash and size, and lists nothing that is not in the archive;
  - the .dist-info directory, METADATA's Version and torch/version.py's __version__ all
    carry the version in the filename, and WHEEL's Tag lines are the filename's tags.
Reading ~700 MB of members takes a few seconds; the build itself does not run this.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from base_wheel import parse_wheel_filename  # noqa: E402
from common import BUILD_SCRIPTS_DIR, BuildError, record_hash  # noqa: E402

VERSION_PY = re.compile(r"^__version__\s*=\s*['\"]([^'\"]*)['\"]", re.MULTILINE)


def record_problems(zf: zipfile.ZipFile, dist_info: str) -> list[str]:
    """Disagreements between RECORD and the archive's actual members."""
    problems = []
    record_name = f"{dist_info}/RECORD"
    rows = list(csv.reader(io.StringIO(zf.read(record_name).decode("utf-8"))))
    listed = Counter(row[0] for row in rows if row)
    problems += [f"RECORD lists {name} {count} times" for name, count in listed.items() if count > 1]
    entries = {row[0]: row for row in rows if row}
    for info in zf.infolist():
        if info.is_dir():
            continue
        row = entries.pop(info.filename, None)
        if row is None:
            problems.append(f"{info.filename} is not listed in RECORD")
        elif info.filename == record_name:
            if row[1:] != ["", ""]:
                problems.append(f"RECORD must list itself with an empty hash and size, not {row[1:]}")
        else:
            data = zf.read(info)  # raises BadZipFile on a CRC mismatch
            expected = [record_hash(data), str(len(data))]
            if row[1:] != expected:
                problems.append(f"{info.filename}: RECORD says {row[1:]}, content is {expected}")
    problems += [f"RECORD lists {name}, which is not in the archive" for name in entries]
    return problems


def metadata_problems(zf: zipfile.ZipFile, wheel: Path) -> list[str]:
    """Disagreements between the filename and the version/tags recorded inside."""
    name = parse_wheel_filename(wheel.name)
    dist_info = f"{name.distribution}-{name.version}.dist-info"
    problems = []
    if f"{dist_info}/METADATA" not in zf.NameToInfo:
        return [f"no {dist_info}/METADATA (the .dist-info name must match the filename)"]
    metadata = zf.read(f"{dist_info}/METADATA").decode("utf-8")
    found = re.search(r"^Version: (.*)$", metadata, re.MULTILINE)
    if not found or found.group(1).strip() != name.version:
        problems.append(f"METADATA Version is {found and found.group(1)!r}, filename says {name.version}")
    if "torch/version.py" in zf.NameToInfo:
        found = VERSION_PY.search(zf.read("torch/version.py").decode("utf-8"))
        if not found or found.group(1) != name.version:
            problems.append(f"torch/version.py __version__ is {found and found.group(1)!r}, not {name.version}")
    wheel_file = zf.read(f"{dist_info}/WHEEL").decode("utf-8")
    tags = {line.split(":", 1)[1].strip() for line in wheel_file.splitlines() if line.startswith("Tag:")}
    expected = {"-".join(t) for t in itertools.product(
        name.python_tag.split("."), name.abi_tag.split("."), name.platform_tag.split("."))}
    if tags != expected:
        problems.append(f"WHEEL tags {sorted(tags)} differ from the filename's {sorted(expected)}")
    return problems + record_problems(zf, dist_info)


def verify(wheel: Path) -> list[str]:
    """All problems found in one wheel (empty when it is sound)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            duplicates = [n for n, c in Counter(i.filename for i in zf.infolist()).items() if c > 1]
            return [f"member {n} appears more than once" for n in duplicates] + metadata_problems(zf, wheel)
    except (zipfile.BadZipFile, BuildError, KeyError, OSError) as exc:
        return [f"{type(exc).__name__}: {exc}"]


def wheels_from(args: list[str]) -> list[Path]:
    """Wheel paths from the arguments: files as given, directories searched for *.whl."""
    wheels: list[Path] = []
    for arg in args or [str(BUILD_SCRIPTS_DIR.parent / "dist")]:
        path = Path(arg)
        wheels += sorted(path.glob("*.whl")) if path.is_dir() else [path]
    return wheels


def main(argv: list[str]) -> int:
    """Verify each wheel; exit 1 if any problem was found or no wheel was given."""
    wheels = wheels_from(argv)
    if not wheels:
        print("verify_wheel: no wheel found (run `make build` first)", file=sys.stderr)
        return 1
    status = 0
    for wheel in wheels:
        start = time.monotonic()
        problems = verify(wheel)
        if problems:
            status = 1
            print(f"FAILED: {wheel}: {len(problems)} problem(s)", file=sys.stderr)
            for problem in problems[:50]:
                print(f"    {problem}", file=sys.stderr)
        else:
            print(f"OK: {wheel} ({time.monotonic() - start:.1f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
