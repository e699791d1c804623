"""The official torch 2.13.0 wheel the build starts from: find it, check it, unpack it.

Nothing here modifies the base wheel; every later step reads it (raw members are copied
straight into the output wheel, pristine files are read for patching, headers and
libraries are unpacked for the C++ extension).
"""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from common import TORCH_PUBLIC_VERSION, BuildError, log, read_json, sha256_file, timed, write_json

# Only these parts of the ~700 MB unpacked wheel are needed on disk: headers to compile
# against and libraries to link against. Everything else is read straight from the zip.
UNPACK_PREFIXES = ("torch/include/", "torch/lib/")

HOW_TO_GET_A_WHEEL = (
    f"Point TORCH_BASE_WHEEL at a torch {TORCH_PUBLIC_VERSION} wheel (any build: +cpu, CUDA, ...),"
    f" e.g. one fetched with `pip download --no-deps --only-binary=:all: torch=={TORCH_PUBLIC_VERSION}"
    " -d DIR`, or unset TORCH_BASE_WHEEL and run `make clean` so the build downloads one."
)


@dataclass(frozen=True)
class WheelName:
    """The fields of a wheel filename (PEP 427)."""

    distribution: str
    version: str
    build_tag: str | None
    python_tag: str
    abi_tag: str
    platform_tag: str

    @property
    def tags(self) -> str:
        """'cp311-cp311-manylinux_2_28_x86_64': the part copied into the output name."""
        return f"{self.python_tag}-{self.abi_tag}-{self.platform_tag}"


@dataclass(frozen=True)
class BaseWheel:
    """A validated base wheel."""

    path: Path
    sha256: str
    name: WheelName
    dist_info: str  # e.g. "torch-2.13.0+cpu.dist-info"
    version: str  # full version from METADATA, e.g. "2.13.0+cpu"
    packages: frozenset[str]  # top-level directories other than dist-info: torch, functorch, ...
    members: frozenset[str]  # every member name


def parse_wheel_filename(filename: str) -> WheelName:
    """Split 'torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl' into its fields."""
    if not filename.endswith(".whl"):
        raise BuildError(f"{filename} is not a wheel (its name does not end in .whl)")
    parts = filename[: -len(".whl")].split("-")
    if len(parts) == 5:
        dist, version, python_tag, abi_tag, platform_tag = parts
        build_tag = None
    elif len(parts) == 6:
        dist, version, build_tag, python_tag, abi_tag, platform_tag = parts
    else:
        raise BuildError(f"{filename} is not a valid wheel filename (PEP 427)")
    return WheelName(dist, version, build_tag, python_tag, abi_tag, platform_tag)


def public_version(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0' (drop the local version label)."""
    return version.split("+", 1)[0]


def locate(base_dir: Path, override: str | None) -> Path:
    """Return the base wheel: the override, else the one in base_dir, else download one.

    A wheel already in base_dir is reused without asking pip, so a no-op build needs no
    package index.
    """
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise BuildError(f"TORCH_BASE_WHEEL={override} does not exist. {HOW_TO_GET_A_WHEEL}")
        return path.resolve()
    existing = sorted(base_dir.glob("torch-*.whl"))
    if not existing:
        download(base_dir)
        existing = sorted(base_dir.glob("torch-*.whl"))
    if len(existing) != 1:
        names = ", ".join(p.name for p in existing) or "none"
        raise BuildError(
            f"expected exactly one torch wheel in {base_dir}, found: {names}. "
            "Run `make clean` (or remove the extra wheels) and build again."
        )
    return existing[0].resolve()


def download(base_dir: Path) -> None:
    """Fetch the torch 2.13.0 wheel for this interpreter and platform with pip."""
    base_dir.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        f"torch=={TORCH_PUBLIC_VERSION}", "-d", str(base_dir),
    ]
    log("downloading the base wheel: " + " ".join(command))
    with timed("download base wheel"):
        result = subprocess.run(command)
    if result.returncode != 0:
        raise BuildError(f"pip could not download torch=={TORCH_PUBLIC_VERSION}. {HOW_TO_GET_A_WHEEL}")


def cached_sha256(path: Path, cache_file: Path) -> str:
    """sha256 of the wheel, re-hashed only when its size or mtime changed (saves ~0.5 s)."""
    stat = path.stat()
    key = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    cached = read_json(cache_file)
    if cached and cached.get("key") == key:
        return cached["sha256"]
    digest = sha256_file(path)
    write_json(cache_file, {"key": key, "sha256": digest})
    return digest


