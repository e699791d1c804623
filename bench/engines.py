"""Running one model's backward under eager autograd, the legacy compiled
autograd engine and the Python engine, in the same process."""

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
from torch._dynamo.utils import counters


ENGINES = ("eager", "legacy", "python")


@contextlib.contextmanager
def backward_engine(engine: str, backend: str):
    """Backward passes inside run on ``engine``; compiled graphs go through
    ``torch.compile(backend=backend)``."""
    if engine == "eager":
        yield
        return
    prior = torch._dynamo.config.compiled_autograd_engine
    torch._dynamo.config.compiled_autograd_engine = engine
    try:
        with torch._dynamo.compiled_autograd._enable(lambda gm: torch.compile(gm, backend=backend)):
            yield
    finally:
        torch._dynamo.config.compiled_autograd_engine = prior


@dataclass
class BackwardTiming:
    first_s: float
    steady_s: float
    grads: list[torch.Tensor]
    captures: int


def time_backward(
    model: torch.nn.Module,
    make_input: Callable[[], torch.Tensor],
    engine: str,
    backend: str,
    repeats: int = 20,
    seed: int = 0,
) -> BackwardTiming:
    """First backward (capture and compile included) and the median of
    ``repeats`` steady-state backwards; gradients of the first one."""
    captures_before = counters["compiled_autograd"]["captures"]

    def one_backward() -> float:
        model.zero_grad(set_to_none=True)
        loss = model(make_input()).pow(2).mean()
        start = time.perf_counter()
        with backward_engine(engine, backend):
            loss.backward()
        return time.perf_counter() - start

    torch.manual_seed(seed)
    first = one_backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    steady = statistics.median(one_backward() for _ in range(repeats))
    return BackwardTiming(
        first_s=first,
        steady_s=steady,
        grads=grads,
        captures=counters["compiled_autograd"]["captures"] - captures_before,
    )


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> Optional[float]:
    return max(((x - y).abs().max().item() for x, y in zip(a, b)), default=0.0)
