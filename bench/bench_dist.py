"""`make bench-dist`: training-step time under torch.distributed (2 processes,
gloo, CPU) with eager autograd, the legacy compiled autograd engine and the
Python engine, for

- case 1: DDP with its default C++ reducer (hooks: C++ post hooks on
  AccumulateGrad; the Python engine runs such backwards on eager autograd, the
  legacy engine refuses them);
- case 2: DDP built with ``torch._dynamo.config.optimize_ddp = "python_reducer"``
  (hooks: Python post-accumulate-grad hooks with functional all-reduces, which
  the compiled engines capture and Dynamo traces).

Both ranks run every (model, case, engine) in turn in one pair of spawned
processes (test/distributed_workers.py, shared with test/test_distributed.py),
``--steps`` SGD steps each from the same seeds. A step is forward, backward,
``opt.step()`` and ``zero_grad``; its time is the slower rank's. Reported per
run: the median step and backward time over the steps after ``--warmup``, the
first step (capture and compile included; Inductor's cache directory is new
for every invocation, so it is a cold compile), captures and eager fallbacks
(rank 0's compiled-autograd counters), and the largest difference of losses
and final parameters from eager DDP's. The forward is not compiled.
Never asserts on a time. docs/distributed.md describes what runs where.

Writes OUT.json (every raw number) and OUT.md (the table).

Usage: python bench/bench_dist.py [--backend inductor|aot_eager|eager]
                                  [--models mlp gpt2] [--steps N] [--warmup N]
                                  [--out STEM]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import shlex
import statistics
import sys
import tempfile
import time
from typing import Any, Optional

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent / "test"))

import torch  # noqa: E402

import distributed_workers as dw  # noqa: E402

sys.path.insert(0, str(BENCH))
from bench import source_version  # noqa: E402

ENGINES = ("eager", "legacy", "python")
CASES = {
    "ddp": "1: DDP, C++ reducer",
    "ddp_python_reducer": "2: DDP, python_reducer",
}
WORLD = 2


def log(message: str) -> None:
    print(f"[bench-dist {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run_name(model: str, mode: str, engine: str) -> str:
    return f"{model}/{mode}/{engine}"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(((x.double() - y.double()).abs().max().item() for x, y in zip(a, b)), default=0.0)


def summarize(per_rank: dict[int, dict[str, Any]], reference: Optional[dict[int, dict[str, Any]]],
              warmup: int) -> dict[str, Any]:
    """One run (both ranks' results) as a row of the table."""
    r0 = per_rank[0]
    row: dict[str, Any] = {"error": None}
    for rank, r in per_rank.items():
        if "error" in r:
            row["error"] = f"rank {rank}: {r['error']}"
            row["traceback"] = r.get("traceback")
            return row
    steps = [max(ts) for ts in zip(*(r["step_s"] for r in per_rank.values()))]
    backwards = [max(ts) for ts in zip(*(r["backward_s"] for r in per_rank.values()))]
    row.update(
        step_s=steps,
        backward_s=backwards,
        first_step_s=steps[0],
        median_step_s=statistics.median(steps[warmup:]),
        median_backward_s=statistics.median(backwards[warmup:]),
        captures=r0["counters"].get("captures", 0),
        eager_fallbacks=r0["counters"].get("eager_fallbacks", 0),
        dynamo_graphs=len(r0["dynamo_graphs"]),
        warnings=sorted(set(r0["warnings"])),
        losses={rank: [x.item() for x in r["losses"]] for rank, r in per_rank.items()},
    )
    if reference is not None and all("error" not in r for r in reference.values()):
        row["max_loss_diff"] = max(
            max_diff(r["losses"], reference[rank]["losses"]) for rank, r in per_rank.items())
        row["max_param_diff"] = max(
            max_diff(r["params"], reference[rank]["params"]) for rank, r in per_rank.items())
    return row


def ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def render(results: dict[str, Any]) -> str:
    env = results["environment"]
    lines = [
        "# Distributed benchmark (`make bench-dist`)",
        "",
        f"{env['date']}; {env['machine']}; torch {env['torch']}; {env['source']}; "
        f"backend `{env['backend']}`; {env['world_size']} processes (gloo, CPU, "
        f"{env['threads_per_rank']} thread each); {env['steps']} steps, median over "
        f"steps {env['warmup'] + 1}-{env['steps']}; command `{env['command']}`.",
        "",
        "Step = forward + backward + SGD step + zero_grad, the slower rank's time. "
        "*vs eager*: median step / the same case's eager median. *Δ vs eager DDP*: "
        "largest difference of losses and final parameters (both ranks) from eager "
        "DDP with the C++ reducer. *fallbacks*: backwards the Python engine handed to "
        "eager autograd.",
        "",
        "| model | case | engine | step ms (median) | vs eager | backward ms (median) "
        "| first step s | captures | fallbacks | Δ loss | Δ params | note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in results["runs"]:
        case = CASES[row["mode"]]
        if row["error"]:
            lines.append(f"| {row['model']} | {case} | {row['engine']} | - | - | - | - | - | - "
                         f"| - | - | error: {row['error'][:160]} |")
            continue
        eager = next(r for r in results["runs"] if r["model"] == row["model"]
                     and r["mode"] == row["mode"] and r["engine"] == "eager")
        ratio = (f"{row['median_step_s'] / eager['median_step_s']:.2f}"
                 if not eager["error"] else "-")
        note = ""
        if row["engine"] == "python" and row["eager_fallbacks"]:
            note = "every backward ran on eager autograd"
        lines.append(
            f"| {row['model']} | {case} | {row['engine']} | {ms(row['median_step_s'])} | {ratio} "
            f"| {ms(row['median_backward_s'])} | {row['first_step_s']:.2f} | {row['captures']} "
            f"| {row['eager_fallbacks']} | {row.get('max_loss_diff', float('nan')):.1e} "
            f"| {row.get('max_param_diff', float('nan')):.1e} | {note} |")
    lines += ["", "Models (`test/distributed_workers.py`, size \"bench\"): " + "; ".join(
        results["environment"]["model_descriptions"]), ""]
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="inductor", choices=("inductor", "aot_eager", "eager"))
    parser.add_argument("--models", nargs="+", default=["mlp", "gpt2"], choices=("mlp", "gpt2"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the medians")
    parser.add_argument("--size", default="bench", choices=("bench", "test"))
    parser.add_argument("--out", default=str(BENCH / "results-dist"))
    args = parser.parse_args(argv)
    if not 0 <= args.warmup < args.steps:
        parser.error("--warmup must be smaller than --steps")
    command = shlex.join([pathlib.Path(sys.argv[0]).name] + (argv if argv is not None else sys.argv[1:]))

    cases = [
        dict(name=run_name(model, mode, engine), model_name=model, mode=mode, engine=engine,
             compiler=args.backend, steps=args.steps, size=args.size)
        for model in args.models for mode in CASES for engine in ENGINES
    ]
    with tempfile.TemporaryDirectory(prefix="bench-dist-") as tmp:
        # A cold Inductor cache for this invocation, shared by both ranks.
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(pathlib.Path(tmp) / "inductor")
        out_dir = pathlib.Path(tmp) / "ranks"
        out_dir.mkdir()
        log(f"{len(cases)} runs on {WORLD} processes, backend {args.backend}, {args.steps} steps")
        start = time.perf_counter()
        launched = dw.launch(cases, str(out_dir), WORLD, join_timeout_s=3600,
                             pg_timeout_s=1800)
        log(f"done in {time.perf_counter() - start:.0f} s; exit codes {launched['exitcodes']}")
    found = {rank: dw.by_name(launched, rank) for rank in range(WORLD)}

    runs = []
    for c in cases:
        model, mode, engine = c["model_name"], c["mode"], c["engine"]
        per_rank = {rank: found[rank].get(c["name"]) for rank in range(WORLD)}
        if any(r is None for r in per_rank.values()):
            row = {"error": f"no result (exit codes {launched['exitcodes']})"}
        else:
            ref_name = run_name(model, "ddp", "eager")
            reference = ({rank: found[rank][ref_name] for rank in range(WORLD)}
                         if all(ref_name in found[rank] for rank in range(WORLD)) else None)
            row = summarize(per_rank, reference, args.warmup)
        runs.append(dict(model=model, mode=mode, engine=engine) | row)

    descriptions = []
    for model in args.models:
        m = dw.make_model(model, args.size)
        n = sum(p.numel() for p in m.parameters())
        descriptions.append(f"`{model}` {type(m).__name__}, {n:,} parameters")
    results = {
        "environment": {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": command,
            "machine": machine(),
            "torch": torch.__version__,
            "source": source_version(),
            "backend": args.backend,
            "world_size": WORLD,
            "threads_per_rank": 1,
            "steps": args.steps,
            "warmup": args.warmup,
            "size": args.size,
            "model_descriptions": descriptions,
            "exitcodes": launched["exitcodes"],
            "killed": launched["killed"],
        },
        "runs": runs,
    }
    out = pathlib.Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    markdown = render(results)
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    return 0 if launched["exitcodes"] == [0] * WORLD and not launched["killed"] else 1


if __name__ == "__main__":
    sys.exit(main())
