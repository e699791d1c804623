"""`make bench`: backward passes of several models under eager autograd, the
legacy compiled autograd engine and the Python engine, in one process.

For each model it measures, per engine: the first backward (split into phase-1
capture and compile + first run), the steady-state backward (median of
interleaved repetitions: every repetition runs each engine once, in rotating
order, so that machine noise hits all engines alike), captures and Dynamo
compiles, peak memory allocated during the backward, the gradients' largest
difference from eager's, and graph sizes; then, per compiled engine, the
captures and Dynamo compiles over a sequence of batch sizes (and sequence
lengths). docs/performance.md describes each measurement.

Writes OUT.json (every raw number) and OUT.md (tables). Never asserts on times.

Usage: python bench/bench.py [--quick] [--backend inductor|aot_eager|eager]
                             [--cpp-wrapper] [--models NAME ...] [--reps N] [--out STEM]
"""

import argparse
import contextlib
import datetime
import gc
import json
import os
import pathlib
import platform
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from engines import CaptureTimer, CompilerRecorder, backward_engine, rotation, timed_backward  # noqa: E402
import report  # noqa: E402
from workloads import FULL, MODELS, QUICK, Inputs, Model, count_autograd_nodes  # noqa: E402
from helpers import backward_memory  # noqa: E402  (test/ is on sys.path through workloads)

ENGINES = ("eager", "legacy", "python", "python-symbolic")
COMPILED_ENGINES = ("legacy", "python", "python-symbolic")
WARMUP_REPS = 3
AFTER_SHAPES_REPS = 20  # rounds of (engine, eager) backwards at the standard shape after the shape sequence
MODEL_SEED = 0
INPUT_SEED = 1


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass
class EngineResult:
    """One model under one engine. Times in seconds, memory in bytes."""

    engine: str
    error: Optional[str] = None  # first failure, "Type: message"; later phases skipped
    error_traceback: Optional[str] = None
    first_s: Optional[float] = None
    capture_s: Optional[float] = None  # phase 1 of the first backward (compiled engines)
    compile_run_s: Optional[float] = None  # first_s - capture_s
    first_captures: int = 0
    first_dynamo_compiles: int = 0
    first_eager_fallbacks: int = 0
    fx_nodes: list[int] = field(default_factory=list)  # per captured graph handed to compiler_fn
    grad_max_abs_diff: Optional[float] = None  # first backward's gradients vs eager's
    warmup_captures: int = 0
    warmup_dynamo_compiles: int = 0
    steady_s: list[float] = field(default_factory=list)
    steady_median_s: Optional[float] = None
    steady_ratio: Optional[float] = None  # steady_median_s / eager's
    steady_captures: int = 0  # should stay 0: a cache miss in steady state
    steady_dynamo_compiles: int = 0
    steady_eager_fallbacks: int = 0
    peak_bytes: Optional[int] = None  # above the allocation level at the backward's start
    end_bytes: Optional[int] = None  # net change over the backward (the new .grad tensors)


@dataclass
class DynamicStep:
    batch: int
    seq: int
    seconds: float
    captures: int
    dynamo_compiles: int
    eager_fallbacks: int


@dataclass
class DynamicRun:
    """One compiled engine over a sequence of shapes, starting from torch._dynamo.reset()."""

    engine: str
    steps: list[DynamicStep] = field(default_factory=list)
    # Steady state at the standard shape once the sequence is over: what the
    # graph Dynamo compiled for changing sizes costs per backward, and eager's
    # backwards interleaved with it (the ratio's reference).
    after_s: list[float] = field(default_factory=list)
    after_median_s: Optional[float] = None
    after_eager_s: list[float] = field(default_factory=list)
    after_eager_median_s: Optional[float] = None
    error: Optional[str] = None
    error_traceback: Optional[str] = None


@dataclass
class ModelResult:
    name: str
    description: str
    batch: int
    seq: int
    dynamic_batches: list[int] = field(default_factory=list)
    dynamic_seqs: list[int] = field(default_factory=list)
    parameters: int = 0
    autograd_nodes: Optional[int] = None
    error: Optional[str] = None  # the model itself failed (build, eager backward, steady-state loop)
    error_traceback: Optional[str] = None
    engines: dict[str, EngineResult] = field(default_factory=dict)
    dynamic: dict[str, DynamicRun] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=dict)  # wall time of the harness
    steady_other_cpu: Optional[float] = None  # CpuContention.other_share over the steady state


def describe_error(exc: BaseException) -> tuple[str, str]:
    """("Type: first line of message", traceback truncated to its last 4000 characters)."""
    message = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {message[0] if message else ''}"
    return text[:300], traceback.format_exc()[-4000:]


