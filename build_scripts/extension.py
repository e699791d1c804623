"""Compile torch_overlay/torch/csrc/**/*.cpp into torch/_compiled_autograd_C<EXT_SUFFIX>.

Each source compiles to its own object, in parallel, against the UNPACKED BASE WHEEL's
headers (never an installed torch). An object is rebuilt only when its .cpp, a project
header it includes (found through gcc's -MMD depfile, compared by content hash), the
compiler or the flags changed; torch's own headers are covered by the base wheel's hash,
which is part of the flags key. The objects are then linked into one module.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common import EXTENSION_NAME, BuildError, log, read_json, sha256_bytes, sha256_file, write_json

# pybind11 keeps its type registry under a name that encodes the compiler, standard
# library and C++ ABI; an extension whose name differs cannot exchange at::Tensor with torch.
PYBIND_INTERNALS_ID = re.compile(rb"__pybind11_internals_v\w+?__")
CXX11_ABI_IN_ID = re.compile(rb"_use_cxx11_abi_(\d)__")


@dataclass(frozen=True)
class Toolchain:
    """Compiler, flags and the key that says when every object must be rebuilt."""

    cxx: str
    compile_flags: tuple[str, ...]
    link_flags: tuple[str, ...]
    key: str


def extension_filename() -> str:
    """'_compiled_autograd_C.cpython-311-x86_64-linux-gnu.so' for the build Python."""
    return EXTENSION_NAME + sysconfig.get_config_var("EXT_SUFFIX")


def pybind_internals_id(binary: Path) -> bytes | None:
    """The pybind11 internals id string embedded in a shared library, if any."""
    match = PYBIND_INTERNALS_ID.search(binary.read_bytes())
    return match.group(0) if match else None


def detect_cxx11_abi(libtorch_python: Path) -> int:
    """Read _GLIBCXX_USE_CXX11_ABI from the wheel itself instead of assuming it."""
    internals = pybind_internals_id(libtorch_python)
    match = CXX11_ABI_IN_ID.search(internals or b"")
    if not match:
        raise BuildError(
            f"cannot find pybind11's '..._use_cxx11_abi_N__' internals id in {libtorch_python}; "
            "unable to tell which C++ ABI the base wheel uses"
        )
    return int(match.group(1))


def python_include_dir() -> Path:
    """The build Python's header directory; it must hold Python.h."""
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise BuildError(
            f"{include}/Python.h is missing: install the Python development headers "
            "(Debian: apt-get install python3-dev) for the Python that runs the build"
        )
    return include


def compiler_identity(cxx: str) -> str:
    """First line of `cxx --version`; a compiler upgrade rebuilds every object."""
    try:
        result = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"C++ compiler {cxx!r} does not run ({exc}); install g++ or set CXX") from exc
    return result.stdout.splitlines()[0]


def make_toolchain(cxx: str, torch_root: Path, overlay_root: Path, base_sha256: str) -> Toolchain:
    """Flags from the project's contract, with the C++ ABI read from the wheel."""
    abi = detect_cxx11_abi(torch_root / "torch/lib/libtorch_python.so")
    include = torch_root / "torch/include"
    compile_flags = (
        "-std=c++20", "-O2", "-fPIC",
        "-DTORCH_API_INCLUDE_EXTENSION_H", f"-DTORCH_EXTENSION_NAME={EXTENSION_NAME}",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        # Project headers first, at their PyTorch-tree path (torch/csrc/...).
        f"-I{overlay_root}",
        f"-I{include}", f"-I{include / 'torch/csrc/api/include'}", f"-I{python_include_dir()}",
        *os.environ.get("PCA_CXXFLAGS", "").split(),
    )
    link_flags = (
        "-shared", f"-L{torch_root / 'torch/lib'}",
        "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
        "-Wl,-rpath,$ORIGIN/lib",  # the module sits in torch/, the libraries in torch/lib
    )
    identity = [compiler_identity(cxx), cxx, compile_flags, link_flags, base_sha256]
    return Toolchain(cxx, compile_flags, link_flags, sha256_bytes(json.dumps(identity).encode()))


