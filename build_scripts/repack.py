"""Write the output wheel from the base wheel plus a set of member changes.

Unchanged members are copied as raw compressed bytes and keep their base RECORD line;
changed and added members are deflated and hashed here. The version becomes
2.13.0+pyca<N> in METADATA, the .dist-info directory name and torch/version.py, and a
new RECORD (listing itself with an empty hash) closes the archive.
"""

from __future__ import annotations

import csv
import io
import os
import re
import zipfile
from pathlib import Path

from base_wheel import BaseWheel
from common import BuildError, FileChange, record_hash
from wheelzip import RawZipWriter

VERSION_PY = "torch/version.py"
VERSION_PY_LINE = re.compile(r"^__version__\s*=.*$", re.MULTILINE)
METADATA_VERSION_LINE = re.compile(r"^Version:.*$", re.MULTILINE)


def output_filename(base: BaseWheel, version: str) -> str:
    """'torch-2.13.0+pyca1-cp311-cp311-manylinux_2_28_x86_64.whl': tags copied from the base."""
    return f"{base.name.distribution}-{version}-{base.name.tags}.whl"


def set_version_py(text: str, version: str) -> str:
    """Replace torch/version.py's __version__ and keep everything else (git_version, cuda, ...)."""
    new, count = VERSION_PY_LINE.subn(f"__version__ = '{version}'", text)
    if count != 1:
        raise BuildError(f"{VERSION_PY} has {count} '__version__ =' lines, expected exactly 1")
    return new


def set_metadata_version(text: str, version: str) -> str:
    """Replace the Version: header of METADATA (the first one; the body never starts a line so)."""
    new, count = METADATA_VERSION_LINE.subn(f"Version: {version}", text, count=1)
    if count != 1:
        raise BuildError("the base wheel's METADATA has no Version: header")
    return new


def read_record(zf: zipfile.ZipFile, dist_info: str) -> dict[str, tuple[str, str]]:
    """Base RECORD as {path: (hash, size)}."""
    text = zf.read(f"{dist_info}/RECORD").decode("utf-8")
    return {row[0]: (row[1], row[2]) for row in csv.reader(io.StringIO(text)) if row}


def record_bytes(rows: list[tuple[str, str, str]]) -> bytes:
    """RECORD content in the csv dialect pip reads (paths with commas get quoted)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue().encode("utf-8")


def version_changes(zf: zipfile.ZipFile, changes: dict[str, FileChange], version: str) -> dict[str, FileChange]:
    """The member changes plus torch/version.py rewritten on top of whatever patches did to it."""
    current = changes.get(VERSION_PY)
    if current is not None and current.data is None:
        raise BuildError(f"a patch deletes {VERSION_PY}, which the build must rewrite")
    info = zf.getinfo(VERSION_PY)
    text = (current.data if current else zf.read(info)).decode("utf-8")
    mode = current.mode if current else (info.external_attr >> 16) & 0o777 or 0o644
    return {**changes, VERSION_PY: FileChange(set_version_py(text, version).encode("utf-8"), mode)}


def write_wheel(base: BaseWheel, output: Path, changes: dict[str, FileChange], version: str) -> None:
    """Write the patched wheel to `output` (atomically: a temporary file renamed at the end).

    Member order: the base's package files (changed ones in place), then added files,
    then the renamed .dist-info directory with RECORD last, as wheel tools expect.
    """
    new_dist_info = f"{base.name.distribution}-{version}.dist-info"
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        _write(base, tmp, changes, version, new_dist_info)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, output)


def _write(base: BaseWheel, tmp: Path, changes: dict[str, FileChange], version: str, new_dist_info: str) -> None:
    """The body of write_wheel: stream every member of the new wheel into `tmp`."""
    dist_info = base.dist_info
    rows: list[tuple[str, str, str]] = []
    with zipfile.ZipFile(base.path) as zf, open(base.path, "rb") as raw, RawZipWriter(tmp) as out:
        base_record = read_record(zf, dist_info)
        stamp = zf.getinfo(f"{dist_info}/METADATA").date_time  # reproducible timestamps
        changes = version_changes(zf, changes, version)

        def add(name: str, data: bytes, mode: int) -> None:
            out.add(name, data, mode, stamp)
            rows.append((name, record_hash(data), str(len(data))))

        def copy(info: zipfile.ZipInfo, name: str) -> None:
            out.copy_member(raw, info, name)
            if info.is_dir():
                return  # directory entries are not listed in RECORD
            digest, size = base_record.get(info.filename) or (record_hash(zf.read(info)), str(info.file_size))
            rows.append((name, digest, size))

        members = zf.infolist()
        dist_members = [i for i in members if i.filename.startswith(dist_info + "/")]
        for info in members:
            if info.filename.startswith(dist_info + "/"):
                continue
            change = changes.get(info.filename)
            if change is None:
                copy(info, info.filename)
            elif change.data is not None:
                add(info.filename, change.data, change.mode)
        for name in sorted(set(changes) - set(zf.NameToInfo)):
            if changes[name].data is not None:
                add(name, changes[name].data, changes[name].mode)
        for info in dist_members:
            name = new_dist_info + info.filename[len(dist_info):]
            if info.filename == f"{dist_info}/RECORD":
                continue
            if info.filename == f"{dist_info}/METADATA":
                add(name, set_metadata_version(zf.read(info).decode("utf-8"), version).encode("utf-8"), 0o644)
            else:
                copy(info, name)
        record_name = f"{new_dist_info}/RECORD"
        rows.append((record_name, "", ""))
        out.add(record_name, record_bytes(rows), 0o644, stamp)
