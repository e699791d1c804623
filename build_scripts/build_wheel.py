#!/usr/bin/env python3
"""Build dist/torch-2.13.0+pyca<N>-<tags>.whl from the official torch 2.13.0 wheel.

Steps, each owned by a module of this directory:
  1. base_wheel: find (or pip download) the base wheel; check it is torch 2.13.0 for
     this Python.
  2. overlay:    list torch_overlay/: files to ship, C++ sources to compile.
  3. extension:  compile (incrementally, in parallel) and link the C++ sources against
     the unpacked base wheel, then check the module's symbols and pybind11 ABI.
  4. Fingerprint every input; stop if dist/ already holds the wheel they make.
  5. patches:    apply patches/*.patch to pristine copies of the base files.
  6. repack:     write the wheel, copying unchanged members without recompressing.

Usage: python3 build_scripts/build_wheel.py [--patches-dir DIR] [--overlay-dir DIR] ...
(see --help). Standard library only: it runs with the system python3, which has no torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import base_wheel  # noqa: E402
import extension  # noqa: E402
import overlay  # noqa: E402
import patches  # noqa: E402
import repack  # noqa: E402
from common import (  # noqa: E402
    BUILD_SCRIPTS_DIR, TORCH_PUBLIC_VERSION, BuildError, FileChange, fail, log, read_json,
    sha256_bytes, sha256_file, timed, write_json,
)

VERSION_FILE = BUILD_SCRIPTS_DIR / "patchset_version.txt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options; defaults are the repository's own directories."""
    repo = BUILD_SCRIPTS_DIR.parent
    env = os.environ.get
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--patches-dir", type=Path, default=Path(env("PCA_PATCHES_DIR", repo / "patches")),
                        help="directory of *.patch files (env PCA_PATCHES_DIR; default: patches/)")
    parser.add_argument("--overlay-dir", type=Path, default=Path(env("PCA_OVERLAY_DIR", repo / "torch_overlay")),
                        help="overlay tree (env PCA_OVERLAY_DIR; default: torch_overlay/)")
    parser.add_argument("--build-dir", type=Path, default=Path(env("PCA_BUILD_DIR", repo / "build")),
                        help="scratch and cache directory (env PCA_BUILD_DIR; default: build/)")
    parser.add_argument("--dist-dir", type=Path, default=Path(env("PCA_DIST_DIR", repo / "dist")),
                        help="where the wheel goes (env PCA_DIST_DIR; default: dist/)")
    parser.add_argument("--base-wheel", default=env("TORCH_BASE_WHEEL"),
                        help="torch 2.13.0 wheel to start from (env TORCH_BASE_WHEEL; default: pip download)")
    parser.add_argument("--jobs", type=int, default=int(env("PCA_JOBS", len(os.sched_getaffinity(0)))),
                        help="parallel C++ compiles (env PCA_JOBS; default: number of CPUs)")
    parser.add_argument("--cxx", default=env("CXX", "g++"), help="C++ compiler (env CXX; default: g++)")
    return parser.parse_args(argv)


def patchset_version() -> str:
    """'2.13.0+pyca<N>', N read from the one place it is kept."""
    text = VERSION_FILE.read_text().strip()
    if not text.isdigit():
        raise BuildError(f"{VERSION_FILE} must hold one whole number (the patch-set version), not {text!r}")
    return f"{TORCH_PUBLIC_VERSION}+pyca{int(text)}"