def parse_depfile(text: str) -> list[str]:
    """Prerequisites of the first rule in a make depfile written by gcc -MMD."""
    joined = text.replace("\\\n", " ")
    rule = joined.split("\n", 1)[0]
    _target, _, prerequisites = rule.partition(": ")
    words = re.split(r"(?<!\\)\s+", prerequisites.strip())
    return [w.replace("\\ ", " ").replace("$$", "$") for w in words if w]


def project_deps(depfile: Path, project_root: Path) -> dict[str, str]:
    """Content hashes of the depfile's prerequisites that live in the project tree."""
    root = str(project_root) + os.sep
    return {p: sha256_file(Path(p)) for p in parse_depfile(depfile.read_text()) if p.startswith(root)}


def object_paths(source: Path, overlay_root: Path, obj_dir: Path) -> tuple[Path, Path, Path]:
    """(object, depfile, stamp) for one source, mirroring its path under the overlay."""
    obj = obj_dir / (source.relative_to(overlay_root).as_posix() + ".o")
    return obj, obj.with_suffix(".d"), obj.with_suffix(".json")


def is_current(obj: Path, stamp: Path, key: str) -> bool:
    """True when the object was built with these flags from the same project files."""
    recorded = read_json(stamp)
    if not obj.is_file() or not recorded or recorded.get("key") != key:
        return False
    for path, digest in recorded["deps"].items():
        try:
            if sha256_file(Path(path)) != digest:
                return False
        except OSError:
            return False  # a header was removed or renamed
    return True


def compile_one(source: Path, overlay_root: Path, obj_dir: Path, tc: Toolchain) -> tuple[Path, str | None]:
    """Compile one source; return (source, compiler output if it failed, else None)."""
    obj, depfile, stamp = object_paths(source, overlay_root, obj_dir)
    obj.parent.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)  # never leave a stamp that vouches for an old object
    command = [tc.cxx, *tc.compile_flags, "-MMD", "-MF", str(depfile), "-c", str(source), "-o", str(obj)]
    start = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    rel = source.relative_to(overlay_root)
    if result.returncode != 0:
        return source, f"$ {' '.join(command)}\n{result.stdout}"
    if result.stdout.strip():
        print(result.stdout, end="", flush=True)  # warnings: shown, never hidden
    write_json(stamp, {"key": tc.key, "deps": project_deps(depfile, overlay_root)})
    log(f"compiled {rel} ({time.monotonic() - start:.1f} s)")
    return source, None


def compile_all(sources: list[Path], overlay_root: Path, obj_dir: Path, tc: Toolchain, jobs: int) -> list[Path]:
    """Bring every object up to date, `jobs` compiles at a time; return the objects."""
    def needs_compile(source: Path) -> bool:
        obj, _depfile, stamp = object_paths(source, overlay_root, obj_dir)
        return not is_current(obj, stamp, tc.key)

    stale = [s for s in sources if needs_compile(s)]
    if stale:
        log(f"compiling {len(stale)} of {len(sources)} C++ source(s), {jobs} at a time")
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(lambda s: compile_one(s, overlay_root, obj_dir, tc), stale))
        failures = [(s, output) for s, output in results if output is not None]
        for source, output in failures:
            print(f"\n--- compiler output for {source} ---\n{output}", file=sys.stderr, flush=True)
        if failures:
            raise BuildError("C++ compilation failed: " + ", ".join(str(s) for s, _ in failures))
        log(f"C++ compile: {time.monotonic() - start:.1f} s")
    return [object_paths(s, overlay_root, obj_dir)[0] for s in sources]


