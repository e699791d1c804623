"""Two-process training under torch.distributed (gloo, CPU) for
test/test_distributed.py and bench/bench_dist.py.

Not a test module: the parent (pytest or the benchmark) calls ``launch``, which
starts ``world_size`` processes with the ``spawn`` start method; each runs
``worker_main`` and writes what it measured to ``<out_dir>/rank<r>.pt``.

Rendezvous: the parent creates the TCPStore on port 0 (the OS picks a free port
at run time) and hands its port to the children, which connect as clients; the
parent deletes the store when the children are done, so no port stays bound.
Gloo's own connections use ports the OS picks as well. Every process group has
a timeout and every child is joined with a timeout, then terminated and killed
if it is still alive: a rank that raises never leaves the other rank hanging.

Training (``train``): ``steps`` SGD steps of a small model on per-rank data,
the same seeds in every run, under

- ``mode``: "ddp" (DDP with the C++ reducer), "ddp_python_reducer" (DDP built
  with ``torch._dynamo.config.optimize_ddp = "python_reducer"``) or "fsdp2"
  (``torch.distributed.fsdp.fully_shard``);
- ``engine``: "eager" (eager autograd), "legacy" or "python" (compiled
  autograd, ``torch._dynamo.config.compiled_autograd_engine``), enabled around
  each ``loss.backward()``;
- ``compiler``: what compiled autograd hands its captured graph to:
  "no_dynamo" (the graph runs as it is) or a Dynamo backend ("eager",
  "aot_eager", "inductor") through ``torch.compile``. Every Dynamo graph is
  recorded (its code), so a test can look for collectives in it.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import multiprocessing
import os
import pathlib
import sys
import time
import traceback
import warnings
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [nn.Linear(16, width), nn.Linear(width, width), nn.Linear(width, 4)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = torch.tanh(layer(x))
        return self.layers[-1](x)


class GPT2Config:
    def __init__(self, vocab=64, seq=16, d_model=32, n_head=2, n_layer=2) -> None:
        self.vocab, self.seq, self.d_model = vocab, seq, d_model
        self.n_head, self.n_layer = n_head, n_layer


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        mask = torch.tril(torch.ones(cfg.seq, cfg.seq, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (
            z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v)
        )
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.n_head)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.fc_proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class TinyGPT2(nn.Module):
    """GPT-2's architecture (pre-LayerNorm blocks, causal attention, GELU MLP,
    tied input/output embeddings) at a toy size; returns the LM loss."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm(cfg.d_model)
        for emb in (self.wte, self.wpe):  # GPT-2's initialization of embeddings
            nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied embeddings
        return F.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1)
        )


def make_model(name: str, size: str = "test") -> nn.Module:
    torch.manual_seed(0)  # the same initial parameters on every rank
    if name == "mlp":
        return MLP(width=32 if size == "test" else 256)
    if name == "gpt2":
        if size == "test":
            return TinyGPT2(GPT2Config())
        return TinyGPT2(GPT2Config(vocab=512, seq=64, d_model=128, n_head=4, n_layer=4))
    raise ValueError(name)


def make_batch(name: str, model: nn.Module, rank: int, step: int, size: str = "test"):
    """Different data on each rank (so the all-reduce matters), the same in every run."""
    gen = torch.Generator().manual_seed(1000 * (step + 1) + rank)
    if name == "mlp":
        batch = 8 if size == "test" else 64
        return (torch.randn(batch, 16, generator=gen),)
    vocab, seq = model.wte.num_embeddings, model.wpe.num_embeddings
    batch = 2 if size == "test" else 8
    return (torch.randint(0, vocab, (batch, seq), generator=gen),)


def compute_loss(name: str, model: nn.Module, batch) -> torch.Tensor:
    out = model(*batch)
    return out.pow(2).mean() if name == "mlp" else out


def shard_fsdp2(model: nn.Module) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    children = model.layers if isinstance(model, MLP) else model.blocks
    for child in children:
        fully_shard(child)
    fully_shard(model)
    return model


# ---------------------------------------------------------------------------
# Compiled autograd around a backward
# ---------------------------------------------------------------------------


