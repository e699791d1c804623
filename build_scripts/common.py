"""Small helpers shared by the build scripts: errors, logging, hashing, state files.

Everything here is standard library only: the build runs with the system python3,
which has no torch and no third-party packages.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NoReturn

# Torch version every patch in this repository is written against.
TORCH_PUBLIC_VERSION = "2.13.0"

# Name of the extension module built from torch_overlay/torch/csrc/**/*.cpp.
EXTENSION_NAME = "_compiled_autograd_C"

BUILD_SCRIPTS_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class FileChange:
    """New content and Unix mode of one wheel member; data None means the member is deleted."""

    data: bytes | None
    mode: int = 0o644


class BuildError(Exception):
    """A failure the user must act on; the message says what failed and what to do."""


def log(message: str) -> None:
    """Print one progress line, flushed at once so CI logs keep their order."""
    print(f"[build] {message}", flush=True)


@contextlib.contextmanager
def timed(step: str) -> Iterator[None]:
    """Log how long a build step took (the docs quote these numbers)."""
    start = time.monotonic()
    yield
    log(f"{step}: {time.monotonic() - start:.1f} s")


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of an in-memory buffer."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks so big wheels do not fill memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def record_hash(data: bytes) -> str:
    """The hash column of a wheel RECORD line: sha256, urlsafe base64, no padding."""
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def read_json(path: Path) -> dict | None:
    """Load a state file, or None when it is missing or unreadable (treated as stale)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict) -> None:
    """Write a state file atomically, so an interrupted build never leaves half a stamp."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def fail(message: str) -> NoReturn:
    """Print a build error the way every script here does, and exit non-zero."""
    print(f"\n[build] ERROR: {message}\n", file=sys.stderr, flush=True)
    raise SystemExit(1)
