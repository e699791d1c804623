"""The torch_overlay/ tree: new files at the path they have in the PyTorch source tree.

Everything is copied into the wheel at the same path, except C++ sources and headers
under torch_overlay/torch/csrc/, which are compiled into the extension instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from common import BuildError

CSRC = "torch/csrc/"
CXX_SUFFIXES = (".cpp", ".h")
# Interpreter and editor droppings that must never reach the wheel.
IGNORED_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
IGNORED_SUFFIXES = (".pyc", ".pyo", ".swp", "~")


@dataclass
class Overlay:
    """The overlay split into files to ship as they are and C++ sources to compile."""

    root: Path
    data_files: dict[str, Path] = field(default_factory=dict)  # wheel path -> source file
    cpp_sources: list[Path] = field(default_factory=list)


def is_compiled(rel: str) -> bool:
    """True for the C++ sources and headers that are built instead of shipped."""
    return rel.startswith(CSRC) and rel.endswith(CXX_SUFFIXES)


def scan(root: Path, packages: frozenset[str]) -> Overlay:
    """List the overlay; refuse files outside the wheel's top-level packages.

    A stray torch_overlay/README.md would otherwise land at the top of site-packages.
    """
    overlay = Overlay(root=root)
    if not root.is_dir():
        return overlay
    outside = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
        for filename in sorted(filenames):
            if filename.endswith(IGNORED_SUFFIXES):
                continue
            source = Path(dirpath, filename)
            rel = source.relative_to(root).as_posix()
            if "/" not in rel or rel.split("/", 1)[0] not in packages:
                outside.append(rel)
            elif is_compiled(rel):
                if rel.endswith(".cpp"):
                    overlay.cpp_sources.append(source)
            else:
                overlay.data_files[rel] = source
    if outside:
        raise BuildError(
            f"{root} has files outside the wheel's packages ({', '.join(sorted(packages))}): "
            + ", ".join(outside)
            + ". Overlay files must sit at their path in the PyTorch tree, e.g. torch_overlay/torch/foo.py."
        )
    return overlay


def file_mode(path: Path) -> int:
    """Permission bits for a shipped file: executable if the source is, else 0644."""
    return 0o755 if os.access(path, os.X_OK) else 0o644
