"""Markdown tables from bench.py's results (the dict written to OUT.json).

Usage: python bench/report.py bench/results.json   # prints the markdown again
"""

import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any, Optional

MiB = 1024 * 1024


def fmt(value: Optional[float], spec: str, suffix: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{suffix}"


def fmt_diff(value: Optional[float]) -> str:
    if value is None:
        return ""
    return "0" if value == 0 else f"{value:.1e}"


def fmt_bytes(value: Optional[int]) -> str:
    if value is None:
        return ""
    for unit, size in (("MiB", MiB), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def spread_ms(samples: Sequence[float]) -> str:
    """Interquartile range of the steady-state samples, in ms."""
    if len(samples) < 4:
        return ""
    q = statistics.quantiles(samples, n=4)
    return f"{q[0] * 1e3:.3f}-{q[2] * 1e3:.3f}"


def ratio(value: Optional[float], reference: Optional[float]) -> Optional[float]:
    return value / reference if value is not None and reference else None


def notes(engine: dict[str, Any]) -> str:
    """Anything that makes a row's numbers mean something other than they seem."""
    parts = []
    fallbacks = engine["first_eager_fallbacks"] + engine["steady_eager_fallbacks"]
    if fallbacks:
        parts.append(f"{fallbacks} backwards fell back to eager autograd")
    if engine["warmup_captures"] or engine["warmup_dynamo_compiles"]:
        parts.append(f"warm-up: {engine['warmup_captures']} captures, {engine['warmup_dynamo_compiles']} compiles")
    if engine["steady_captures"] or engine["steady_dynamo_compiles"]:
        parts.append(f"steady state: {engine['steady_captures']} captures, {engine['steady_dynamo_compiles']} compiles")
    if engine["error"] and engine["steady_median_s"] is not None:
        parts.append(f"error after the steady state: {engine['error']}")
    return "; ".join(parts)


def engine_row(model: dict[str, Any], engine: dict[str, Any], eager: dict[str, Any]) -> list[str]:
    name = model["name"]
    if engine["error"] and engine["first_s"] is None:
        return [name, engine["engine"], f"error: {engine['error']}"] + [""] * 13
    compiled = engine["engine"] != "eager"
    fx_nodes = ", ".join(str(n) for n in engine["fx_nodes"])
    steady = fmt(engine["steady_ratio"] if compiled else 1.0, ".2f", "x")
    if engine["steady_median_s"] is None and engine["error"]:
        steady = f"error: {engine['error']}"  # failed after its first backward
    return [
        name,
        engine["engine"],
        steady,
        fmt(ratio(engine["peak_bytes"], eager["peak_bytes"]), ".2f", "x"),
        fmt(None if engine["steady_median_s"] is None else engine["steady_median_s"] * 1e3, ".3f"),
        spread_ms(engine["steady_s"]),
        fmt(engine["first_s"], ".3f"),
        fmt(engine["capture_s"], ".3f"),
        fmt(engine["compile_run_s"], ".2f"),
        str(engine["first_captures"]) if compiled else "",
        str(engine["first_dynamo_compiles"]) if compiled else "",
        fmt_bytes(engine["peak_bytes"]),
        fmt_diff(engine["grad_max_abs_diff"]) if compiled else "",
        str(model["autograd_nodes"]),
        fx_nodes,
        notes(engine),
    ]


MAIN_HEADER = [
    "model", "engine", "steady vs eager", "peak mem vs eager", "steady median (ms)", "p25-p75 (ms)",
    "first bwd (s)", "capture (s)", "compile+run (s)", "captures", "Dynamo compiles",
    "peak mem", "max abs grad diff", "autograd nodes", "fx nodes", "notes",
]


def main_table(models: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for model in models:
        if model["error"] and not model["engines"]:
            rows.append([model["name"], "", f"error: {model['error']}"] + [""] * 13)
            continue
        eager = model["engines"]["eager"]
        for engine in model["engines"].values():
            rows.append(engine_row(model, engine, eager))
        if model["error"]:
            rows.append([model["name"], "(all)", f"error: {model['error']}"] + [""] * 13)
    return rows


DYNAMIC_HEADER = [
    "model", "engine", "shapes (batch x seq), in order", "captures", "Dynamo compiles",
    "per step: captures/compiles", "time (s)", "steady afterwards vs eager", "steady afterwards (ms)",
]


def dynamic_table(models: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for model in models:
        eager_median = model["engines"].get("eager", {}).get("steady_median_s")
        for run in model["dynamic"].values():
            phases = split_dynamic(model, run["steps"])
            after = run.get("after_median_s")
            after_reference = run.get("after_eager_median_s") or eager_median
            for phase_idx, (label, steps) in enumerate(phases):
                last = phase_idx == len(phases) - 1
                after_cells = (
                    [fmt(ratio(after, after_reference), ".2f", "x"), fmt(after * 1e3, ".3f")]
                    if last and after is not None
                    else ["", ""]
                )
                shapes = ", ".join(f"{s['batch']}x{s['seq']}" if model["seq"] else str(s["batch"]) for s in steps)
                rows.append([
                    model["name"],
                    run["engine"],
                    f"{label}: {shapes}",
                    *(str(count) for count in captures_and_compiles(steps)),
                    ", ".join(f"{s['captures']}/{s['dynamo_compiles']}" for s in steps),
                    fmt(sum(s["seconds"] for s in steps), ".2f"),
                    *after_cells,
                ])
            if run["error"]:
                rows.append([model["name"], run["engine"], f"error: {run['error']}", "", "", "", "", "", ""])
    return rows


def captures_and_compiles(steps: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """Captures and Dynamo compiles that a run of shape-sequence steps caused."""
    return sum(s["captures"] for s in steps), sum(s["dynamo_compiles"] for s in steps)


def split_dynamic(model: dict[str, Any], steps: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """bench.py runs the batch sizes first (at the model's sequence length), then
    the sequence lengths (at its batch size), without a reset in between."""
    count = len(model["dynamic_batches"])
    phases = [(f"batch (seq {model['seq']})" if model["seq"] else "batch", steps[:count])]
    if steps[count:]:
        phases.append((f"seq (batch {model['batch']})", steps[count:]))
    return [(label, s) for label, s in phases if s]


OVERHEAD_MODEL = "elementwise20"  # the 20-op graph: its ratio is a target of its own

SUMMARY_HEADER = [
    "engine", "steady vs eager, geomean", "worst steady vs eager", "steady slower than legacy",
    "20-op graph steady vs eager",
    "worst capture vs legacy", "worst first bwd vs legacy", "most fx nodes per autograd node",
    "most peak mem vs eager", "most captures / Dynamo compiles over a shape sequence",
]


def worst(values: Sequence[tuple[str, float]], spec: str, suffix: str = "x") -> str:
    """The largest value and the model it came from."""
    if not values:
        return ""
    name, value = max(values, key=lambda item: item[1])
    return f"{value:{spec}}{suffix} ({name})"


def summary_table(models: Sequence[dict[str, Any]]) -> list[list[str]]:
    """One row per compiled engine with what the issue's targets are about, each the
    geomean or the worst model, so a target is read off without recomputing."""
    engines = [e for e in dict.fromkeys(e for m in models for e in m["engines"]) if e != "eager"]
    rows = []
    for name in engines:
        steady, overhead, capture, first, fx_per_node, memory, shapes = [], [], [], [], [], [], []
        slower_than_legacy = []
        for model in models:
            engine, legacy = model["engines"].get(name), model["engines"].get("legacy")
            eager = model["engines"].get("eager")
            if engine is None or eager is None:
                continue
            label = model["name"]
            if engine["steady_ratio"] is not None:
                (overhead if label == OVERHEAD_MODEL else steady).append((label, engine["steady_ratio"]))
            if legacy is not None and name != "legacy":
                mine, legacys = engine["steady_ratio"], legacy["steady_ratio"]
                if mine is not None and legacys is not None and mine > legacys:
                    slower_than_legacy.append(label)
                for target, key in ((capture, "capture_s"), (first, "first_s")):
                    value = ratio(engine[key], legacy[key])
                    if value is not None:
                        target.append((label, value))
            if engine["fx_nodes"] and model["autograd_nodes"]:
                fx_per_node.append((label, max(engine["fx_nodes"]) / model["autograd_nodes"]))
            peak = ratio(engine["peak_bytes"], eager["peak_bytes"])
            if peak is not None:
                memory.append((label, peak))
            run = model["dynamic"].get(name)
            if run and run["steps"] and not run["error"]:
                shapes.append((label, *captures_and_compiles(run["steps"])))
        geomean = statistics.geometric_mean([v for _, v in steady]) if steady else None
        most_shapes = max(shapes, key=lambda item: item[1:], default=None)
        rows.append([
            name,
            fmt(geomean, ".2f", f"x over {len(steady)} model" + ("s" if len(steady) > 1 else "")),
            worst(steady, ".2f"),
            "" if name == "legacy" else ", ".join(slower_than_legacy) or "none",
            "".join(fmt(v, ".2f", "x") for _, v in overhead),
            worst(capture, ".3f"),
            worst(first, ".2f"),
            worst(fx_per_node, ".1f", ""),
            worst(memory, ".2f"),
            "" if most_shapes is None else f"{most_shapes[1]} / {most_shapes[2]} ({most_shapes[0]})",
        ])
    return rows


PHASE_HEADER = [
    "model", "first backward (s)", "steady state (s)", "memory (s)", "dynamic shapes (s)", "total (s)",
    "CPU used by other processes during steady state",
]


def phase_table(models: Sequence[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for model in models:
        phases = model["phase_seconds"]
        names = ("first_backward", "steady_state", "memory", "dynamic_shapes")
        other = model.get("steady_other_cpu")
        rows.append([
            model["name"], *(fmt(phases.get(n), ".0f") for n in names), fmt(sum(phases.values()), ".0f"),
            "" if other is None else f"{other:.0%}",
        ])
    return rows


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(data: dict[str, Any]) -> str:
    env, models = data["environment"], data["models"]
    total = env.get("total_seconds")
    return "\n".join([
        "# Compiled autograd benchmark",
        "",
        f"- command: `{env['command']}`",
        f"- date: {env['date']}" + (f"; wall time {total / 60:.1f} min" if total else ""),
        f"- machine: {env['machine']}; torch threads: {env['torch_threads']}; 1-min load average"
        f" {env['load_average_start']:.2f} at the start, {env.get('load_average_end', float('nan')):.2f} at the end",
        f"- torch {env['torch']}, Python {env['python']}, transformers {env['transformers']}",
        *([f"- source: {env['source']}"] if "source" in env else []),
        f"- compiler_fn: `torch.compile(gm, backend={env['backend']!r})`"
        + (", with `torch._inductor.config.cpp_wrapper = True`" if env.get("inductor_cpp_wrapper") else ""),
        "",
        "Engines: *eager* (no compiled autograd), *legacy* (upstream's compiled autograd),",
        "*python* (this project's engine, Dynamo's default shape handling: specialized first",
        "compile, recompiled once when a size changes) and *python-symbolic* (the same engine with",
        "`compiled_autograd_symbolic_sizes = True`: every size symbolic from the first compile),",
        "run interleaved in one process. Ratios are to",
        "eager: below 1 is faster / smaller. Times in the first columns are steady-state",
        "medians; first-backward times are cold (fresh Dynamo and Inductor caches).",
        "How each number is measured: docs/performance.md, \"Methodology\".",
        "",
        "## The issue's targets, per compiled engine",
        "",
        "Read off the tables below: the geomean of the steady-state ratios over every model",
        f"but `{OVERHEAD_MODEL}` (the 20-op graph, its own column), and for the other columns",
        "the worst model, named. Shape sequences count the captures and Dynamo compiles of all",
        "their steps (from a warm cache at the standard shape).",
        "",
        table(SUMMARY_HEADER, summary_table(models)),
        "",
        "## Per model and engine",
        "",
        table(MAIN_HEADER, main_table(models)),
        "",
        "## Dynamic shapes: captures and Dynamo compiles over a shape sequence",
        "",
        "Continuing from the steady state (each engine's cache warm at the model's standard",
        "shape, the first table), one backward per shape in the order listed: batch sizes",
        "first, then (sequence models) sequence lengths. A step's captures/compiles are",
        "those that shape caused; an engine that handles new sizes without work shows 0/0.",
        "*Steady afterwards*: median of the backwards (bench.py's AFTER_SHAPES_REPS) at the standard shape once the",
        "sequence is over, i.e. on the graph Dynamo compiled for changing sizes; its ratio is to",
        "the median of eager backwards interleaved with them (results from before that was",
        "measured: to eager's steady-state median in the first table).",
        "",
        table(DYNAMIC_HEADER, dynamic_table(models)),
        "",
        "## Where the benchmark's time went",
        "",
        table(PHASE_HEADER, phase_table(models)),
        "",
        "The last column is the share of the machine's CPU time that other processes used",
        "while the steady state was timed: timings taken with it well above 0% are noisy.",
        "",
    ])


def main(argv: Sequence[str]) -> int:
    with open(argv[0]) as f:
        print(render_markdown(json.load(f)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
