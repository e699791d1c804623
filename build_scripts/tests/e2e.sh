#!/usr/bin/env bash
# End-to-end check of the build on the real torch 2.13.0 wheel, with fixtures in a scratch
# directory (the repository's patches/ and torch_overlay/ are not read). Takes ~2 minutes:
# one C++ compile and one venv install. Not part of CI; run it after changing build_scripts/.
#
#   bash build_scripts/tests/e2e.sh [SCRATCH_DIR]      (TORCH_BASE_WHEEL is honoured)
#
# Scenarios: (1) no patches, no overlay; (2) a patch + an overlay .py + two .cpp files,
# installed into a venv and imported; (3) a patch that does not apply fails loudly;
# (4) a wheel whose METADATA says 2.14.1 is refused; (5) a no-op rebuild is fast.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
scratch=${1:-$(mktemp -d /tmp/pca-e2e.XXXXXX)}
mkdir -p "$scratch"
fx=$scratch/fixtures build=$scratch/build dist=$scratch/dist
rm -rf "$fx" "$dist"
mkdir -p "$fx/empty" "$fx/patches" "$fx/broken" "$fx/overlay/torch/csrc/pca_e2e"
build_with() {  # build_with PATCHES OVERLAY [extra args...]
  python3 "$repo/build_scripts/build_wheel.py" --build-dir "$build" --dist-dir "$dist" \
    --patches-dir "$1" --overlay-dir "$2" "${@:3}"
}
seconds() {  # run a command (output to last.log), print its wall time; fail with its log
  local start=$EPOCHREALTIME
  "$@" >"$scratch/last.log" 2>&1 || { cat "$scratch/last.log" >&2; return 1; }
  python3 -c "print(round($EPOCHREALTIME - $start, 2))"
}
pass() { echo "PASS: $*"; }

echo "== (1) no patches, no overlay"
t=$(seconds build_with "$fx/empty" "$fx/empty")
echo "full build: $t s"
python3 "$repo/build_scripts/verify_wheel.py" "$dist"
pass "empty inputs build a verified wheel"

echo "== (2) patch + overlay + C++"
base=$(ls "$build"/base/torch-*.whl 2>/dev/null || echo "$TORCH_BASE_WHEEL")
python3 - "$base" "$fx" <<'EOF'
import difflib, sys, zipfile
base, fx = sys.argv[1:]
path = "torch/_dynamo/compiled_autograd.py"
old = zipfile.ZipFile(base).read(path).decode().splitlines(True)
new = old[:1] + ["# PCA-E2E: patched\n"] + old[1:]
open(f"{fx}/patches/0001-e2e.patch", "w").writelines(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}"))
bad = [line.replace("compiled", "COMPILED") for line in old]
open(f"{fx}/broken/0001-broken.patch", "w").writelines(
    difflib.unified_diff(bad, bad[:3] + ["# x\n"] + bad[3:], f"a/{path}", f"b/{path}"))
EOF
cat > "$fx/overlay/torch/_pca_e2e.py" <<'EOF'
def hello():
    return "overlay"
EOF
cat > "$fx/overlay/torch/csrc/pca_e2e/ops.h" <<'EOF'
#pragma once
#include <ATen/ATen.h>
namespace pca_e2e { at::Tensor times_two(const at::Tensor& t); }
EOF
cat > "$fx/overlay/torch/csrc/pca_e2e/ops.cpp" <<'EOF'
#include <torch/csrc/pca_e2e/ops.h>
namespace pca_e2e { at::Tensor times_two(const at::Tensor& t) { return t * 2; } }
EOF
cat > "$fx/overlay/torch/csrc/pca_e2e/module.cpp" <<'EOF'
#include <torch/csrc/python_headers.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/pca_e2e/ops.h>
PYBIND11_MODULE(_compiled_autograd_C, m) {
  m.def("times_two", [](const at::Tensor& t) { return pca_e2e::times_two(t); });
}
EOF
t=$(seconds build_with "$fx/patches" "$fx/overlay")
echo "build with C++: $t s"
grep -E "unpack|compiled|linked|write" "$scratch/last.log" || true
python3 "$repo/build_scripts/verify_wheel.py" "$dist"
rm -rf "$scratch/venv"
python3 -m venv "$scratch/venv"
t=$(seconds "$scratch/venv/bin/python" -m pip install -q "$dist"/*.whl)
echo "venv install: $t s"
"$scratch/venv/bin/python" -m pip check
(cd "$scratch" && "$scratch/venv/bin/python" - <<'EOF'
import inspect
import torch, torch._compiled_autograd_C as C, torch._pca_e2e as overlay
import torch._dynamo.compiled_autograd as ca
assert torch.__version__.startswith("2.13.0+pyca"), torch.__version__
assert C.times_two(torch.ones(2)).tolist() == [2.0, 2.0]
assert overlay.hello() == "overlay"
assert "PCA-E2E: patched" in inspect.getsource(ca)
print("imported", torch.__version__)
EOF
)
pass "patched wheel installs, pip check is clean, extension/overlay/patch are in it"

echo "== (3) a patch that does not apply"
if build_with "$fx/broken" "$fx/empty" >"$scratch/last.log" 2>&1; then
  echo "FAIL: the broken patch was accepted"; exit 1
fi
grep -q "0001-broken.patch does not apply cleanly" "$scratch/last.log"
pass "broken patch fails loudly: $(grep -m1 'ERROR' "$scratch/last.log")"

echo "== (4) a 2.14.1 wheel is refused"
python3 - "$base" "$fx/torch-2.13.0+cpu-fake.whl" <<'EOF'
import sys, zipfile
src, dst = sys.argv[1:]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
    for info in zin.infolist():
        if info.filename.endswith(".dist-info/METADATA"):
            data = zin.read(info).replace(b"\nVersion: 2.13.0", b"\nVersion: 2.14.1", 1)
            zout.writestr(info, data)
        elif not info.filename.startswith("torch/lib/"):  # keep the copy small
            zout.writestr(info, zin.read(info))
EOF
mv "$fx/torch-2.13.0+cpu-fake.whl" "$fx/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"
if build_with "$fx/empty" "$fx/empty" --base-wheel "$fx/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl" \
    --build-dir "$scratch/build-fake" >"$scratch/last.log" 2>&1; then
  echo "FAIL: a 2.14.1 wheel was accepted"; exit 1
fi
grep -q "is torch 2.14.1" "$scratch/last.log"
pass "2.14.1 refused: $(grep -m1 'ERROR' "$scratch/last.log" | cut -c1-120)..."

echo "== (5) no-op rebuild"
build_with "$fx/patches" "$fx/overlay" >/dev/null 2>&1
t=$(seconds build_with "$fx/patches" "$fx/overlay")
grep -q "up to date" "$scratch/last.log"
pass "no-op rebuild: $t s"
echo "all scenarios passed (scratch: $scratch)"