def link(objects: list[Path], output: Path, tc: Toolchain, torch_lib: Path) -> None:
    """Link the objects into the module unless objects and flags are unchanged.

    The new module is checked before it replaces the old one and before its stamp is
    written, so a module that failed a check is relinked (and rechecked) next time.
    """
    stamp = output.with_name(output.name + ".json")
    key = sha256_bytes(json.dumps([tc.key, [(str(o), sha256_file(o)) for o in objects]]).encode())
    if output.is_file() and (read_json(stamp) or {}).get("key") == key:
        return
    tmp = output.with_name(output.name + ".tmp")
    command = [tc.cxx, *map(str, objects), "-o", str(tmp), *tc.link_flags]
    start = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    if result.returncode != 0:
        raise BuildError(f"linking {output.name} failed:\n$ {' '.join(command)}\n{result.stdout}")
    if result.stdout.strip():
        print(result.stdout, end="", flush=True)  # linker warnings: shown, never hidden
    try:
        check_pybind_abi(tmp, output.name, torch_lib / "libtorch_python.so")
        check_undefined_symbols(tmp, output.name, torch_lib)
    except BuildError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, output)
    write_json(stamp, {"key": key})
    log(f"linked and checked {output.name} ({time.monotonic() - start:.1f} s)")


def check_pybind_abi(module: Path, name: str, libtorch_python: Path) -> None:
    """Refuse a module whose pybind11 internals id differs from torch's (no shared types)."""
    ours, torchs = pybind_internals_id(module), pybind_internals_id(libtorch_python)
    if ours is None:
        log(f"note: no pybind11 internals id found in {name}; skipping the pybind11 ABI check")
    elif ours != torchs:
        raise BuildError(
            f"{name} was built with pybind11 internals id {ours.decode()} but torch uses "
            f"{torchs.decode() if torchs else '(none)'}: the module could not pass tensors to or from "
            "torch. Use a compiler and flags matching the wheel (g++, -D_GLIBCXX_USE_CXX11_ABI as detected)."
        )


def dynamic_symbols(binary: Path, defined: bool) -> list[tuple[str, str]]:
    """(type letter, name) of a shared object's dynamic symbols, via nm -D."""
    flag = "--defined-only" if defined else "--undefined-only"
    result = subprocess.run(["nm", "-D", flag, str(binary)], capture_output=True, text=True)
    if result.returncode != 0:
        raise BuildError(f"nm -D {flag} {binary} failed: {result.stderr.strip()}")
    return [(parts[-2], parts[-1]) for parts in map(str.split, result.stdout.splitlines()) if len(parts) >= 2]


def check_undefined_symbols(module: Path, name: str, lib_dir: Path) -> None:
    """Fail the build when the module needs a symbol nothing will provide at import time.

    Versioned symbols (name@GLIBC_..., @GLIBCXX_...) come from system libraries, and
    Py*/_Py* from the interpreter; everything else must be defined in torch/lib. Catching
    this here gives a symbol name instead of an ImportError after a 20 s venv install.
    """
    needed = {
        name for kind, name in dynamic_symbols(module, defined=False)
        if kind == "U" and "@" not in name and not name.startswith(("Py", "_Py"))
    }
    if not needed:
        return
    provided = set()
    for lib in sorted(lib_dir.iterdir()):
        if ".so" in lib.name and lib.is_file() and lib.read_bytes()[:4] == b"\x7fELF":
            provided.update(name.split("@", 1)[0] for _kind, name in dynamic_symbols(lib, defined=True))
    missing = sorted(needed - provided)
    if missing:
        demangled = subprocess.run(["c++filt"], input="\n".join(missing), capture_output=True, text=True).stdout
        raise BuildError(
            f"{name} uses {len(missing)} symbol(s) that no library in the wheel exports "
            "(importing it would fail with 'undefined symbol'):\n"
            + "\n".join("    " + line for line in (demangled or "\n".join(missing)).splitlines()[:50])
            + "\nDefine them in the extension's sources; torch internals that the wheel does not export "
            "(e.g. parts of libtorch_python) must be re-implemented there."
        )


def build(sources: list[Path], overlay_root: Path, torch_root: Path, build_dir: Path,
          base_sha256: str, jobs: int, cxx: str) -> Path:
    """Compile and link the extension; return the path of the up-to-date module."""
    tc = make_toolchain(cxx, torch_root, overlay_root.resolve(), base_sha256)
    objects = compile_all([s.resolve() for s in sources], overlay_root.resolve(), build_dir / "obj", tc, jobs)
    module = build_dir / "ext" / extension_filename()
    module.parent.mkdir(parents=True, exist_ok=True)
    link(objects, module, tc, torch_root / "torch/lib")
    return module