class GraphRecorder:
    """compiler_fn for compiled autograd: keeps the code of the captured graph
    it is handed and, under Dynamo, the code of every graph Dynamo produces
    from it (where hooks' collectives show up as ops)."""

    def __init__(self, compiler: str) -> None:
        self.compiler = compiler
        self.captured: list[str] = []  # compiled autograd's graphs
        self.dynamo: list[str] = []  # Dynamo's graphs of them

    def backend(self, gm: torch.fx.GraphModule, example_inputs):
        self.dynamo.append(gm.code)
        if self.compiler == "eager":
            return gm.forward
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(self.compiler)(gm, example_inputs)

    def __call__(self, gm: torch.fx.GraphModule):
        self.captured.append(gm.code)
        if self.compiler == "no_dynamo":
            return gm
        return torch.compile(gm, backend=self.backend, fullgraph=False)


@contextlib.contextmanager
def backward_engine(engine: str, recorder: Optional[GraphRecorder]):
    if engine == "eager":
        yield
        return
    config = torch._dynamo.config
    prior = config.compiled_autograd_engine
    config.compiled_autograd_engine = engine
    try:
        with torch._dynamo.compiled_autograd._enable(recorder):
            yield
    finally:
        config.compiled_autograd_engine = prior


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def _counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return dict(counters["compiled_autograd"])


def _full_params(model: nn.Module) -> list[torch.Tensor]:
    out = []
    for p in model.parameters():
        p = p.detach()
        if hasattr(p, "full_tensor"):  # FSDP2: a sharded DTensor
            p = p.full_tensor()
        out.append(p.clone())
    return out


def _is_dtensor(t: torch.Tensor) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _count_fsdp2_final_callbacks(stack: contextlib.ExitStack) -> list[int]:
    """Counts calls of FSDP2's root post-backward final callback (the one
    its pre-backward hook queues with ``queue_callback``) until ``stack``
    closes."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState

    count = [0]
    original = FSDPState._root_post_backward_final_callback

    @functools.wraps(original)
    def counted(self):
        count[0] += 1
        return original(self)

    FSDPState._root_post_backward_final_callback = counted
    stack.callback(setattr, FSDPState, "_root_post_backward_final_callback", original)
    return count


def train(
    model_name: str,
    mode: str,
    engine: str,
    compiler: str = "eager",
    steps: int = 5,
    size: str = "test",
    lr: float = 0.05,
    compile_forward: Optional[str] = None,
    raise_on_rank: Optional[int] = None,
    group_timeout_s: Optional[float] = None,
    result: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Trains and returns losses, parameters after the last step, the
    compiled autograd counters' increments, warnings, and the graphs, in
    ``result`` if given (which then also shows how far a failed run got)."""
    from torch._dynamo.utils import counters
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    counters.clear()
    rank = dist.get_rank()
    config = torch._dynamo.config
    prior_optimize_ddp = config.optimize_ddp
    recorder = None if engine == "eager" else GraphRecorder(compiler)
    result = {} if result is None else result
    result.update(losses=[], step_s=[], backward_s=[], final_callbacks=[], resharded=[])
    group = None
    if group_timeout_s is not None:  # a group of its own with a short timeout
        group = dist.new_group(timeout=datetime.timedelta(seconds=group_timeout_s))
    with contextlib.ExitStack() as stack:
        stack.callback(setattr, config, "optimize_ddp", prior_optimize_ddp)
        caught = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        model = make_model(model_name, size)
        if mode == "ddp":
            model = DDP(model, process_group=group)
        elif mode == "ddp_python_reducer":
            config.optimize_ddp = "python_reducer"
            model = DDP(model, process_group=group)
            assert model._use_python_reducer
        elif mode == "fsdp2":
            assert group is None, "fsdp2 runs on the default group"
            shard_fsdp2(model)
        else:
            raise ValueError(mode)
        inner = model.module if mode.startswith("ddp") else model
        final_callbacks = _count_fsdp2_final_callbacks(stack) if mode == "fsdp2" else [0]
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        if compile_forward is not None:
            model = torch.compile(model, backend=compile_forward)
        for step in range(steps):
            batch = make_batch(model_name, inner, rank, step, size)
            start = time.perf_counter()
            loss = compute_loss(model_name, model, batch)
            if raise_on_rank == rank and step == 2:

                def fail(grad):
                    raise RuntimeError(f"rank {rank} fails in its backward on purpose")

                loss.register_hook(fail)
            callbacks_before = final_callbacks[0]
            backward_start = time.perf_counter()
            with backward_engine(engine, recorder):
                loss.backward()
            result["backward_s"].append(time.perf_counter() - backward_start)
            result["final_callbacks"].append(final_callbacks[0] - callbacks_before)
            if mode == "fsdp2":  # resharded: every parameter is a shard again
                result["resharded"].append(all(_is_dtensor(p) for p in inner.parameters()))
            opt.step()
            opt.zero_grad(set_to_none=True)
            result["step_s"].append(time.perf_counter() - start)
            result["losses"].append(loss.detach().clone())
        result["params"] = _full_params(model)
        result["counters"] = _counters()
        result["graph_breaks"] = dict(counters["graph_break"])
        result["warnings"] = [str(w.message) for w in caught]
        result["captured_graphs"] = recorder.captured if recorder else []
        result["dynamo_graphs"] = recorder.dynamo if recorder else []
    return result


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """One training run; an exception adds "error" to what it got to."""
    result: dict[str, Any] = {}
    try:
        return train(**case, result=result)
    except Exception as e:  # reported to the parent, which decides
        result.update(
            error=f"{type(e).__name__}: {e}".splitlines()[0][:2000],
            error_type=type(e).__name__,
            traceback=traceback.format_exc(),
            counters=_counters(),
        )
        return result
    finally:
        # A failed collective may leave work queued; keep cases independent.
        torch._dynamo.reset()


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------