# ---------------------------------------------------------------------------
# Counters, caches and one backward
# ---------------------------------------------------------------------------


def counter_snapshot() -> dict[str, int]:
    """Captures (either engine), Dynamo graphs compiled, python-engine eager fallbacks."""
    return {
        "captures": counters["compiled_autograd"]["captures"],
        "dynamo_compiles": counters["stats"]["unique_graphs"],
        "eager_fallbacks": counters["compiled_autograd"]["eager_fallbacks"],
    }


def counter_delta(before: dict[str, int]) -> dict[str, int]:
    after = counter_snapshot()
    return {key: after[key] - before[key] for key in before}


def reset_compilers() -> None:
    """torch._dynamo.reset(): forgets both engines' captured graphs and Dynamo's
    compiled code. A failed backward may leave the compiled autograd region
    flag set, which reset() refuses; clear it first."""
    torch._dynamo.compiled_autograd.in_compiled_autograd_region = False
    torch._dynamo.reset()


@contextlib.contextmanager
def cold_compiler_caches(cache_root: pathlib.Path) -> Iterator[None]:
    """Inductor (and AOTAutograd) caches start empty inside: a new cache
    directory and cleared in-memory caches, so that one engine's compiled
    kernels are never reused by the other, nor by a later run of the benchmark."""
    from torch._inductor.utils import fresh_cache

    with fresh_cache(dir=str(cache_root), delete=False):
        yield


def forward_loss(model: nn.Module, spec: Model, inputs: Inputs) -> Tensor:
    """Clears the gradients (to None) and runs the forward pass: one fresh graph."""
    model.zero_grad(set_to_none=True)
    return spec.loss(model, inputs)


def gradients(model: nn.Module) -> list[Optional[Tensor]]:
    return [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]


def grads_max_abs_diff(grads: Sequence[Optional[Tensor]], reference: Sequence[Optional[Tensor]]) -> float:
    """Largest |g - g_ref| over all parameters; inf where only one of them has a gradient."""
    worst = 0.0
    for g, ref in zip(grads, reference, strict=True):
        if g is None and ref is None:
            continue
        if g is None or ref is None:
            return float("inf")
        worst = max(worst, (g.double() - ref.double()).abs().max().item() if g.numel() else 0.0)
    return worst


# ---------------------------------------------------------------------------
# Phases of one model
# ---------------------------------------------------------------------------


def measure_first_backward(
    result: EngineResult,
    model: nn.Module,
    spec: Model,
    inputs: Inputs,
    recorder: Optional[CompilerRecorder],
    cache_root: pathlib.Path,
) -> list[Optional[Tensor]]:
    """The engine's first backward for this model: total time, capture time,
    captures, Dynamo compiles, graph sizes. Returns its gradients."""
    loss = forward_loss(model, spec, inputs)
    before = counter_snapshot()
    caches = cold_compiler_caches(cache_root) if recorder else contextlib.nullcontext()
    with caches, CaptureTimer() as capture_timer:
        result.first_s = timed_backward(loss, result.engine, recorder)
    delta = counter_delta(before)
    result.first_captures = delta["captures"]
    result.first_dynamo_compiles = delta["dynamo_compiles"]
    result.first_eager_fallbacks = delta["eager_fallbacks"]
    if recorder:
        result.capture_s = sum(capture_timer.seconds)
        result.compile_run_s = result.first_s - result.capture_s
        result.fx_nodes = list(recorder.graph_nodes)
    return gradients(model)


def warm_up(result: EngineResult, model: nn.Module, spec: Model, inputs: Inputs, recorder: Optional[CompilerRecorder]) -> None:
    """A few backwards after the first, so any late recompilation happens before timing."""
    before = counter_snapshot()
    for _ in range(WARMUP_REPS):
        timed_backward(forward_loss(model, spec, inputs), result.engine, recorder)
    delta = counter_delta(before)
    result.warmup_captures = delta["captures"]
    result.warmup_dynamo_compiles = delta["dynamo_compiles"]


def steady_backward(
    result: EngineResult, model: nn.Module, spec: Model, inputs: Inputs, recorder: Optional[CompilerRecorder]
) -> None:
    """One timed steady-state backward; captures or compiles it caused are counted."""
    loss = forward_loss(model, spec, inputs)
    before = counter_snapshot()
    result.steady_s.append(timed_backward(loss, result.engine, recorder))
    delta = counter_delta(before)
    result.steady_captures += delta["captures"]
    result.steady_dynamo_compiles += delta["dynamo_compiles"]
    result.steady_eager_fallbacks += delta["eager_fallbacks"]


