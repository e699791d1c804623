"""Apply patches/*.patch to pristine copies of the base wheel's files.

Each build copies every file the patch series touches out of the base wheel into a fresh
work directory and runs GNU patch there, one patch at a time in sorted filename order.
The base wheel is never modified, so rebuilding never applies a patch twice. A patch that
does not apply cleanly (no fuzz allowed) stops the build before anything is written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import zipfile
from pathlib import Path

from common import BuildError, FileChange, log

HUNK_HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")

# Strict on purpose: fuzz can apply a hunk in the wrong place without saying so. Offsets
# (the same context a few lines away) are fine and expected when patches stack.
PATCH_FLAGS = [
    "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-",
]


def list_patches(patches_dir: Path) -> list[Path]:
    """The patch series: patches_dir/*.patch in sorted filename order (may be empty)."""
    if not patches_dir.is_dir():
        return []
    return sorted(p for p in patches_dir.glob("*.patch") if p.is_file())


def _strip_p1(raw: str) -> str | None:
    """Path from a '---'/'+++' header with its first component removed, None for /dev/null."""
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    if path == "/dev/null":
        return None
    if "/" not in path:
        raise BuildError(f"patch header path {path!r} has no a/ or b/ prefix (patches must apply with -p1)")
    return path.split("/", 1)[1]


def touched_paths(text: str) -> set[str]:
    """Every wheel-relative path a unified or git diff reads or writes.

    Hunk bodies are skipped by counting their lines, so a removed line that happens to
    start with '-- ' is never mistaken for a file header.
    """
    paths: set[str] = set()
    lines = text.splitlines()
    old_left = new_left = 0
    for index, line in enumerate(lines):
        if old_left > 0 or new_left > 0:
            tag = line[:1]
            if tag in (" ", ""):
                old_left, new_left = old_left - 1, new_left - 1
            elif tag == "-":
                old_left -= 1
            elif tag == "+":
                new_left -= 1
            continue  # '\ No newline at end of file' and the counted lines themselves
        hunk = HUNK_HEADER.match(line)
        if hunk:
            old_left = int(hunk.group(1) or 1)
            new_left = int(hunk.group(2) or 1)
        elif line.startswith("--- ") and index + 1 < len(lines) and lines[index + 1].startswith("+++ "):
            for raw in (line[4:], lines[index + 1][4:]):
                path = _strip_p1(raw)
                if path is not None:
                    paths.add(path)
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            paths.add(line.split(" ", 2)[2].strip())
        elif line.startswith("diff --git a/"):
            parts = line.split(" ")
            if len(parts) == 4 and parts[3].startswith("b/"):  # mode-only changes have no ---/+++
                paths.update((parts[2][2:], parts[3][2:]))
    return paths


def check_inside_packages(patch: Path, paths: set[str], packages: frozenset[str]) -> None:
    """Refuse patches that touch files outside the wheel's top-level packages.

    Upstream commits often include test or CI changes; those do not exist in a wheel and
    must not be added to it (a new test/... file would land at site-packages/test).
    """
    outside = sorted(p for p in paths if "/" not in p or p.split("/", 1)[0] not in packages)
    if outside:
        raise BuildError(
            f"{patch} touches {', '.join(outside)}, outside the wheel's packages "
            f"({', '.join(sorted(packages))}). Only files that ship in the wheel can be patched: "
            "drop those hunks from the patch (tests belong in test/)."
        )


def seed_work_dir(work: Path, paths: set[str], base: zipfile.ZipFile) -> None:
    """Recreate `work` holding pristine copies (content and mode) of the touched base files."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for path in sorted(paths):
        info = base.NameToInfo.get(path)
        if info is None:
            continue  # created by a patch (or missing: GNU patch then says so by name)
        target = work / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base.read(info))
        target.chmod((info.external_attr >> 16) & 0o777 or 0o644)


def apply_one(patch: Path, work: Path) -> None:
    """Run GNU patch for one file of the series; raise naming the patch when it fails."""
    result = subprocess.run(
        ["patch", *PATCH_FLAGS, "-d", str(work), "-i", str(patch.resolve())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
    )
    if result.returncode != 0:
        raise BuildError(
            f"patch {patch} does not apply cleanly to the pristine torch files "
            f"(GNU patch exit {result.returncode}; no fuzz is allowed):\n"
            + "\n".join("    " + line for line in result.stdout.splitlines())
            + f"\nNothing was built. The partially patched copies are in {work} for inspection; "
            "regenerate the patch against torch 2.13.0 plus the patches sorted before it."
        )
    offsets = [line for line in result.stdout.splitlines() if line.startswith("Hunk")]
    log(f"applied {patch.name}" + "".join(f"\n        {line}" for line in offsets))


def collect_changes(work: Path, paths: set[str], base: zipfile.ZipFile) -> dict[str, FileChange]:
    """What the series did to each touched path: new content and mode, or deletion."""
    changes: dict[str, FileChange] = {}
    for path in sorted(paths):
        target = work / path
        if target.is_file():
            changes[path] = FileChange(target.read_bytes(), target.stat().st_mode & 0o777)
        elif path in base.NameToInfo:
            changes[path] = FileChange(None)
    return changes


def apply_series(
    patches: list[Path], base_path: Path, packages: frozenset[str], work: Path
) -> dict[str, FileChange]:
    """Apply the whole series to pristine copies in `work` and return the resulting changes."""
    if not patches:
        shutil.rmtree(work, ignore_errors=True)
        return {}
    with zipfile.ZipFile(base_path) as base:
        paths: set[str] = set()
        for patch in patches:
            touched = touched_paths(patch.read_bytes().decode("utf-8", errors="surrogateescape"))
            if not touched:
                raise BuildError(f"{patch} contains no file diffs (is it a unified diff?)")
            check_inside_packages(patch, touched, packages)
            paths |= touched
        seed_work_dir(work, paths, base)
        for patch in patches:
            apply_one(patch, work)
        return collect_changes(work, paths, base)