def worker_main(
    rank: int,
    world_size: int,
    port: int,
    out_dir: str,
    cases: list[dict[str, Any]],
    pg_timeout_s: float,
    stop_on_error: bool,
    linger_s: float,
) -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world_size,
        is_master=False,
        timeout=datetime.timedelta(seconds=pg_timeout_s),
    )
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=pg_timeout_s),
    )
    results: list[dict[str, Any]] = []
    path = pathlib.Path(out_dir) / f"rank{rank}.pt"
    status = 0
    try:
        for case in cases:
            case = dict(case)
            name = case.pop("name")
            start = time.perf_counter()
            result = run_case(case)
            result["name"] = name
            result["wall_s"] = time.perf_counter() - start
            results.append(result)
            torch.save(results, path)  # what is done so far survives a later crash
            if "error" in result and stop_on_error:
                # Tells the others, then (with linger_s) stays alive without
                # taking part in collectives until every other rank has
                # failed too: they must get their process group's timeout,
                # not hang, and not a closed connection from this exit.
                store.set(f"failed/{rank}", result["error"][:200])
                if linger_s > 0:
                    others = [f"failed/{r}" for r in range(world_size) if r != rank]
                    try:
                        store.wait(others, datetime.timedelta(seconds=linger_s))
                    except Exception:
                        pass  # gave up waiting; exits anyway
                print(f"rank {rank}: {name}: {result['error']}", file=sys.stderr)
                status = 1
                break
    finally:
        torch.save(results, path)
    # Exits without destroying the process group: that joins gloo's worker
    # threads with the GIL held, while a worker may still be destroying a
    # finished collective whose captured thread-local state holds Python
    # objects (the context torch.autograd.backward stashes there), and the two
    # deadlock (seen once in a pytest process; docs/distributed.md, Failures).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def launch(
    cases: list[dict[str, Any]],
    out_dir: str,
    world_size: int = 2,
    join_timeout_s: float = 150.0,
    pg_timeout_s: float = 60.0,
    stop_on_error: bool = False,
    linger_s: float = 0.0,
) -> dict[str, Any]:
    """Runs ``cases`` (dicts of ``train`` arguments plus a "name") on
    ``world_size`` spawned processes; returns per-rank results, exit codes and
    which processes had to be killed. With ``stop_on_error`` a rank whose case
    fails exits with an error, after waiting (at most ``linger_s`` seconds)
    for every other rank to fail as well."""
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        world_size,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=pg_timeout_s),
    )
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(
            target=worker_main,
            args=(
                r, world_size, store.port, out_dir, cases, pg_timeout_s, stop_on_error, linger_s
            ),
            name=f"dist-rank{r}",
        )
        for r in range(world_size)
    ]
    port = store.port
    killed = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + join_timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for r, p in enumerate(procs):
            if p.is_alive():
                killed.append(r)
                p.terminate()
                p.join(5)
                if p.is_alive():
                    p.kill()
                    p.join(5)
        del store  # the parent's listening port closes here
    results = {}
    for r in range(world_size):
        path = pathlib.Path(out_dir) / f"rank{r}.pt"
        results[r] = torch.load(path, weights_only=False) if path.exists() else []
    return {
        "results": results,
        "exitcodes": [p.exitcode for p in procs],
        "killed": killed,
        "pids": [p.pid for p in procs],
        "port": port,
    }


def by_name(launched: dict[str, Any], rank: int = 0) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in launched["results"][rank]}