def measure_steady_state(
    results: dict[str, EngineResult],
    model: nn.Module,
    spec: Model,
    inputs: Inputs,
    recorders: dict[str, Optional[CompilerRecorder]],
    reps: int,
) -> None:
    """``reps`` rounds; each round times one backward per engine, the order
    rotating from round to round. An engine that fails drops out (its error
    recorded); the others go on. Sets medians and ratios to eager's median."""
    engines = list(results)
    failed: set[str] = set()
    for rep in range(reps):
        for engine in rotation(engines, rep):
            if engine not in failed and not guarded(
                results[engine], f"{engine} steady state", steady_backward, results[engine], model, spec, inputs, recorders[engine]
            ):
                failed.add(engine)
    for result in results.values():
        if result.steady_s and result.error is None:
            result.steady_median_s = statistics.median(result.steady_s)
    eager = results.get("eager")
    for result in results.values():
        if eager and eager.steady_median_s and result.steady_median_s is not None:
            result.steady_ratio = result.steady_median_s / eager.steady_median_s


def measure_backward_memory(
    result: EngineResult, model: nn.Module, spec: Model, inputs: Inputs, recorder: Optional[CompilerRecorder]
) -> None:
    """Peak of bytes allocated during one (warm) backward above the level at
    its start (``peak_bytes``), and the net change at its end (``end_bytes``),
    from the profiler's memory events: test/helpers.py ``backward_memory``."""
    result.peak_bytes, result.end_bytes = backward_memory(
        lambda: forward_loss(model, spec, inputs), backward_engine(result.engine, compiler_fn=recorder)
    )


def run_dynamic_sequence(
    run: DynamicRun, model: nn.Module, spec: Model, recorder: CompilerRecorder, cache_root: pathlib.Path
) -> None:
    """Continuing from the steady state (the engine's cache is warm at the
    model's standard shape), one backward at each batch size of
    ``spec.dynamic_batches`` (at the standard sequence length), then at each
    sequence length of ``spec.dynamic_seqs`` (at the standard batch size),
    counting captures and Dynamo compiles per step. New compilations get cold
    Inductor caches."""
    shapes = [(batch, spec.seq) for batch in spec.dynamic_batches]
    shapes += [(spec.batch, seq) for seq in spec.dynamic_seqs]
    with cold_compiler_caches(cache_root):
        for batch, seq in shapes:
            torch.manual_seed(INPUT_SEED)
            loss = forward_loss(model, spec, spec.make_inputs(batch, seq))
            before = counter_snapshot()
            seconds = timed_backward(loss, run.engine, recorder)
            delta = counter_delta(before)
            run.steps.append(DynamicStep(batch, seq, seconds, delta["captures"], delta["dynamo_compiles"], delta["eager_fallbacks"]))
    torch.manual_seed(INPUT_SEED)
    inputs = spec.make_inputs(spec.batch, spec.seq)
    timings = {"eager": run.after_eager_s, run.engine: run.after_s}
    for rep in range(AFTER_SHAPES_REPS):
        for engine in rotation(list(timings), rep):
            timings[engine].append(timed_backward(forward_loss(model, spec, inputs), engine, recorder))
    run.after_median_s = statistics.median(run.after_s)
    run.after_eager_median_s = statistics.median(run.after_eager_s)


