"""Running one model's backward under eager autograd, the legacy compiled
autograd engine and the Python engine, in the same process."""

import contextlib
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch


ENGINES = ("eager", "legacy", "python")


# Compiled engines: (compiled_autograd_engine, compiled_autograd_symbolic_sizes).
# "python" leaves shapes to Dynamo's defaults (static first compile, one
# recompile when a size changes); "python-symbolic" compiles with every size
# symbolic from the start.
COMPILED_ENGINE_SETTINGS = {
    "legacy": ("legacy", False),
    "python": ("python", False),
    "python-symbolic": ("python", True),
}


@contextlib.contextmanager
def backward_engine(
    engine: str,
    backend: str = "eager",
    compiler_fn: Optional[Callable[[torch.fx.GraphModule], Any]] = None,
):
    """Backward passes inside run on ``engine``; compiled graphs go through
    ``compiler_fn``, by default ``torch.compile(backend=backend)``."""
    if engine == "eager":
        yield
        return
    if compiler_fn is None:
        compiler_fn = CompilerRecorder(backend)
    config = torch._dynamo.config
    prior = (config.compiled_autograd_engine, config.compiled_autograd_symbolic_sizes)
    config.compiled_autograd_engine, config.compiled_autograd_symbolic_sizes = (
        COMPILED_ENGINE_SETTINGS[engine]
    )
    try:
        with torch._dynamo.compiled_autograd._enable(compiler_fn):
            yield
    finally:
        config.compiled_autograd_engine, config.compiled_autograd_symbolic_sizes = prior


class CompilerRecorder:
    """A compiled autograd ``compiler_fn``: records the size of every
    captured GraphModule it is handed (both engines hand it one), then
    returns ``torch.compile(gm, backend=backend)``, which compiles lazily on
    the graph's first call."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.graph_nodes: list[int] = []  # len(gm.graph.nodes), per captured graph

    def __call__(self, gm: torch.fx.GraphModule) -> Callable[..., Any]:
        self.graph_nodes.append(len(gm.graph.nodes))
        return torch.compile(gm, backend=self.backend)


class CaptureTimer:
    """Times phase 1 (capture) of both compiled autograd engines while active.

    - python engine: the call of ``torch._compiled_autograd.capture`` (the
      fx trace of ``python_autograd``), which ``_capture`` looks up at call time;
    - legacy engine: from the start of ``AutogradCompilerInstance.begin_capture``
      to the return of ``end_capture`` (every node traced with FakeTensors
      under make_fx; this window also holds the ``compiler_fn`` call at the
      end of ``end_capture``, which with ``torch.compile`` only wraps the
      graph -- compiling happens on its first call).

    ``seconds`` lists one entry per capture, in order.
    """

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._restore: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "CaptureTimer":
        import torch._compiled_autograd as python_engine
        from torch._dynamo.compiled_autograd import AutogradCompilerInstance as Legacy

        self._patch(python_engine, "capture", self._timed(python_engine.capture))
        begin, end = Legacy.begin_capture, Legacy.end_capture
        timer = self

        def begin_capture(instance: Any, *args: Any, **kwargs: Any) -> Any:
            instance._bench_capture_start = time.perf_counter()
            return begin(instance, *args, **kwargs)

        def end_capture(instance: Any, *args: Any, **kwargs: Any) -> Any:
            result = end(instance, *args, **kwargs)
            timer.seconds.append(time.perf_counter() - instance._bench_capture_start)
            return result

        self._patch(Legacy, "begin_capture", begin_capture)
        self._patch(Legacy, "end_capture", end_capture)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._restore.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    def _timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds.append(time.perf_counter() - start)

        return timed


@dataclass
class BackwardTiming:
    first_s: float
    steady_s: float
    grads: list[torch.Tensor]


def rotation(engines: Sequence[str], rep: int) -> list[str]:
    """The order of round ``rep``: ``engines`` rotated by ``rep``, so that
    drifting machine noise falls on every engine alike."""
    shift = rep % len(engines)
    return [*engines[shift:], *engines[:shift]]


def timed_backward(loss: torch.Tensor, engine: str, compiler_fn: Optional[CompilerRecorder]) -> float:
    """Seconds of ``loss.backward()`` alone on ``engine`` (selecting the
    engine happens outside the timed region)."""
    with backward_engine(engine, compiler_fn=compiler_fn):
        start = time.perf_counter()
        loss.backward()
        return time.perf_counter() - start


def time_backwards(
    model: torch.nn.Module,
    make_input: Callable[[], torch.Tensor],
    engines: Sequence[str],
    backend: str,
    rounds: int,
    seed: int = 0,
) -> dict[str, BackwardTiming]:
    """Each engine's first backward (capture and compile included; its
    gradients kept), two warm-up backwards each, then ``rounds`` rounds that
    time one steady-state backward per engine in :func:`rotation`'s order;
    ``steady_s`` is the median.

    >>> from models import MODELS  # test/models.py
    >>> make_model, make_input = MODELS["mlp"]
    >>> timings = time_backwards(make_model(), lambda: make_input(8), ENGINES, "eager", rounds=3)
    >>> sorted(timings) == sorted(ENGINES)
    True
    """
    compilers = {engine: CompilerRecorder(backend) for engine in engines}

    def one_backward(engine: str) -> float:
        model.zero_grad(set_to_none=True)
        return timed_backward(model(make_input()).pow(2).mean(), engine, compilers[engine])

    first_s: dict[str, float] = {}
    grads: dict[str, list[torch.Tensor]] = {}
    for engine in engines:
        torch.manual_seed(seed)
        first_s[engine] = one_backward(engine)
        grads[engine] = [p.grad.detach().clone() for p in model.parameters()]
        one_backward(engine)
        one_backward(engine)
    steady: dict[str, list[float]] = {engine: [] for engine in engines}
    for rep in range(rounds):
        for engine in rotation(engines, rep):
            steady[engine].append(one_backward(engine))
    return {
        engine: BackwardTiming(first_s[engine], statistics.median(steady[engine]), grads[engine])
        for engine in engines
    }


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> Optional[float]:
    return max(((x - y).abs().max().item() for x, y in zip(a, b)), default=0.0)
