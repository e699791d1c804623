"""Helpers to run the same autograd code under eager autograd and under
compiled autograd, and compare what came out."""

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile, record_function


def identity_compiler(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Runs the captured graph as it is, without Dynamo."""
    return gm


def dynamo_compiler(backend: str) -> Callable[[torch.fx.GraphModule], Any]:
    return lambda gm: torch.compile(gm, backend=backend)


def inductor_with_eager_random_draws(gm: torch.fx.GraphModule) -> Any:
    """Inductor, calling eager's random ops (``fallback_random``) so that a
    backward that draws random numbers can be compared with eager's."""
    return torch.compile(gm, backend="inductor", options={"fallback_random": True})


# Inductor fuses floating-point math, so its results may differ from eager's in
# the last bits: the helpers below compare them with assert_close.
inductor_with_eager_random_draws.bit_exact = False


def bit_exact(compiler: Callable[..., Any]) -> bool:
    """Whether ``compiler`` computes eager's values to the bit."""
    return getattr(compiler, "bit_exact", True)


COMPILERS = {
    "no_dynamo": identity_compiler,
    "eager": dynamo_compiler("eager"),
    "aot_eager": dynamo_compiler("aot_eager"),
    "inductor": inductor_with_eager_random_draws,
}


class CountingCompiler:
    """torch.compile(backend="eager") that counts Dynamo's graph compiles and
    keeps the captured graphs it is given."""

    def __init__(self):
        self.captured = []
        self.dynamo_compiles = 0

    def backend(self, graph_module, example_inputs):
        self.dynamo_compiles += 1
        return graph_module.forward

    def __call__(self, captured_graph):
        self.captured.append(captured_graph)
        return torch.compile(captured_graph, backend=self.backend)


@contextlib.contextmanager
def compiled_autograd(compiler: Callable[..., Any] = identity_compiler):
    with torch._dynamo.compiled_autograd.enable(compiler):
        yield


def captures() -> int:
    return counters["compiled_autograd"]["captures"]


def eager_fallbacks() -> int:
    return counters["compiled_autograd"]["eager_fallbacks"]


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value``, a tensor or nested lists, tuples and dicts
    (an op's or a module's sample arguments and outputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors_in(item)]
    return []


def weighted_sum(output: torch.Tensor) -> torch.Tensor:
    """A sum of ``output``'s elements with distinct weights, so that no
    gradient is all ones; a complex output's imaginary parts get other
    weights than its real parts."""
    weights = torch.linspace(-1, 1, output.numel(), dtype=output.real.dtype).reshape(output.shape)
    if not output.is_complex():
        return (output * weights).sum()
    return (output.real * weights).sum() + (output.imag * weights.flip(-1) if output.dim() else output.imag).sum()


def backward_memory(
    forward: Callable[[], torch.Tensor], backward_context: contextlib.AbstractContextManager
) -> tuple[int, int]:
    """Bytes the backward of ``forward()``'s loss, run inside
    ``backward_context``, allocated beyond what existed when it started: the
    peak inside it and the net change at its end, from the profiler's memory
    events. The forward runs under the profiler too, so that the frees of its
    saved tensors count against their allocations."""
    mark = "measured_backward"
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = forward()
        with backward_context, record_function(mark):
            loss.backward()
    events = list(prof.profiler.kineto_results.events())
    window = next(e for e in events if e.name() == mark)
    start, end = window.start_ns(), window.start_ns() + window.duration_ns()
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    level = baseline = peak = 0
    for when, nbytes in memory:
        if when < start:
            level += nbytes
            baseline = peak = level
        elif when <= end:
            level += nbytes
            peak = max(peak, level)
    return peak - baseline, level - baseline


def run_eager_and_compiled(
    fn: Callable[[], Sequence[Optional[torch.Tensor]]],
    compiler: Callable[..., Any] = identity_compiler,
    seed: int = 0,
) -> tuple[Sequence[Any], Sequence[Any]]:
    """Runs ``fn`` (which builds its own graph and returns tensors) twice from
    the same seed: with eager autograd, then under compiled autograd."""
    torch.manual_seed(seed)
    expected = fn()
    torch.manual_seed(seed)
    with compiled_autograd(compiler):
        actual = fn()
    return expected, actual


def assert_same(expected: Sequence[Any], actual: Sequence[Any], exact: bool = True) -> None:
    """Equal values; bit-for-bit unless ``exact`` is False (a compiler that
    reorders floating-point math, e.g. Inductor)."""
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        if e is None or a is None:
            assert e is None and a is None, (e, a)
        elif not isinstance(e, torch.Tensor):
            assert e == a, (e, a)
        elif exact:
            assert e.dtype == a.dtype and e.shape == a.shape and e.layout == a.layout
            assert torch.equal(e, a), (e, a)
        else:
            torch.testing.assert_close(a, e)


def graphs_run_without_dynamo() -> int:
    return counters["compiled_autograd"]["graphs_run_without_dynamo"]


def check_against_eager(fn, compiler=identity_compiler, exact=True, falls_back=False):
    """``fn``'s results under compiled autograd are eager's. Unless
    ``falls_back``, no backward ran on the eager engine and Dynamo gave up on
    no captured graph: either gives eager's results too, so only these checks
    tell it from a compiled run."""
    fallbacks_before, uncompiled_before = eager_fallbacks(), graphs_run_without_dynamo()
    expected, actual = run_eager_and_compiled(fn, compiler)
    assert_same(expected, actual, exact and bit_exact(compiler))
    if not falls_back:
        assert eager_fallbacks() == fallbacks_before, "a backward ran on the eager engine"
        assert graphs_run_without_dynamo() == uncompiled_before, "Dynamo gave up on a captured graph"
    return actual