class CpuContention:
    """Share of the machine's CPU time that other processes used while active
    (0: the benchmark had the machine to itself; 1: every core busy with
    something else), from /proc/stat and /proc/self/stat. Linux only; None elsewhere."""

    def __init__(self) -> None:
        self.other_share: Optional[float] = None

    @staticmethod
    def _sample() -> Optional[tuple[int, int]]:
        try:
            fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
            own = pathlib.Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError, IndexError):
            return None
        busy = sum(fields) - fields[3] - fields[4]  # all but idle and iowait
        return busy, int(own[11]) + int(own[12])  # utime + stime of this process

    def __enter__(self) -> "CpuContention":
        self._start, self._wall = self._sample(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        end = self._sample()
        if self._start is None or end is None:
            return
        ticks = os.sysconf("SC_CLK_TCK") * (time.perf_counter() - self._wall) * (os.cpu_count() or 1)
        other = (end[0] - self._start[0]) - (end[1] - self._start[1])
        self.other_share = max(0.0, min(1.0, other / ticks)) if ticks else None


# ---------------------------------------------------------------------------
# One model, all engines
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def timed_phase(result: ModelResult, name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        result.phase_seconds[name] = result.phase_seconds.get(name, 0.0) + time.perf_counter() - start


def guarded(result: Any, what: str, fn: Any, *args: Any) -> bool:
    """Runs ``fn(*args)``; on an exception records it in ``result.error`` (and
    its traceback) and logs it. Returns whether it succeeded."""
    try:
        fn(*args)
        return True
    except Exception as exc:  # noqa: BLE001 -- every failure is recorded and reported
        result.error, result.error_traceback = describe_error(exc)
        log(f"   {what} FAILED: {result.error}")
        return False


def working(result: ModelResult) -> dict[str, EngineResult]:
    """The model's engines that have not failed so far."""
    return {name: r for name, r in result.engines.items() if r.error is None}


def run_first_backwards(
    result: ModelResult,
    model: nn.Module,
    spec: Model,
    inputs: Inputs,
    recorders: dict[str, Optional[CompilerRecorder]],
    cache_root: pathlib.Path,
) -> None:
    """Each engine's first backward after one reset (eager, legacy, python), then
    the compiled engines' gradients compared with eager's."""
    reset_compilers()
    grads: dict[str, list[Optional[Tensor]]] = {}

    def first(engine: str) -> None:
        grads[engine] = measure_first_backward(result.engines[engine], model, spec, inputs, recorders[engine], cache_root)

    for engine in ENGINES:
        log(f"   {spec.name}: first backward, {engine}")
        guarded(result.engines[engine], f"{engine} first backward", first, engine)
    for engine in COMPILED_ENGINES:
        if engine in grads and "eager" in grads:
            result.engines[engine].grad_max_abs_diff = grads_max_abs_diff(grads[engine], grads["eager"])


def run_steady_state(
    result: ModelResult, model: nn.Module, spec: Model, inputs: Inputs,
    recorders: dict[str, Optional[CompilerRecorder]], reps: int,
) -> None:
    """Warm-up per engine, then the interleaved rounds, watching other processes' CPU use."""
    log(f"   {spec.name}: warm-up and {reps} interleaved steady-state rounds over {', '.join(working(result))}")
    for engine, engine_result in working(result).items():
        guarded(engine_result, f"{engine} warm-up", warm_up, engine_result, model, spec, inputs, recorders[engine])
    with CpuContention() as contention:
        measure_steady_state(working(result), model, spec, inputs, recorders, reps)
    result.steady_other_cpu = contention.other_share


def run_dynamic_shapes(
    result: ModelResult, model: nn.Module, spec: Model,
    recorders: dict[str, Optional[CompilerRecorder]], cache_root: pathlib.Path,
) -> None:
    """The shape sequence, per compiled engine still working."""
    if not (spec.dynamic_batches or spec.dynamic_seqs):
        return
    for engine in COMPILED_ENGINES:
        if engine in working(result):
            log(f"   {spec.name}: dynamic shapes, {engine}")
            run = result.dynamic[engine] = DynamicRun(engine)
            guarded(run, f"{engine} dynamic shapes", run_dynamic_sequence, run, model, spec, recorders[engine], cache_root)


def bench_model(spec: Model, backend: str, reps: int, cache_root: pathlib.Path) -> ModelResult:
    """Every measurement of one model. An engine that fails is recorded and
    skips the later phases; the others go on."""
    result = ModelResult(spec.name, spec.description, spec.batch, spec.seq, list(spec.dynamic_batches), list(spec.dynamic_seqs))
    try:
        torch.manual_seed(MODEL_SEED)
        model = spec.build()
        torch.manual_seed(INPUT_SEED)
        inputs = spec.make_inputs(spec.batch, spec.seq)
        result.parameters = sum(p.numel() for p in model.parameters())
        result.autograd_nodes = count_autograd_nodes(forward_loss(model, spec, inputs))
    except Exception as exc:  # noqa: BLE001 -- recorded and reported
        result.error, result.error_traceback = describe_error(exc)
        log(f"   {spec.name} FAILED to build: {result.error}")
        return result

    result.engines = {engine: EngineResult(engine) for engine in ENGINES}
    recorders = {engine: None if engine == "eager" else CompilerRecorder(backend) for engine in ENGINES}
    with timed_phase(result, "first_backward"):
        run_first_backwards(result, model, spec, inputs, recorders, cache_root)
    if result.engines["eager"].error:
        result.error = f"eager: {result.engines['eager'].error}"
        return result
    with timed_phase(result, "steady_state"):
        run_steady_state(result, model, spec, inputs, recorders, reps)
    with timed_phase(result, "memory"):
        for engine, engine_result in working(result).items():
            guarded(engine_result, f"{engine} memory", measure_backward_memory, engine_result, model, spec, inputs, recorders[engine])
    with timed_phase(result, "dynamic_shapes"):
        run_dynamic_shapes(result, model, spec, recorders, cache_root)
    reset_compilers()
    return result


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def warm_up_process(backend: str, cache_root: pathlib.Path) -> None:
    """One-time costs (imports, Inductor's compile workers, functional
    registrations) are paid here, on a tiny model, not by the first measurement."""
    log(f"warming up the process (backend={backend})")
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    for engine in COMPILED_ENGINES:
        reset_compilers()
        with cold_compiler_caches(cache_root):
            for batch in (2, 3):
                model(torch.randn(batch, 4)).sum().backward()
                loss = model(torch.randn(batch, 4)).sum()
                timed_backward(loss, engine, CompilerRecorder(backend))
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
            model(torch.randn(2, 4)).sum().backward()
    reset_compilers()


def source_version() -> str:
    """The repository commit (with '+dirty' for local changes) and the sha256
    prefix of the wheel installed in the venv, which can differ from the
    checkout when someone rebuilt without reinstalling, or the reverse."""
    import subprocess

    repo = BENCH.parent
    try:
        commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        commit += "+dirty" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    try:
        stamp = json.loads((pathlib.Path(sys.prefix) / "pca-install.json").read_text())
        wheel = f"{stamp['wheel'][0]} (sha256 {stamp['wheel'][1][:12]})"
    except (OSError, ValueError, KeyError, IndexError):
        wheel = "unknown"
    return f"commit {commit}; installed wheel {wheel}"


def environment(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """What the results were measured on."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        import transformers

        transformers_version = transformers.__version__
    except Exception as exc:  # noqa: BLE001
        transformers_version = f"unavailable ({describe_error(exc)[0]})"
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command,
        "machine": f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "source": source_version(),
        "transformers": transformers_version,
        "backend": args.backend,
        "inductor_cpp_wrapper": args.cpp_wrapper,
        "quick": args.quick,
        "models": args.models,
        "reps_override": args.reps,
        "warmup_reps": WARMUP_REPS,
        "load_average_start": os.getloadavg()[0],
    }


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"small models only: {', '.join(QUICK)}")
    parser.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager", "eager"],
                        help="torch.compile backend for the captured backward graphs (default: inductor)")
    parser.add_argument("--cpp-wrapper", action="store_true",
                        help="Inductor writes the code that calls its kernels in C++ instead of Python "
                        "(torch._inductor.config.cpp_wrapper), for every engine")
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), metavar="NAME",
                        help=f"models to run (default: {' '.join(FULL)}; with --quick: {' '.join(QUICK)}); "
                        f"choices: {' '.join(sorted(MODELS))}")
    parser.add_argument("--reps", type=int, help="steady-state rounds for every model (default: per model, >= 20)")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads(N) first (default: torch's default)")
    parser.add_argument("--out", type=pathlib.Path,
                        help="writes OUT.json and OUT.md (default: bench/results, or bench/results-quick with --quick)")
    args = parser.parse_args(argv)
    if args.models is None:
        args.models = list(QUICK if args.quick else FULL)
    if args.out is None:
        args.out = BENCH / ("results-quick" if args.quick else "results")
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    if args.cpp_wrapper and args.backend != "inductor":
        parser.error("--cpp-wrapper is an Inductor option: use it with --backend inductor")
    return args


def write_results(out: pathlib.Path, env: dict[str, Any], models: list[ModelResult]) -> None:
    """OUT.json (raw) and OUT.md (tables); rewritten after every model so a
    long run that is interrupted keeps what it measured."""
    data = {"environment": env, "models": [asdict(m) for m in models]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    out.with_suffix(".md").write_text(report.render_markdown(data))


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpp_wrapper:
        torch._inductor.config.cpp_wrapper = True
    command = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.executable), os.path.relpath(__file__), *argv])
    env = environment(args, command)
    log(f"torch {env['torch']}, backend {args.backend}, models {' '.join(args.models)} -> {args.out}.md/.json")
    results: list[ModelResult] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-inductor-") as cache_dir:
        cache_root = pathlib.Path(cache_dir)
        warm_up_process(args.backend, cache_root)
        for name in args.models:
            spec = MODELS[name]
            reps = args.reps or spec.reps
            log(f"{name}: {spec.description}")
            model_start = time.perf_counter()
            results.append(bench_model(spec, args.backend, reps, cache_root))
            log(f"{name}: done in {time.perf_counter() - model_start:.0f} s")
            env["total_seconds"] = time.perf_counter() - start
            env["load_average_end"] = os.getloadavg()[0]
            write_results(args.out, env, results)
            gc.collect()
    log(f"wrote {args.out}.md and {args.out}.json ({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
