"""`make run`: the seed's scenarios, then one model's backward under eager
autograd, the legacy compiled autograd engine and the Python engine.

Usage: python bench/demo.py [--model transformer_encoder] [--backend inductor]
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "test"))
sys.path.insert(0, str(REPO / "bench"))

from engines import ENGINES, max_abs_diff, time_backwards  # noqa: E402
from models import MODELS  # noqa: E402

STEADY_ROUNDS = 30


def shared_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("PCA_SHARED", REPO.parent / "shared"))


def run_seed_script() -> bool:
    """The acceptance script of PR #138101, unmodified."""
    script = shared_dir() / "seed" / "r2.py"
    print(f"== Seed scenarios: {script}")
    if not script.exists():
        print("   MISSING: set PCA_SHARED to the directory holding seed/r2.py")
        return False
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as extensions:
        result = subprocess.run(
            [sys.executable, str(script)],
            env={**os.environ, "TORCH_EXTENSIONS_DIR": extensions},
            capture_output=True,
            text=True,
        )
    elapsed = time.perf_counter() - start
    passed = result.returncode == 0
    print(
        "   1. hook with side effects            \n"
        "   2. non-traceable C++ Function (graph break)\n"
        "   3. no guessed metadata (hook makes grad contiguous)"
    )
    print(f"   {'PASS' if passed else 'FAIL'} ({elapsed:.0f} s, including two C++ extension builds)")
    if not passed:
        print(result.stdout[-3000:], result.stderr[-3000:])
    return passed


def hook_scenario() -> bool:
    """Seed scenario 1 in-process, under each engine."""
    print("== Seed scenario 1 under each engine (backend='eager')")
    ok = True
    for engine in ENGINES:
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        y = x**2
        seen = []
        y.register_hook(lambda grad, seen=seen: seen.append(grad) or 2 * grad)
        loss = y.sum()
        if engine == "eager":
            loss.backward()
        else:
            torch._dynamo.config.compiled_autograd_engine = engine
            with torch._dynamo.compiled_autograd.enable(lambda gm: torch.compile(gm, backend="eager")):
                loss.backward()
        passed = torch.equal(x.grad, 4 * x.detach()) and torch.equal(seen[0], torch.ones(3))
        ok &= passed
        print(f"   {engine:<7} x.grad={x.grad.tolist()}  hook saw {seen[0].tolist()}  {'PASS' if passed else 'FAIL'}")
    torch._dynamo.config.compiled_autograd_engine = "python"
    return ok


def model_comparison(model_name: str, backend: str, batch: int) -> bool:
    make_model, make_input = MODELS[model_name]
    torch.manual_seed(0)
    model = make_model()
    print(f"== {model_name}, batch {batch}, compiled backward with torch.compile(backend={backend!r})")
    torch._dynamo.reset()
    timings = time_backwards(model, lambda: make_input(batch), ENGINES, backend, rounds=STEADY_ROUNDS)
    eager = timings["eager"]
    exact = backend != "inductor"
    ok = True
    print(f"   steady backward: median of {STEADY_ROUNDS} rounds, each timing one backward per engine in rotating order")
    print(f"   {'engine':<8}{'max|grad-eager|':>16}{'first backward':>16}{'steady backward':>17}{'vs eager':>10}")
    for engine, timing in timings.items():
        diff = max_abs_diff(timing.grads, eager.grads)
        tolerance = 0.0 if exact else 1e-4
        passed = diff <= tolerance
        ok &= passed
        print(
            f"   {engine:<8}{diff:>16.2e}{timing.first_s:>14.2f} s{timing.steady_s * 1e3:>14.2f} ms"
            f"{timing.steady_s / eager.steady_s:>9.2f}x  {'PASS' if passed else 'FAIL'}"
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer_encoder", choices=sorted(MODELS))
    parser.add_argument("--backend", default="inductor", choices=["eager", "aot_eager", "inductor"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--skip-seed-script", action="store_true")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, compiled autograd engine: {torch._dynamo.config.compiled_autograd_engine}\n")
    results = []
    if not args.skip_seed_script:
        results.append(run_seed_script())
    results.append(hook_scenario())
    results.append(model_comparison(args.model, args.backend, args.batch))
    print("\nALL PASS" if all(results) else "\nSOME CHECKS FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