def find_dist_info(zf: zipfile.ZipFile) -> str:
    """The name of the wheel's single top-level .dist-info directory."""
    dirs = {n.split("/", 1)[0] for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")}
    if len(dirs) != 1:
        raise BuildError(f"{zf.filename} has {len(dirs)} .dist-info directories with a METADATA file, expected 1")
    return dirs.pop()


def read_metadata(zf: zipfile.ZipFile, dist_info: str) -> tuple[str, str]:
    """(Name, Version) from the wheel's METADATA headers."""
    text = zf.read(f"{dist_info}/METADATA").decode("utf-8")
    headers = email.parser.Parser().parsestr(text, headersonly=True)
    return headers.get("Name", ""), headers.get("Version", "")


def open_and_validate(path: Path, sha256: str) -> BaseWheel:
    """Check that `path` is a torch 2.13.0 wheel (by filename AND METADATA) and describe it."""
    name = parse_wheel_filename(path.name)
    if name.distribution.lower() != "torch":
        raise BuildError(f"{path} is a wheel of {name.distribution!r}, not torch. {HOW_TO_GET_A_WHEEL}")
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise BuildError(f"cannot read {path} as a zip file ({exc}). {HOW_TO_GET_A_WHEEL}") from exc
    with zf:
        dist_info = find_dist_info(zf)
        meta_name, meta_version = read_metadata(zf, dist_info)
        for required in ("torch/version.py", f"{dist_info}/RECORD"):
            if required not in zf.NameToInfo:
                raise BuildError(f"{path} has no {required}; it does not look like an official torch wheel")
        members = frozenset(zf.NameToInfo)
        packages = frozenset(n.split("/", 1)[0] for n in members if "/" in n and not n.startswith(f"{dist_info}/"))
    if meta_name.lower() != "torch":
        raise BuildError(f"{path}: METADATA says Name: {meta_name!r}, not torch. {HOW_TO_GET_A_WHEEL}")
    for where, version in (("filename", name.version), ("METADATA", meta_version)):
        if public_version(version) != TORCH_PUBLIC_VERSION:
            raise BuildError(
                f"{path} is torch {version} (according to its {where}), but the patches in this "
                f"repository are written against torch {TORCH_PUBLIC_VERSION} exactly "
                f"(any local label such as {TORCH_PUBLIC_VERSION}+cpu is fine). {HOW_TO_GET_A_WHEEL}"
            )
    return BaseWheel(
        path=path, sha256=sha256, name=name, dist_info=dist_info, version=meta_version,
        packages=packages, members=members,
    )


def check_build_python(name: WheelName) -> None:
    """Refuse to build with a Python whose version differs from the wheel's cpXY tag.

    The extension is compiled against this interpreter's headers and named with its
    EXT_SUFFIX, so it must be the Python the wheel is for.
    """
    ours = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if ours not in name.python_tag.split("."):
        raise BuildError(
            f"the base wheel is for {name.python_tag}, but the build runs Python "
            f"{sys.version_info.major}.{sys.version_info.minor} ({sys.executable}). "
            f"Run the build with a matching interpreter, e.g. `make PYTHON=python{name.python_tag[2]}."
            f"{name.python_tag[3:]} build`, or use a base wheel built for {ours}."
        )


def ensure_unpacked(base: BaseWheel, dest: Path) -> Path:
    """Unpack the base wheel's headers and libraries into `dest` once per wheel hash.

    The tree is never modified afterwards: it is what the extension compiles and links
    against. A stamp written last marks a complete unpack, so an interrupted one is redone.
    """
    stamp = dest / ".unpacked.json"
    wanted = {"sha256": base.sha256, "prefixes": list(UNPACK_PREFIXES)}
    if read_json(stamp) == wanted:
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    for stale in (dest, tmp):
        shutil.rmtree(stale, ignore_errors=True)
    with timed(f"unpack {', '.join(UNPACK_PREFIXES)} of {base.path.name}"):
        with zipfile.ZipFile(base.path) as zf:
            for info in zf.infolist():
                if info.filename.startswith(UNPACK_PREFIXES) and not info.is_dir():
                    zf.extract(info, tmp)
    os.replace(tmp, dest)
    write_json(stamp, wanted)
    return dest


def resolve(base_dir: Path, state_dir: Path, override: str | None) -> BaseWheel:
    """Locate, hash and validate the base wheel, and check the build Python against it."""
    path = locate(base_dir, override)
    digest = cached_sha256(path, state_dir / "base-wheel-hash.json")
    base = open_and_validate(path, digest)
    check_build_python(base.name)
    log(f"base wheel: {path} (torch {base.version}, sha256 {digest[:12]}...)")
    return base