def build_modules() -> list[Path]:
    """The build's own source files (the modules of this directory that are loaded), sorted."""
    files = {Path(m.__file__).resolve() for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    return sorted(f for f in files if f.parent == BUILD_SCRIPTS_DIR)


def fingerprint(base: base_wheel.BaseWheel, version: str, patch_files: list[Path],
                ov: overlay.Overlay, module: Path | None) -> str:
    """One hash over every input of the repack step (the C++ sources count via the module)."""
    inputs = {
        "base": base.sha256,
        "version": version,
        "patches": [(p.name, sha256_file(p)) for p in patch_files],
        "overlay": [(rel, sha256_file(p), overlay.file_mode(p)) for rel, p in sorted(ov.data_files.items())],
        "extension": [module.name, sha256_file(module)] if module else None,
        "scripts": [(p.name, sha256_file(p)) for p in build_modules()],
    }
    return sha256_bytes(repr(inputs).encode())


def wheel_state(wheel: Path, fp: str) -> dict:
    """What the state file records about a written wheel, so tampering is noticed."""
    stat = wheel.stat()
    return {"fingerprint": fp, "wheel": wheel.name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def is_up_to_date(state_file: Path, wheel: Path, fp: str) -> bool:
    """True when dist/ holds exactly the wheel that these inputs produce."""
    return wheel.is_file() and read_json(state_file) == wheel_state(wheel, fp)


def overlay_changes(ov: overlay.Overlay, patched: dict[str, FileChange], base: base_wheel.BaseWheel,
                    module_path: str | None) -> dict[str, FileChange]:
    """Overlay files as member changes; refuse paths that a patch or the extension also writes."""
    changes = {}
    with_base = set()
    for rel, source in sorted(ov.data_files.items()):
        if rel in patched or rel == module_path:
            raise BuildError(
                f"{ov.root / rel} and {'a patch' if rel in patched else 'the C++ extension'} both write "
                f"{rel}; keep one of them"
            )
        if rel in base.members:
            with_base.add(rel)
        changes[rel] = FileChange(source.read_bytes(), overlay.file_mode(source))
    for rel in sorted(with_base):
        log(f"note: overlay file {rel} replaces the base wheel's file of that name")
    return changes


def remove_stale_wheels(dist_dir: Path, keep: Path) -> None:
    """Keep exactly one wheel in dist/: the one just built."""
    for path in dist_dir.glob("*.whl"):
        if path != keep:
            log(f"removing stale {path.name}")
            path.unlink()


def build(args: argparse.Namespace) -> Path:
    """Run the whole build; return the wheel's path."""
    build_dir, dist_dir = args.build_dir.resolve(), args.dist_dir.resolve()
    state_dir = build_dir / "state"
    version = patchset_version()
    base = base_wheel.resolve(build_dir / "base", state_dir, args.base_wheel)
    ov = overlay.scan(args.overlay_dir.resolve(), base.packages)
    patch_files = patches.list_patches(args.patches_dir.resolve())
    log(f"inputs: {len(patch_files)} patch(es), {len(ov.data_files)} overlay file(s), "
        f"{len(ov.cpp_sources)} C++ source(s)")

    module = None
    if ov.cpp_sources:
        torch_root = base_wheel.ensure_unpacked(base, build_dir / "base" / "unpacked")
        module = extension.build(ov.cpp_sources, ov.root, torch_root, build_dir, base.sha256, args.jobs, args.cxx)

    wheel = dist_dir / repack.output_filename(base, version)
    fp = fingerprint(base, version, patch_files, ov, module)
    state_file = state_dir / "wheel.json"
    if is_up_to_date(state_file, wheel, fp):
        log(f"up to date: {wheel}")
        return wheel
    state_file.unlink(missing_ok=True)

    with timed("apply patches"):
        changes = patches.apply_series(patch_files, base.path, base.packages, build_dir / "patched")
    module_path = f"torch/{module.name}" if module else None
    changes.update(overlay_changes(ov, changes, base, module_path))
    if module:
        changes[module_path] = FileChange(module.read_bytes(), 0o755)
    dist_dir.mkdir(parents=True, exist_ok=True)
    with timed(f"write {wheel.name} ({len(changes)} member(s) from patches, overlay and extension)"):
        repack.write_wheel(base, wheel, changes, version)
    remove_stale_wheels(dist_dir, keep=wheel)
    write_json(state_file, wheel_state(wheel, fp))
    log(f"wrote {wheel}")
    return wheel


def main(argv: list[str]) -> int:
    """Entry point: build, report the time taken, turn BuildError into a clear failure."""
    start = time.monotonic()
    try:
        build(parse_args(argv))
    except BuildError as exc:
        fail(str(exc))
    log(f"done in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
