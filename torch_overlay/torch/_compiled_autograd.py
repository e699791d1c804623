"""The Python compiled autograd engine.

With the engine enabled, every backward pass goes through three steps:

1. libtorch's autograd engine hands the graph to ``torch._compiled_autograd_C``,
   which collects the nodes that run, in the order the eager engine would run
   them, together with what they saved: tensors, sizes, scalars and hooks.
2. The structure of all that is the cache key. On a miss, :func:`capture`
   symbolically traces :func:`python_autograd` with ``torch.fx`` Proxies
   standing for the saved values -- no FakeTensors, no make_fx -- into a graph
   of calls to the backward ops defined below, and hands it to the user's
   ``compiler_fn`` (typically ``torch.compile``).
3. The compiled graph runs on the real saved values. Its ops find the autograd
   nodes by index in the backward being executed.

Example::

    >>> import torch
    >>> x = torch.ones(3, requires_grad=True)
    >>> with torch._dynamo.compiled_autograd.enable(lambda gm: gm):
    ...     (x * x).sum().backward()
    >>> x.grad
    tensor([2., 2., 2.])

``torch._dynamo.config.compiled_autograd_engine = "legacy"`` selects the
upstream engine instead (torch/_dynamo/compiled_autograd.py).
"""

import collections
import dataclasses
import enum
import hashlib
import inspect
import linecache
import logging
import operator
import os
import re
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
import torch._inductor.config
import torch.fx
from torch import _compiled_autograd_C as _C
from torch._dynamo import eval_frame as _dynamo_eval_frame
from torch._dynamo.external_utils import FakeCompiledAutogradEngine
from torch._dynamo.utils import counters, set_locals_to_steal
from torch._logging import getArtifactLogger, LazyString


__all__ = ["BackwardNode", "Lifted", "NodeKind", "capture", "python_autograd"]

# The legacy engine's loggers: handlers and filters set up for one engine's
# TORCH_LOGS=compiled_autograd[_verbose] output see the other's.
log = getArtifactLogger("torch._dynamo.compiled_autograd", "compiled_autograd")
verbose_log = getArtifactLogger("torch._dynamo.compiled_autograd", "compiled_autograd_verbose")


class NodeKind(enum.IntEnum):
    """How the captured graph runs a node (mirrors NodeKind in backward_graph.h)."""

    APPLY_WITH_SAVED = 0
    APPLY_WITH_SAVED_DYNAMO_DISABLED = 1
    EAGER = 2
    ACCUMULATE_GRAD = 3
    PYTHON_FUNCTION = 4
    AOT_BACKWARD = 5


@dataclasses.dataclass(frozen=True)
class BackwardNode:
    """One autograd node of a backward pass, as collected in C++.

    Gradients flow into ``num_inputs`` slots and out along ``next_edges``:
    ``(position of the target node, its input slot)``, or None where nothing
    receives them. Index fields point into the lists the graph receives:
    ``saved_tensors`` into ``tensors``; ``sizes`` and ``saved_scalars`` are
    ``[begin, end)`` ranges of ``sizes`` and ``scalars`` (a node's sizes are
    those of its saved state, then the shapes its next edges expect); hook
    fields index ``hooks``, except C++ tensor pre-hooks (``is_python``
    False), which the node keeps itself; ``unpack_hooks`` pairs the unpack
    hook (in ``hooks``) and the packed data (in ``packed_data``) of each of
    the node's saved variables that have saved-tensor hooks.
    """

    name: str
    kind: NodeKind
    num_inputs: int
    needed: bool
    next_edges: tuple[Optional[tuple[int, int]], ...]
    captures: tuple[tuple[int, int], ...]
    tensor_pre_hooks: tuple[tuple[bool, int, int], ...]
    pre_hooks: tuple[int, ...]
    post_hooks: tuple[int, ...]
    post_acc_grad_hooks: tuple[int, ...]
    unpack_hooks: tuple[tuple[int, int], ...]
    saved_tensors: tuple[int, ...]
    sizes: tuple[int, int]
    saved_scalars: tuple[int, int]
    # PYTHON_FUNCTION and AOT_BACKWARD: the ctx (in hooks), where each of
    # ctx.saved_tensors is among saved_tensors (-1: None), which forward
    # inputs were tensors, and how many of the node's sizes are the ctx's
    # symints (they come first).
    python_ctx: int
    saved_layout: tuple[int, ...]
    is_variable_input: tuple[bool, ...]
    num_symints: int
    # AOT_BACKWARD: the compiled region's backward, as a module to call, and
    # the Dynamo BackwardState holding the hooks the region registered on its
    # intermediates (in hooks; -1: none).
    aot_backward: Optional["AOTBackward"]
    backward_state: int

    @staticmethod
    def from_collected(collected: dict[str, Any]) -> "BackwardNode":
        def tuples(items: Sequence[Any]) -> tuple[Any, ...]:
            return tuple(tuple(i) if isinstance(i, (list, tuple)) else i for i in items)

        return BackwardNode(
            name=collected["name"],
            kind=NodeKind(collected["kind"]),
            num_inputs=collected["num_inputs"],
            needed=collected["needed"],
            next_edges=tuples(collected["next_edges"]),
            captures=tuples(collected["captures"]),
            tensor_pre_hooks=tuples(collected["tensor_pre_hooks"]),
            pre_hooks=tuple(collected["pre_hooks"]),
            post_hooks=tuple(collected["post_hooks"]),
            post_acc_grad_hooks=tuple(collected["post_acc_grad_hooks"]),
            unpack_hooks=tuples(collected["unpack_hooks"]),
            saved_tensors=tuple(collected["saved_tensors"]),
            sizes=tuple(collected["sizes"]),
            saved_scalars=tuple(collected["saved_scalars"]),
            python_ctx=collected["python_ctx"],
            saved_layout=tuple(collected["saved_layout"]),
            is_variable_input=tuple(collected["is_variable_input"]),
            num_symints=collected["num_symints"],
            aot_backward=(
                None
                if collected["aot_forward_cls"] is None
                else AOTBackward.of(
                    collected["aot_forward_cls"],
                    collected["name"],
                    collected["num_symints"],
                    has_backward_state=collected["backward_state"] >= 0,
                )
            ),
            backward_state=collected["backward_state"],
        )


@dataclasses.dataclass(frozen=True)
class Lifted:
    """What a backward lifted out of its nodes, and what the captured graph
    takes as inputs: tensors (de-duplicated), sizes, scalars, Python hooks,
    and the data saved-tensor pack hooks returned."""

    tensors: Sequence[Any]
    sizes: Sequence[Any]
    scalars: Sequence[Any]
    hooks: Sequence[Any]
    packed_data: Sequence[Any]


# ---------------------------------------------------------------------------
# The engine loop
# ---------------------------------------------------------------------------


def python_autograd(
    nodes: Sequence[BackwardNode], num_outputs: int, lifted: Lifted, ops: Any = None
) -> list[Any]:
    """Runs a backward pass: the eager engine's loop, one node at a time.

    ``nodes`` are in the order the eager engine runs them, so every node's
    input buffer is complete when its turn comes. ``ops`` provides the backward
    ops (this module by default); :func:`capture` passes a recorder instead,
    and with Proxies for the ``lifted`` values the loop unrolls into an fx
    graph. Returns the gradients ``autograd.grad`` asked for (``num_outputs``
    of them).
    """
    hooks = lifted.hooks
    ops = ops if ops is not None else _RUNTIME_OPS
    buffers: list[Optional[list[Any]]] = [[None] * n.num_inputs for n in nodes]
    graph_outputs: list[Any] = [None] * num_outputs

    for node_idx, node in enumerate(nodes):
        ops.begin_node(node_idx, node)
        grads = buffers[node_idx]
        buffers[node_idx] = None
        assert grads is not None
        if node.needed:
            # The eager engine hands out a needed node's gradient before its
            # tensor pre-hooks run, and a capture-only node's after.
            _return_captured_grads(graph_outputs, node, grads)
        for is_python, hook_idx, input_nr in node.tensor_pre_hooks:
            if is_python:
                grads[input_nr] = ops.call_hook(
                    hooks, hook_idx, grads[input_nr], hook_type="tensor_pre_hook"
                )
            else:
                grads[input_nr] = ops.call_cpp_tensor_pre_hook(
                    node_idx, hook_idx, grads[input_nr]
                )
        if not node.needed:
            _return_captured_grads(graph_outputs, node, grads)
            continue

        for hook_idx in node.pre_hooks:
            grads = _unpack(
                ops.call_hook(hooks, hook_idx, grads, hook_type="pre_hook"),
                node.num_inputs,
            )
        outputs = _apply(ops, node_idx, node, grads, lifted)
        for hook_idx in node.post_hooks:
            outputs = ops.call_hook(hooks, hook_idx, outputs, grads, hook_type="post_hook")

        for output_nr, edge in enumerate(node.next_edges):
            if edge is None:
                continue
            target, input_nr = edge
            buffer = buffers[target]
            assert buffer is not None, "next edge points to a node that already ran"
            output = outputs[output_nr]
            buffer[input_nr] = (
                output
                if buffer[input_nr] is None
                else ops.accumulate(buffer[input_nr], output)
            )
    return graph_outputs


def _return_captured_grads(
    graph_outputs: list[Any], node: BackwardNode, grads: list[Any]
) -> None:
    for input_nr, output_idx in node.captures:
        graph_outputs[output_idx] = grads[input_nr]


def _unpack(values: Any, count: int) -> list[Any]:
    """A list of ``count`` elements from a list, or from a Proxy of one."""
    return [values[i] for i in range(count)]


def _apply(ops: Any, node_idx: int, node: BackwardNode, grads: list[Any], lifted: Lifted) -> Any:
    """Runs one node; returns its outputs, one per next edge."""
    tensors, hooks = lifted.tensors, lifted.hooks
    if node.kind == NodeKind.ACCUMULATE_GRAD:
        variable = tensors[node.saved_tensors[0]] if node.saved_tensors else None
        if variable is not None:
            ops.accumulate_grad(variable, grads[0])
        for hook_idx in node.post_acc_grad_hooks:
            ops.call_hook(hooks, hook_idx, variable, hook_type="post_acc_grad_hook")
        return []
    if node.kind == NodeKind.EAGER:
        return ops.apply_eagerly(node_idx, grads)
    if node.kind in (NodeKind.PYTHON_FUNCTION, NodeKind.AOT_BACKWARD):
        grads = ops.materialize_grads(node_idx, grads, lifted.sizes, node.sizes)
        saved = [None if i < 0 else tensors[node.saved_tensors[i]] for i in node.saved_layout]
        if node.kind == NodeKind.PYTHON_FUNCTION:
            results = ops.call_function_backward(hooks[node.python_ctx], saved, grads)
        else:
            first_size = node.sizes[0]
            symints = [lifted.sizes[first_size + i] for i in range(node.num_symints)]
            backward_state = [] if node.backward_state < 0 else [hooks[node.backward_state]]
            results = ops.call_aot_backward(
                node.aot_backward, saved, symints, grads, *backward_state
            )
        outputs = ops.function_gradients(results, node.is_variable_input, node.name)
        return ops.validate_outputs(node_idx, outputs, lifted.sizes, node.sizes)
    apply = (
        ops.apply_with_saved
        if node.kind == NodeKind.APPLY_WITH_SAVED
        else ops.apply_with_saved_dynamo_disabled
    )
    # Eager unpacks a saved variable when its node runs: so do we.
    unpacked = [
        ops.call_hook(hooks, hook_idx, lifted.packed_data[data_idx], hook_type="unpack_hook")
        for hook_idx, data_idx in node.unpack_hooks
    ]
    return apply(
        node_idx,
        grads,
        [tensors[i] for i in node.saved_tensors],
        lifted.sizes,
        node.sizes,
        lifted.scalars,
        node.saved_scalars,
        *([unpacked] if unpacked else []),
    )


# ---------------------------------------------------------------------------
# Backward ops: what the captured graph calls
# ---------------------------------------------------------------------------


def begin_node(node_idx: int, node: BackwardNode) -> None:
    """Marks where node ``node_idx``'s work starts: nothing to do when
    running; a capture annotates the ops that follow with the node."""


# The graph passes the whole sizes and scalars lists with each node's span of
# them, rather than a slice per node, to stay small; these ops are inlined by
# Dynamo, so the slicing happens while tracing and the ops Dynamo keeps in
# its graph (_apply_node, _validate_node_outputs) see only their own values.


def apply_with_saved(
    node_idx: int,
    grads: list[Optional[torch.Tensor]],
    saved_tensors: list[torch.Tensor],
    sizes: list[int],
    sizes_span: tuple[int, int],
    scalars: list[Any],
    scalars_span: tuple[int, int],
    unpacked: Sequence[torch.Tensor] = (),
) -> list[Optional[torch.Tensor]]:
    """Applies node ``node_idx`` of the running backward to ``grads``, with
    its saved tensors, sizes and scalars replaced by the given ones (its
    sizes are ``sizes[slice(*sizes_span)]``, those of its saved state first)
    and its saved variables with saved-tensor hooks by ``unpacked``; then
    checks and fixes up its outputs as :func:`validate_outputs` does.

    Dynamo keeps the node call in its graph; AOTAutograd traces through it
    into the node's aten ops.
    """
    return _apply_node(
        node_idx,
        grads,
        saved_tensors,
        _span(sizes, sizes_span),
        _span(scalars, scalars_span),
        list(unpacked),
    )


@torch._dynamo.disable
def apply_with_saved_dynamo_disabled(*args: Any) -> list[Optional[torch.Tensor]]:
    """apply_with_saved (same arguments) behind a Dynamo graph break: for C++
    autograd Functions declared ``is_traceable = false``, which run eagerly."""
    return apply_with_saved(*args)


def validate_outputs(
    node_idx: int,
    outputs: list[Optional[torch.Tensor]],
    sizes: list[int],
    sizes_span: tuple[int, int],
) -> list[Optional[torch.Tensor]]:
    """The eager engine's checks and fix-ups of a node's outputs (shape,
    dtype, device) against what the next nodes expect; the expected shapes
    are the tail of the node's sizes, ``sizes[slice(*sizes_span)]``."""
    return _validate_node_outputs(node_idx, outputs, _span(sizes, sizes_span))


def materialize_grads(
    node_idx: int,
    grads: list[Optional[torch.Tensor]],
    sizes: list[int],
    sizes_span: tuple[int, int],
) -> list[Optional[torch.Tensor]]:
    """The zeros a Python autograd.Function's backward gets for gradients it
    did not receive (unless it called ``ctx.set_materialize_grads(False)``),
    shaped like the forward's outputs."""
    return _materialize_grads(node_idx, grads, _span(sizes, sizes_span))


def call_function_backward(
    ctx: Any,
    saved_tensors: list[Optional[torch.Tensor]],
    grads: list[Optional[torch.Tensor]],
) -> Sequence[Any]:
    """Calls a Python autograd.Function's backward (or vjp) on ``grads``,
    with ``ctx.saved_tensors`` answered by the lifted ``saved_tensors``.
    Dynamo traces the backward; one it cannot trace graph-breaks."""
    return torch._dynamo.external_utils.call_backward(ctx, saved_tensors, *grads)


def call_aot_backward(
    aot_backward: "AOTBackward",
    saved_tensors: list[Optional[torch.Tensor]],
    symints: list[Any],
    grads: list[Optional[torch.Tensor]],
    *backward_state: Any,
) -> Sequence[Any]:
    """Runs the backward of a compiled region (in a captured graph, a
    ``call_module`` of ``aot_backward``), with the region's Dynamo
    BackwardState if it has one."""
    return aot_backward(saved_tensors, symints, grads, *backward_state)


def function_gradients(
    results: Sequence[Any], is_variable_input: tuple[bool, ...], name: str
) -> list[Optional[torch.Tensor]]:
    """Checks what an autograd.Function's backward returned and keeps the
    gradients of its tensor inputs, as PyNode::apply does."""
    num_inputs = len(is_variable_input)
    if len(results) > num_inputs and all(r is None for r in results[num_inputs:]):
        results = results[:num_inputs]
    if len(results) != num_inputs:
        raise RuntimeError(
            f"function {name} returned an incorrect number of gradients "
            f"(expected {num_inputs}, got {len(results)})"
        )
    outputs = []
    for position, (result, is_variable) in enumerate(zip(results, is_variable_input)):
        if not is_variable:
            if result is not None:
                raise RuntimeError(
                    f"function {name} returned a gradient different than None at "
                    f"position {position + 1}, but the corresponding forward input "
                    "was not a Variable"
                )
            continue
        if result is not None and not isinstance(result, torch.Tensor):
            raise RuntimeError(f"expected Variable or None (got {type(result).__name__})")
        outputs.append(result)
    return outputs


class AOTBackward(torch.fx.GraphModule):
    """The backward of a region compiled with torch.compile, for the graph to
    call: AOTAutograd's prologue (tangent layout), then a copy of the
    region's backward graph, its nodes named ``aot<N>_...`` after the region
    (AOTAutograd's id), so that they read as the region's in a printed graph.
    Dynamo traces it, so the region's backward ops join the rest of the
    backward in one compiled graph. (AOTAutograd's epilogue only matters for
    what ``_aot_backward_inlinable`` excludes: effect tokens, RNG offsets,
    subclasses.)

    One per region (AOTAutograd's ``CompiledFunction`` class), made the first
    time a backward through it is captured, and named like the legacy
    engine's annotation of it, e.g. ``CompiledFunctionBackward0``.
    ``_aot_backward_inlinable`` decides which regions it can run; the others
    run as themselves.
    """

    _by_region: "weakref.WeakKeyDictionary[type, AOTBackward]" = weakref.WeakKeyDictionary()
    _by_aot_id: "weakref.WeakValueDictionary[int, AOTBackward]" = weakref.WeakValueDictionary()

    def __init__(
        self, forward_cls: type, name: str, num_symints: int, has_backward_state: bool
    ) -> None:
        aot_id = forward_cls._aot_id
        backward_module = _region_backward_module(forward_cls)
        assert backward_module is not None, "_aot_backward_inlinable admits only loadable regions"
        super().__init__(
            backward_module,
            _region_backward_graph(
                aot_id, backward_module.graph, num_symints, has_backward_state
            ),
            f"{name}{aot_id}",
        )
        self.aot_id = aot_id
        self.signature = (num_symints, has_backward_state)
        self.prologue = forward_cls._bw_prologue_fn
        self.symbolic_saved_dims = _symbolic_saved_dims(backward_module, num_symints)
        AOTBackward._by_aot_id[aot_id] = self

    @classmethod
    def of(
        cls, forward_cls: type, name: str, num_symints: int, has_backward_state: bool
    ) -> "AOTBackward":
        region = cls._by_region.get(forward_cls)
        if region is None or region.signature != (num_symints, has_backward_state):
            region = cls(forward_cls, name, num_symints, has_backward_state)
            cls._by_region[forward_cls] = region
        return region


def _symbolic_saved_dims(
    backward_module: torch.fx.GraphModule, num_symints: int
) -> Optional[tuple[tuple[int, ...], ...]]:
    """For each tensor a compiled region saved for its backward, in
    ctx.saved_tensors order, the dims its forward compiled as symbols (a
    ``torch.compile`` with ``dynamic=True``, or the recompile after a size
    changed). Read off the example values of the region's backward graph's
    inputs -- its symints, then ctx.saved_tensors, then opaque objects and
    gradients (AOTAutograd's backward prologue) -- or off what AOTAutograd's
    cache recorded of them when it dropped them (``patches/0019``); None
    when neither is there."""
    from torch._functorch._aot_autograd.aot_autograd_result import placeholder_symbolic_dims

    dims = placeholder_symbolic_dims(backward_module)
    if dims is None:
        return None
    saved = []
    for tensor_dims in dims[num_symints:]:
        if tensor_dims is None:
            break
        saved.append(tensor_dims)
    return tuple(saved)


@dataclasses.dataclass(frozen=True)
class SymbolicInForward:
    """What a captured graph lifted that a compiled region's forward had as
    a symbol: the regions' symints (indices into ``sizes``; AOTAutograd
    saves a size as a symint only when it is one) and the symbolic dims of
    the tensors they saved (``(index into inputs, dims)``), where a region
    says which those are (:func:`_symbolic_saved_dims`)."""

    sizes: tuple[int, ...] = ()
    tensor_dims: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # The lifted tensors whose symbolic dims a region said (none or some).
    saved_by_regions: frozenset[int] = frozenset()


def _symbolic_in_compiled_forwards(nodes: Sequence["BackwardNode"]) -> SymbolicInForward:
    """:class:`SymbolicInForward` of the compiled regions among ``nodes``:
    each symint is one of its node's sizes (they come first), each of
    ctx.saved_tensors one of the lifted tensors (``saved_layout``)."""
    sizes: list[int] = []
    tensor_dims: dict[int, set[int]] = collections.defaultdict(set)
    for node in nodes:
        if node.aot_backward is None:
            continue
        sizes.extend(range(node.sizes[0], node.sizes[0] + node.num_symints))
        for position, dims in enumerate(node.aot_backward.symbolic_saved_dims or ()):
            if position < len(node.saved_layout) and node.saved_layout[position] >= 0:
                tensor_dims[node.saved_tensors[node.saved_layout[position]]].update(dims)
    return SymbolicInForward(
        tuple(sizes),
        tuple((index, tuple(sorted(dims))) for index, dims in tensor_dims.items() if dims),
        frozenset(tensor_dims),
    )


def _dynamic_by_forward(
    symbolic: SymbolicInForward,
    related_dims: Sequence[tuple[int, int, int, int]],
    inputs: Sequence[Any],
    sizes: Sequence[Any],
) -> tuple[set[int], dict[int, set[int]]]:
    """The lifted sizes (indices) and tensor dims (``{index: dims}``) of a
    captured graph that are dynamic because a compiled region's forward had
    them as symbols.

    The regions say which of their symints and saved tensors' dims those
    are (:class:`SymbolicInForward`). The rest of the graph -- the region
    nodes' input and output shapes, a loss computed eagerly after the
    region, a layer between two regions -- does not say where its sizes
    came from: those equal to one of the symbols' values are taken for
    dynamic, and so is a size found equal to the product of dims taken for
    dynamic (``related_dims``, e.g. a mean's element count). Values that are
    a parameter's dim too are left static (a feed-forward width equal to
    batch x sequence at one shape), and so are 0 and 1, which Dynamo
    specializes. A size taken for dynamic by coincidence costs at most the
    recompile the default makes anyway: a guard comparing it with a
    constant specializes it, one equating it with a size that later changes
    fails then."""
    tensors = [(i, t) for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    parameters = {i for i, t in tensors if t.is_leaf and t.requires_grad}
    parameter_dims = {size for i, t in tensors if i in parameters for size in t.shape}
    values = {sizes[index] for index in symbolic.sizes} | {
        inputs[index].size(d) for index, dims in symbolic.tensor_dims for d in dims
    }
    values -= parameter_dims | {0, 1}
    dynamic_dims = {index: set(dims) for index, dims in symbolic.tensor_dims}
    for index, tensor in tensors:
        if index not in parameters and index not in symbolic.saved_by_regions:
            dims = {d for d, size in enumerate(tensor.shape) if size in values}
            if dims:
                dynamic_dims[index] = dims
    dynamic_sizes = set(symbolic.sizes)
    dynamic_sizes.update(index for index, size in enumerate(sizes) if size in values)
    dynamic_sizes.update(
        size_index
        for size_index, tensor_index, begin, end in related_dims
        if dynamic_dims.get(tensor_index, set()) & set(range(begin, end))
        and sizes[size_index] not in parameter_dims
    )
    return dynamic_sizes, dynamic_dims


def _region_backward_graph(
    aot_id: int, backward_graph: torch.fx.Graph, num_symints: int, has_backward_state: bool
) -> torch.fx.Graph:
    """``(saved_tensors, symints, grads[, backward_state]) -> gradients``: the
    prologue, then the region's backward graph, with aten.view as
    aten.reshape (the region's forward was compiled with Inductor's
    view-to-reshape pass, so the gradients it saved may not be viewable the
    way the graph assumed). The backward graph's inputs are the symints, what
    the prologue prepares, and last the BackwardState, if any."""
    graph = torch.fx.Graph()
    saved_tensors, symints, grads = (
        graph.placeholder(name) for name in ("saved_tensors", "symints", "grads")
    )
    inputs = [node for node in backward_graph.nodes if node.op == "placeholder"]
    backward_state = (
        graph.placeholder(f"aot{aot_id}_{inputs[-1].name}") if has_backward_state else None
    )
    prepared = graph.create_node(
        "call_function",
        _prepare_aot_backward_inputs,
        (aot_id, saved_tensors, symints, grads),
        name=f"aot{aot_id}_prologue",
    )
    env: dict[torch.fx.Node, Any] = {}
    for node in backward_graph.nodes:
        name = f"aot{aot_id}_{node.name}"
        if node.op == "placeholder":
            # The symints as given, not as the prologue returned them: under
            # Dynamo those would be new unbacked values.
            position = len(env)
            if backward_state is not None and position == len(inputs) - 1:
                env[node] = backward_state
                continue
            source = symints if position < num_symints else prepared
            env[node] = graph.create_node(
                "call_function", operator.getitem, (source, position), name=name
            )
        elif node.op == "output":
            graph.output(torch.fx.map_arg(node.args[0], env.__getitem__))
        else:
            target = (
                torch.ops.aten.reshape.default
                if node.target is torch.ops.aten.view.default
                else node.target
            )
            copied = graph.create_node(
                node.op,
                target,
                torch.fx.map_arg(node.args, env.__getitem__),
                torch.fx.map_arg(node.kwargs, env.__getitem__),
                name=name,
                type_expr=node.type,
            )
            copied.meta = dict(node.meta)
            env[node] = copied
    return graph


@torch._dynamo.allow_in_graph
def _prepare_aot_backward_inputs(
    aot_id: int,
    saved_tensors: list[Optional[torch.Tensor]],
    symints: list[Any],
    grads: list[Optional[torch.Tensor]],
) -> list[Any]:
    """AOTAutograd's backward prologue of a region (the layout its backward
    graph wants of the gradients): one op for Dynamo, whose tensor ops
    AOTAutograd traces. It is generated code Dynamo skips; the graph refers
    to the region by id because fx cannot name the generated function."""
    # A tuple: the prologue empties a list of gradients it is given.
    return AOTBackward._by_aot_id[aot_id].prologue(saved_tensors, symints, [], tuple(grads))


def _aot_backward_inlinable(forward_cls: type) -> bool:
    """Whether AOTBackward can run this compiled region's backward: not when
    it has tensor subclasses, RNG state, tensors saved outside
    ``ctx.saved_tensors``, or a backward graph AOTAutograd no longer keeps or
    cannot hand back (:func:`_region_backward_module`)."""
    from torch._functorch._aot_autograd.runtime_wrappers import (
        AutogradLazyBackwardCompileInfo,
        CachedAutogradLazyBackwardCompileInfo,
    )

    metadata = forward_cls.metadata
    return (
        forward_cls.maybe_subclass_metadata is None
        and isinstance(
            forward_cls._lazy_backward_info,
            (AutogradLazyBackwardCompileInfo, CachedAutogradLazyBackwardCompileInfo),
        )
        and not metadata.num_graphsafe_rng_states
        and not metadata.is_rng_op_functionalized
        and not metadata.num_tensors_saved_with_no_vc_check
        and not metadata.num_backward_tokens
        and _region_backward_module(forward_cls) is not None
    )


_REGION_BACKWARD_MODULES: "weakref.WeakKeyDictionary[type, Optional[torch.fx.GraphModule]]" = (
    weakref.WeakKeyDictionary()
)


def _region_backward_module(forward_cls: type) -> Optional[torch.fx.GraphModule]:
    """The compiled region's backward graph, as AOTAutograd keeps it, or None
    when AOTAutograd cannot hand it back; loaded once per region.

    A region loaded from AOTAutograd's cache keeps its backward graph as
    Python code, which torch.fx traces again to load it; in torch 2.13 that
    trace fails on an aten call whose size list holds symbolic sizes (a
    region compiled with dynamic shapes, e.g. ``aten.full([3, s1, s0, 8])``
    in nn.MultiheadAttention's backward), raising RuntimeError. Such a
    region's backward runs as itself (the legacy engine fails the backward)."""
    if forward_cls in _REGION_BACKWARD_MODULES:
        return _REGION_BACKWARD_MODULES[forward_cls]
    from torch._dynamo.compiled_autograd import extract_bw_module

    try:
        module = extract_bw_module(forward_cls)
    except RuntimeError as error:
        log.info(
            "The backward of compiled region %s runs as itself, not inlined: "
            "AOTAutograd could not hand back its backward graph (%s: %s)",
            forward_cls._aot_id,
            type(error).__name__,
            str(error).splitlines()[0] if str(error) else "",
        )
        module = None
    _REGION_BACKWARD_MODULES[forward_cls] = module
    return module


def related_sizes(
    sizes: list[int],
    tensors: list[torch.Tensor],
    related_dims: tuple[tuple[int, int, int, int], ...],
) -> list[Any]:
    """The lifted sizes, with what the capture found them to be made known
    to Dynamo: each of ``related_dims`` -- ``(size index, position in
    tensors, first dim, end dim)`` -- equalled the product of those dims.

    Under Dynamo's default shape handling, sizes are static until one
    changes and a recompile makes it dynamic; each size that is dynamic then
    is compared with its dims, and while they are equal the guard on that
    comparison makes the size that expression in the tensors' size symbols,
    so that Inductor knows a reshape's target is the product of the dims it
    reshapes. A relation that was a coincidence (a sequence length equal to
    the head size) fails its guard once the two differ, and Dynamo compiles
    again without it -- as for two input dims it unified by value (duck
    shaping). A relation between a dynamic size and static dims, or the
    reverse, can only be such a coincidence, and it would make the dynamic
    side static; the compile leaves those out
    (:meth:`_CompiledBackward.applicable_relations`).

    Tensor dims that change are each a symbol of their own, even where two
    are the same batch or sequence length: Dynamo makes them dynamic when
    they change, and only unifies equal sizes (duck shaping) of dims that
    are dynamic from the start. Two such symbols meet in a reshape between
    shapes built from each, as a product equality Inductor cannot simplify,
    and it copies through ``%`` indexing instead of fusing (a 10x slower
    kernel in nn.TransformerEncoderLayer's feed-forward backward). So the
    compile also compares the dynamic dims that were equal at every compile
    of the graph, and the guard makes each group one symbol while they stay
    equal.

    Returns ``sizes`` outside Dynamo, and when Dynamo treats every size as
    dynamic from the first compile (``dynamic=True``,
    ``compiled_autograd_symbolic_sizes``): that promises no recompile when
    sizes change, which guards on coincidences would break."""
    if not torch.compiler.is_compiling() or not _sizes_static_until_they_change():
        return sizes
    applicable, equal_dims = _applicable_relations()
    for (position, dim), (other, other_dim) in equal_dims:
        # Dynamo guards on a comparison its trace branches on.
        if tensors[position].size(dim) == tensors[other].size(other_dim):
            continue
    related = list(sizes)
    for index, (size_index, position, begin, end) in enumerate(related_dims):
        if applicable is not None and not applicable[index]:
            continue
        value = tensors[position].size(begin)
        for dim in range(begin + 1, end):
            value = value * tensors[position].size(dim)
        if related[size_index] == value:
            related[size_index] = value
    return related


@torch._dynamo.assume_constant_result
def _sizes_static_until_they_change() -> bool:
    """Whether the Dynamo compile under way specializes sizes first. Read
    once per compile and not guarded: compiled_autograd_symbolic_sizes sets
    the option only while Dynamo compiles, so a guard on it would fail on
    every run."""
    return torch._dynamo.config.assume_static_by_default


@torch._dynamo.assume_constant_result
def _applicable_relations() -> tuple[
    Optional[tuple[bool, ...]], tuple[tuple[tuple[int, int], tuple[int, int]], ...]
]:
    """Which of the graph's size relations the Dynamo compile under way
    applies, or None for all of them, and which lifted tensors' dims it
    compares (:meth:`_CompiledBackward.applicable_relations`). Decided once
    per compile, while Dynamo traces the graph's first frame (its inputs are
    all there until that frame runs), and not guarded, as above."""
    running = _CONFIG_WHILE_COMPILING.running
    if running is None:
        return None, ()
    graph, inputs, sizes = running
    return graph.applicable_relations(inputs, sizes)


def _span(values: Sequence[Any], span: tuple[int, int]) -> list[Any]:
    begin, end = span
    return list(values[begin:end])


@torch._dynamo.allow_in_graph
def _apply_node(
    node_idx: int,
    grads: list[Optional[torch.Tensor]],
    saved_tensors: list[torch.Tensor],
    sizes: list[Any],
    scalars: list[Any],
    unpacked: list[torch.Tensor],
) -> list[Optional[torch.Tensor]]:
    return _C.apply_with_saved(node_idx, grads, saved_tensors, sizes, scalars, unpacked)


@torch._dynamo.allow_in_graph
def _materialize_grads(
    node_idx: int, grads: list[Optional[torch.Tensor]], sizes: list[Any]
) -> list[Optional[torch.Tensor]]:
    return _C.materialize_grads(node_idx, grads, sizes)


@torch._dynamo.allow_in_graph
def _validate_node_outputs(
    node_idx: int, outputs: list[Optional[torch.Tensor]], sizes: list[Any]
) -> list[Optional[torch.Tensor]]:
    return _C.validate_outputs(node_idx, outputs, sizes)


@torch._dynamo.disable(
    reason=(
        "compiled autograd's python engine runs this autograd node eagerly (a C++ "
        "or Python Function whose backward it cannot trace, a C++ node without "
        "compiled_args, or a torch.compile'd region with tensor subclasses, RNG "
        "state or effect tokens). Compile the "
        "captured graph without fullgraph=True, or set "
        "torch._dynamo.config.compiled_autograd_engine = 'legacy'"
    )
)
def apply_eagerly(
    node_idx: int, grads: list[Optional[torch.Tensor]]
) -> list[Optional[torch.Tensor]]:
    """Runs node ``node_idx`` itself, on its own saved values, behind a
    Dynamo graph break (Python autograd.Functions the graph cannot call, C++
    nodes without compiled_args), and validates its outputs."""
    return _C.apply_eagerly(node_idx, grads)


@torch._dynamo.disable
def call_cpp_tensor_pre_hook(
    node_idx: int, hook_idx: int, grad: Optional[torch.Tensor]
) -> Optional[torch.Tensor]:
    """Runs a C++ tensor pre-hook of node ``node_idx`` (e.g. retain_grad)."""
    if grad is None:
        return None
    return _C.call_cpp_tensor_pre_hook(node_idx, hook_idx, grad)


def call_hook(hooks: list[Any], hook_idx: int, *args: Any, hook_type: str) -> Any:
    """Calls the Python hook ``hooks[hook_idx]`` the way the eager engine
    does: node pre- and post-hooks see tuples, and a hook returning None
    changes nothing.

    The hook is read from the list when it is called, and the list's last
    item records the hook called last: a hook removed while the graph runs,
    before its node's turn, has been replaced by :func:`_removed_hook`
    (``skip_hook_removed_before_its_turn``, node_apply.h)."""
    if hook_type != "unpack_hook":
        hooks[-1][0] = hook_idx
    hook = hooks[hook_idx]
    if hook_type in ("pre_hook", "post_hook"):
        # A pre-hook may replace the gradients it gets; a post-hook, the
        # outputs it gets first (it also sees the node's input gradients).
        replaceable, *seen = [tuple(values) for values in args]
        result = hook(replaceable, *seen)
        if result is None:
            return list(replaceable)
        _check_node_hook_result(replaceable, result, hook)
        return list(result)
    result = hook(*args)
    if hook_type == "unpack_hook":
        return result
    if hook_type == "post_acc_grad_hook":
        if result is not None:
            raise RuntimeError("Tensor post accumulate grad hooks should return None.")
        return None
    if result is None:
        return args[0]
    _check_tensor_hook_result(args[0], result, hook)
    return result


def _removed_hook(*args: Any) -> None:
    """Stands in for a hook removed while the backward runs, before its
    node's turn: the eager engine would not call it. Returning None changes
    nothing, for every kind of hook."""


def _skip_hook_removed_before_its_turn(hooks_dict: dict[Any, Any], key: Any) -> None:
    """``RemovableHandle.remove`` calls this before it deletes
    ``hooks_dict[key]``; see ``skip_hook_removed_before_its_turn`` in
    node_apply.h."""
    _C.skip_hook_removed_before_its_turn(hooks_dict, key, _removed_hook)


torch.utils.hooks._before_hook_removal = _skip_hook_removed_before_its_turn


def _check_node_hook_result(previous: tuple[Any, ...], result: Any, hook: Any) -> None:
    """The checks (and messages) of the eager engine's check_result, for
    what a node pre- or post-hook returned in place of ``previous``."""
    if not isinstance(result, tuple):
        raise TypeError(f"expected tuple, but hook returned '{type(result).__name__}'")
    if len(result) != len(previous):
        raise RuntimeError(
            f"hook '{_hook_name(hook)}' has returned an incorrect number of values "
            f"(got {len(result)}, but expected {len(previous)})"
        )
    for grad, new_grad in zip(previous, result):
        if new_grad is None:
            continue
        if grad is None:
            raise RuntimeError("can't replace a None gradient with a non-None value")
        _check_tensor_hook_result(grad, new_grad, hook)


def _hook_name(hook: Any) -> str:
    name = getattr(hook, "__name__", None)
    return name if isinstance(name, str) else "<unknown>"


def _check_tensor_hook_result(grad: Optional[torch.Tensor], result: Any, hook: Any) -> None:
    """The checks (and messages) of the eager engine's check_single_result."""
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"expected Variable, but hook returned '{type(result).__name__}'")
    if grad is None:
        raise RuntimeError("can't replace a empty gradient with a non-empty value")
    name = _hook_name(hook)
    if result.dtype != grad.dtype or result.device != grad.device or result.layout != grad.layout:
        raise RuntimeError(
            f"hook '{name}' has changed the type of value (was {grad.type()} got {result.type()})"
        )
    if result.shape != grad.shape:
        raise RuntimeError(f"hook '{name}' has changed the size of value")


def accumulate(
    old: Optional[torch.Tensor], new: Optional[torch.Tensor]
) -> Optional[torch.Tensor]:
    """Adds a gradient into an input buffer slot; None is no gradient."""
    if old is None:
        return new
    if new is None:
        return old
    return old + new


def accumulate_grad(variable: torch.Tensor, grad: Optional[torch.Tensor]) -> None:
    """AccumulateGrad: adds ``grad`` into ``variable.grad``.

    Run eagerly, this is libtorch's AccumulateGrad::accumulateGrad (gradient
    layout contract, in-place accumulation, sparse gradients). Under Dynamo,
    inductor.accumulate_grad_ becomes Dynamo's polyfill of the same rules,
    which it can fuse. Like AccumulateGrad, it skips a variable that no
    longer requires grad (a hook may have turned it off during the backward).
    """
    if grad is None or not variable.requires_grad:
        return
    if torch.compiler.is_compiling() and grad.layout == torch.strided:
        torch.ops.inductor.accumulate_grad_.default(variable, grad)
    else:
        _accumulate_grad_eagerly(variable, grad)


@torch._dynamo.disable
def _accumulate_grad_eagerly(variable: torch.Tensor, grad: torch.Tensor) -> None:
    # Also Dynamo's fallback for sparse gradients, which its polyfill cannot add.
    _C.accumulate_grad(variable, grad)


_RUNTIME_OPS = sys.modules[__name__]


# ---------------------------------------------------------------------------
# Capture: phase 1
# ---------------------------------------------------------------------------


class _AnnotatingTracer(torch.fx.proxy.GraphAppendingTracer):
    """Appends to a graph, annotating each node with ``origin``: where it
    came from, as a stack trace, which print_readable shows above it."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        super().__init__(graph)
        self.origin: Optional[str] = None

    def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = super().create_node(*args, **kwargs)
        node.stack_trace = self.origin
        return node


class _GraphRecorder:
    """Stands in for the backward ops while :func:`python_autograd` is
    traced: each call records a ``call_function`` of the real op, except
    compiled regions' backwards, which become submodules of ``root``."""

    def __init__(self, tracer: _AnnotatingTracer) -> None:
        self._tracer = tracer
        self.root = torch.nn.Module()

    def begin_node(self, node_idx: int, node: BackwardNode) -> None:
        """The ops recorded from now on come from this node: print_readable
        shows ``# File: ..., code: <node name> (NodeCall <node_idx>)`` above
        them (the legacy engine's annotation; the index is the node's
        position in execution order, the ``node_idx`` its ops take)."""
        self._tracer.origin = (
            f'  File "{__file__}", line {python_autograd.__code__.co_firstlineno}, '
            f"in python_autograd\n    {node.name} (NodeCall {node_idx})\n"
        )

    def call_aot_backward(self, aot_backward: "AOTBackward", *args: Any) -> torch.fx.Proxy:
        name = aot_backward._get_name()
        self.root.add_module(name, aot_backward)
        return self._tracer.create_proxy("call_module", name, args, {})

    def __getattr__(self, name: str) -> Callable[..., torch.fx.Proxy]:
        op = getattr(_RUNTIME_OPS, name)

        def record(*args: Any, **kwargs: Any) -> torch.fx.Proxy:
            return self._tracer.create_proxy("call_function", op, args, kwargs)

        return record


def capture(
    nodes: Sequence[BackwardNode],
    num_outputs: int,
    num_tensors: int,
    related_dims: Sequence[tuple[int, int, int, int]] = (),
) -> torch.fx.GraphModule:
    """Traces :func:`python_autograd` over ``nodes`` into a GraphModule.

    The module takes ``(inputs, sizes, scalars, hooks, packed_data)`` --
    the values a backward with this structure lifted (:class:`Lifted`) --
    and returns the gradients ``autograd.grad`` asked for. Its ``meta`` keeps
    ``backward_nodes`` and ``num_outputs``. ``related_dims`` are the
    sizes found equal to the product of a lifted tensor's dims -- ``(size
    index, tensor index, first dim, end dim)``; the graph tells Dynamo
    (:func:`related_sizes`).
    """
    graph = torch.fx.Graph()
    tracer = _AnnotatingTracer(graph)
    inputs, sizes, scalars, hooks, packed_data = (
        torch.fx.Proxy(graph.placeholder(name), tracer)
        for name in ("inputs", "sizes", "scalars", "hooks", "packed_data")
    )
    tensors = [inputs[i] for i in range(num_tensors)]
    recorder = _GraphRecorder(tracer)
    if related_dims:
        sizes = recorder.related_sizes(sizes, tensors, tuple(related_dims))
    lifted = Lifted(tensors, sizes, scalars, hooks, packed_data)
    outputs = python_autograd(nodes, num_outputs, lifted, ops=recorder)
    # Under Dynamo with fullgraph=True, callbacks a traced hook queues with
    # queue_callback go to a list of Dynamo's, which it runs only where the
    # graph calls this stub (as legacy's graphs do). Callbacks queued outside
    # Dynamo's trace go to the engine, which runs them after the graph.
    graph.call_function(FakeCompiledAutogradEngine._exec_final_callbacks_stub, ())
    graph.output(tracer.create_arg(outputs))
    graph_module = torch.fx.GraphModule(recorder.root, graph, "CompiledAutograd")
    _name_code_after_its_graph(graph_module, nodes)
    # Dynamo and AOTAutograd free each lifted tensor after its last use.
    set_locals_to_steal(graph_module, ["inputs"])
    # What was traced, for debugging and for running the loop itself.
    graph_module.meta["backward_nodes"] = tuple(nodes)
    graph_module.meta["num_outputs"] = num_outputs
    return graph_module


# Graphs captured since the last reset(), per digest of their code and nodes.
_captures_by_digest: collections.Counter[str] = collections.Counter()


def _name_code_after_its_graph(
    graph_module: torch.fx.GraphModule, nodes: Sequence[BackwardNode]
) -> None:
    """Names the code of the graph's ``forward`` after a digest of its source
    and of the autograd nodes it calls (the source refers to them by position).

    Dynamo's profile-guided dynamic shapes (``torch.compiler.config.job_id``)
    find a frame's recorded state in a restarted program by its code's file
    name. fx names generated code ``<eval_with_key>.N``, N counting every
    GraphModule the process made before, so a restart that makes more or fewer
    of them (Inductor's and AOTAutograd's caches, warm after the first run,
    skip the tracing that makes some) looked the graph up under another name
    and compiled as often as the first run. Graphs with the same source and
    nodes that differ inside a node (a sum over another dim) are told apart by
    the order of their captures, which a restarted program repeats. The name
    keeps fx's prefix, which fx's error reports for generated code look for."""
    source = graph_module.code
    hasher = hashlib.sha256(source.encode())
    hasher.update(" ".join(node.name for node in nodes).encode())
    digest = hasher.hexdigest()[:16]
    ordinal = _captures_by_digest[digest]
    _captures_by_digest[digest] += 1
    filename = f"<eval_with_key>.compiled_autograd.{digest}" + (f".{ordinal}" if ordinal else "")
    graph_module.graph._co_fields = {"co_filename": filename}  # for a later recompile()
    forward = type(graph_module).forward
    type(graph_module).forward = types.FunctionType(
        forward.__code__.replace(co_filename=filename),
        forward.__globals__,
        forward.__name__,
        forward.__defaults__,
        forward.__closure__,
    )
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)


# ---------------------------------------------------------------------------
# Installation, and the entry points torch._compiled_autograd_C calls
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Installation:
    """What backward passes are routed to: the compiler for captured graphs,
    and whether Dynamo compiles them with every size symbolic from the first
    compile (``symbolic_sizes``, from
    ``torch._dynamo.config.compiled_autograd_symbolic_sizes``) or, as
    torch.compile does by default, specializes first and recompiles once
    when a size changes."""

    compiler_fn: Callable[[torch.fx.GraphModule], Callable[..., Any]]
    symbolic_sizes: bool = False


_installation: Optional[Installation] = None


def install(installation: Optional[Installation]) -> Optional[Installation]:
    """Routes backward passes to this engine, or stops routing them here
    (None). Returns the previous installation."""
    global _installation
    with _RUNNING.lock:
        prior, _installation = _installation, installation
        # While a captured graph runs the engine stays off (a nested backward,
        # e.g. reentrant checkpointing's, runs eagerly); the last graph to
        # finish applies the installation made meanwhile.
        if _RUNNING.count == 0 and (prior is not None or installation is not None):
            _install_engine_entry(installation)
    return prior


def _install_engine_entry(installation: Optional[Installation]) -> None:
    _C.install(installation is not None, installation is not None and installation.symbolic_sizes)


def reset() -> None:
    """Forgets every captured graph, and which eager fallbacks were warned
    about, so that the next one of each kind warns again."""
    _C.clear_cache()
    _captures_by_digest.clear()
    _reported_fallbacks.clear()


def _capture(
    collected_nodes: list[dict[str, Any]],
    num_outputs: int,
    num_tensors: int,
    reason: str,
    new_node: tuple[int, str, int, list[int]],
    related_dims: list[tuple[int, int, int, int]],
) -> Callable[..., Any]:
    """Called from C++ on a cache miss: captures and compiles a graph.

    ``reason`` says how the graph differs from the previous backward's;
    ``new_node`` is the first node no cached graph has after the same nodes
    (index, name, the size of its part of the cache key, and that of the
    cached graphs at that position), logged in the legacy engine's words.
    ``related_dims`` are the sizes found equal to the product of a lifted
    tensor's dims (:func:`related_sizes`)."""
    from torch._dynamo import compiled_autograd as frontend

    assert _installation is not None, "the Python compiled autograd engine is not installed"
    node_idx, node_name, key_size, previous_key_sizes = new_node
    verbose_log.debug(
        "Cache miss due to new autograd node: %s (NodeCall %d) with key size %d, "
        "previous key sizes=[%s]",
        node_name,
        node_idx,
        key_size,
        ", ".join(map(str, previous_key_sizes)),
    )
    nodes = [BackwardNode.from_collected(node) for node in collected_nodes]
    counters["compiled_autograd"]["captures"] += 1
    compile_id = next(frontend.COMPILE_COUNTER)
    graph_module = capture(nodes, num_outputs, num_tensors, related_dims)
    graph_module.meta["capture_reason"] = reason
    for logger, level in ((log, logging.INFO), (verbose_log, logging.DEBUG)):
        logger.log(
            level,
            "Compiled autograd graph %d (python engine, %d autograd nodes), captured "
            "because %s:\n%s",
            compile_id,
            len(nodes),
            reason,
            LazyString(lambda: graph_module.print_readable(print_output=False)),
        )
    with frontend.make_compile_context(compile_id):
        compiled = _installation.compiler_fn(graph_module)
    if not callable(compiled):
        # Refused before it is cached: every later backward of this structure
        # would otherwise fail calling it, whatever compiler_fn is installed then.
        raise TypeError(
            f"compiled autograd's compiler_fn returned {type(compiled).__name__}, not a "
            "callable: it must return what runs the captured GraphModule it is given, "
            "e.g. `lambda gm: torch.compile(gm)` or the GraphModule itself"
        )
    return _CompiledBackward(
        compile_id,
        compiled,
        _installation.symbolic_sizes,
        graph_module,
        related_dims,
        _symbolic_in_compiled_forwards(nodes),
    )


# What both size modes below apply, for a cheaper run of the compiled graph:
# - Inductor asserts each graph input's size and stride when its code runs,
#   about 0.5 us per input on every backward (patches/0007). Dynamo's guards
#   check the same sizes and strides before that code can run, and recompile
#   when they differ.
# - Dynamo's code for a frame brackets the unpacking of its inputs with two
#   profiler-range calls (record_pregraph_bytecode_enter/exit), each behind a
#   disable wrapper that swaps the eval-frame callback four times: a cost on
#   every backward, profiler on or off. Upstream's compiled autograd tests turn
#   them off as well. With the profiler on, captured graphs then show no
#   "Pregraph bytecode" range.
_CHEAPER_RUNS = (
    torch._inductor.config.patch(graph_input_size_asserts=False),
    torch._dynamo.config.patch(record_runtime_overhead=False),
)
# While Dynamo compiles a graph captured with symbolic sizes, it treats its
# sizes as dynamic from the first compile, so that a new batch size or
# sequence length does not make it compile again; and it does not equate
# sizes that merely happen to be equal (a sequence length that equals the head
# size would otherwise compile again once it changes). One patch object each:
# a new ConfigPatch allocates a ContextVar, which lives as long as the thread.
_SYMBOLIC_SIZES = (
    torch._dynamo.config.patch(assume_static_by_default=False),
    torch.fx.experimental._config.patch(use_duck_shape=False),
    *_CHEAPER_RUNS,
)
# Otherwise Dynamo specializes the sizes, and a lifted tensor (a forward input
# or activation) that the user marked dynamic for the forward's sake
# (torch._dynamo.mark_dynamic) would make it raise ConstraintViolationError:
# the size is specialized, and a change recompiles, as for any other size.
_STATIC_SIZES = (
    torch._dynamo.config.patch(allow_ignore_mark_dynamic=True),
    *_CHEAPER_RUNS,
)


class _ConfigWhileCompiling(threading.local):
    """Applies a captured graph's Dynamo configuration (``_SYMBOLIC_SIZES`` or
    ``_STATIC_SIZES``) while Dynamo compiles it -- on its first run, or when a
    guard fails -- from Dynamo's compile-start callback to its compile-end
    callback. Dynamo reads that configuration only while compiling, and
    patching it around every run cost 5-20 us per backward.

    Per thread: the callbacks run in the thread that compiles, which is the
    one running the graph (Dynamo compiles one frame at a time). The graph
    running in the thread, with its inputs and sizes, is also what
    :func:`_applicable_relations` decides from."""

    def __init__(self) -> None:
        # The graph running in this thread, with its inputs and sizes.
        self.running: Optional[tuple[_CompiledBackward, list[Any], list[Any]]] = None
        self.entered: list[Any] = []

    def on_compile_start(self, args: Any) -> None:
        if self.running is None:
            return
        graph, inputs, sizes = self.running
        for patch in _SYMBOLIC_SIZES if graph.symbolic_sizes else _STATIC_SIZES:
            patch.__enter__()
            self.entered.append(patch)
        if not graph.symbolic_sizes and graph.make_dynamic_what_forward_made_dynamic(inputs, sizes):
            # Duck sizing would give a static size equal to the batch size by
            # coincidence the batch's symbol, and the first guard comparing
            # that size with a constant would make the batch size static.
            patch = torch.fx.experimental._config.patch(use_duck_shape=False)
            patch.__enter__()
            self.entered.append(patch)

    def on_compile_end(self, args: Any) -> None:
        while self.entered:
            self.entered.pop().__exit__(None, None, None)

    def register(self) -> None:
        """(Re-)registers the callbacks: torch._dynamo.reset() drops them."""
        handler = torch._dynamo.callback_handler
        if self.on_compile_start not in handler.start_callbacks:
            handler.register_start_callback(self.on_compile_start)
            handler.register_end_callback(self.on_compile_end)


_CONFIG_WHILE_COMPILING = _ConfigWhileCompiling()


class _DynamoCacheHit:
    """Runs a graph compiled by ``torch.compile`` straight from Dynamo's cache
    for the graph's frame, as Dynamo itself does on a cache hit, without going
    through the compiled module's call path.

    Calling an ``OptimizedModule`` passes through ``nn.Module.__call__``
    twice, ``torch.compile``'s wrapper (stance, hooks, dispatch-key and
    functorch state saved and restored) and Dynamo's frame-evaluation
    callback before Dynamo checks its cache entries' guards on the frame's
    locals and runs the matching entry's code: 20-60 us per backward, on
    graphs whose whole backward takes 100-700 us. Here the same guards are
    checked on the same locals, and the matching entry's code runs as a
    function. Only where Dynamo's own call would do nothing more on a hit:

    - the module is ``torch.compile`` of the captured graph itself, with no
      backend context to enter and its cache entries in Dynamo's shared
      bucket (not ``isolate_recompiles``);
    - the default stance with no forced backend, no profiler (which records
      Dynamo's ranges), no global ``nn.Module`` hooks (which would fire on
      the module call);
    - the entry's code has no graph break: its resume functions must run
      through Dynamo's frame evaluation to find their own compiled code.

    Everything else -- a guard failure, which makes Dynamo compile again, and
    the cases above -- goes through the module call (``run`` returns
    ``MISS``). Example::

        >>> import torch
        >>> graph = torch.fx.symbolic_trace(lambda x: x * 2)
        >>> compiled = torch.compile(graph, backend="eager")
        >>> _ = compiled(torch.ones(2))  # compiles
        >>> hit = _DynamoCacheHit.of(compiled, graph)
        >>> hit.run(graph, torch.ones(2))
        tensor([2., 2.])
        >>> hit.run(graph, torch.ones(3)) is _DynamoCacheHit.MISS  # a guard fails
        True
    """

    MISS = object()

    @classmethod
    def of(cls, compiled: Any, graph_module: torch.fx.GraphModule) -> Optional["_DynamoCacheHit"]:
        from torch._dynamo.eval_frame import innermost_backend, OptimizedModule

        if type(compiled) is not OptimizedModule or compiled._orig_mod is not graph_module:
            return None
        context = compiled.dynamo_ctx
        if context._isolate_recompiles_id != -1 or any(
            hook.__name__ == "call_backend_ctx" for hook in context.enter_exit_hooks
        ):
            return None
        function = graph_module.forward.__func__
        code = function.__code__
        if code.co_freevars or code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
            return None
        return cls(function, innermost_backend(context.callback))

    def __init__(self, function: types.FunctionType, backend: Any) -> None:
        self.code = function.__code__
        self.globals = function.__globals__
        self.parameters = self.code.co_varnames[: self.code.co_argcount]
        self.backend = backend
        # id(entry code) -> the code, and a function running it or None for
        # code with graph breaks. Keyed by id: hashing a code object hashes
        # its bytecode and constants, on every lookup.
        self.functions: dict[int, tuple[types.CodeType, Optional[types.FunctionType]]] = {}

    def run(self, *args: Any) -> Any:
        """Runs the compiled graph on ``args`` (the graph's ``forward``
        arguments, ``self`` first) if a cache entry's guards pass, else
        returns ``MISS``. The engine calls it with Dynamo's frame callback off
        (engine.cpp, ``DynamoFrameCallbackOff``), as Dynamo runs a hit: neither
        the guards (some are Python lambdas) nor the entry's code are Dynamo's
        to compile."""
        stance = _dynamo_eval_frame._stance
        if (
            stance.stance != "default"
            or stance.backend is not None
            or torch.autograd._profiler_enabled()
            or torch.nn.modules.module._has_any_global_hook()
        ):
            return self.MISS
        frame_locals = dict(zip(self.parameters, args))
        for entry in _dynamo_eval_frame._debug_get_cache_entry_list(self.code):
            if (
                entry.backend is not self.backend
                or entry.isolate_recompiles_id != -1
                or not entry.guard_manager.root.check(frame_locals)
            ):
                continue
            function = self.function_running(entry.code)
            if function is None:
                return self.MISS
            return function(*args)
        return self.MISS

    def function_running(self, code: types.CodeType) -> Optional[types.FunctionType]:
        known = self.functions.get(id(code))
        if known is None or known[0] is not code:
            if len(self.functions) >= _MAX_CACHED_ENTRY_FUNCTIONS:
                self.functions.clear()  # entries dropped by torch._dynamo.reset()
            has_graph_break = any(name.startswith("__resume_at") for name in code.co_names)
            known = (code, None if has_graph_break else types.FunctionType(code, self.globals))
            self.functions[id(code)] = known
        return known[1]


# Dynamo keeps at most recompile_limit (8) entries per frame; more codes than
# this were left by resets.
_MAX_CACHED_ENTRY_FUNCTIONS = 32


class _CompiledBackward:
    """A compiled graph, run the way the legacy engine runs its graphs: with
    compiled autograd disabled (backwards inside hooks run eagerly) and
    marked as a compiled autograd region for Dynamo and AOTAutograd.

    This runs on every backward, so it sets the frontend's flags itself
    rather than going through ``_disable()``, which also re-routes the legacy
    engine (never installed while this one runs)."""

    def __init__(
        self,
        compile_id: int,
        compiled: Callable[..., Any],
        symbolic_sizes: bool,
        graph_module: torch.fx.GraphModule,
        related_dims: Sequence[tuple[int, int, int, int]],
        symbolic_in_forward: SymbolicInForward,
    ) -> None:
        from torch._dynamo import compiled_autograd as frontend
        from torch._guards import CompileContext, CompileId

        self.frontend = frontend
        self.compile_context = CompileContext(
            CompileId(compiled_autograd_id=compile_id, frame_id=None, frame_compile_id=None)
        )
        self.compiled = compiled
        self.symbolic_sizes = symbolic_sizes
        # Weak: whatever `compiled` Dynamo compiles holds the module itself.
        self.graph_module = weakref.ref(graph_module)
        self.related_dims = tuple(related_dims)
        self.symbolic_in_forward = symbolic_in_forward
        # The lifted tensors' shapes at each Dynamo compile of the graph.
        self.compiled_shapes: list[tuple[Optional[tuple[int, ...]], ...]] = []
        self.cache_hit = _DynamoCacheHit.of(compiled, graph_module)

    def make_dynamic_what_forward_made_dynamic(
        self, inputs: Sequence[Any], sizes: Sequence[Any]
    ) -> bool:
        """Tells Dynamo, before it compiles the graph, which of its inputs
        are dynamic because a compiled region's forward had them as symbols
        (:func:`_dynamic_by_forward`); returns whether any is. With the
        forward compiled for any batch size, the backward is too, from the
        graph's first compile, as on the legacy engine (which lifts every
        size as a symbol).

        Written into Dynamo's automatic-dynamic state for the graph's frame,
        where a size that changed between compiles is recorded, so that
        :meth:`applicable_relations` sees them as dynamic too; without
        recording a change, which would make Dynamo guard the old values out
        of the new compile."""
        from torch._dynamo.pgo import (
            auto_dynamic,
            auto_unset,
            CodeId,
            FrameStateSizeEntry,
            get_code_state,
        )

        graph_module = self.graph_module()
        symbolic = self.symbolic_in_forward
        if graph_module is None or not (symbolic.sizes or symbolic.tensor_dims):
            return False
        dynamic_sizes, dynamic_dims = _dynamic_by_forward(
            symbolic, self.related_dims, inputs, sizes
        )
        seen = get_code_state()[CodeId.make(graph_module.forward.__code__)].automatic_dynamic

        def mark(name: str, entry: Any) -> None:
            recorded = seen[name]
            excluded = recorded.excluded_sizes, recorded.excluded_scalar
            recorded |= entry
            recorded.excluded_sizes, recorded.excluded_scalar = excluded

        for index in dynamic_sizes:
            mark(
                f"L['sizes'][{index}]",
                FrameStateSizeEntry(scalar=auto_dynamic, size=auto_dynamic, stride=auto_dynamic),
            )
        for index, dims in dynamic_dims.items():
            rank = inputs[index].dim()
            mark(
                f"L['inputs'][{index}]",
                FrameStateSizeEntry.make_size(
                    tuple(auto_dynamic if d in dims else auto_unset for d in range(rank))
                ),
            )
        return True

    def applicable_relations(
        self, inputs: Sequence[Any], sizes: Sequence[Any]
    ) -> tuple[Optional[tuple[bool, ...]], tuple[tuple[tuple[int, int], tuple[int, int]], ...]]:
        """For each of ``related_dims``, whether the Dynamo compile about to
        start applies it: only where the size and the dims it was found equal
        to will both be dynamic, or both static (None: all of them). And the
        pairs of lifted tensors' dims, as ``(tensor index, dim)``, that the
        compile compares: dims that will be dynamic and have been equal at
        every compile of the graph, each paired with the first of its group.

        Dynamo makes an input dynamic when its automatic-dynamic state for
        the graph's frame says so -- because a compile before, in this
        process or, with ``torch.compiler.config.job_id`` set, in an earlier
        run of the program (profile-guided), saw it change -- or when it
        differs from the value that state recorded. A relation between a
        dynamic and a static side holds by coincidence at this shape only,
        and applying it would guard the dynamic side to a constant: in a
        restarted program whose first compile is dynamic from the profile,
        the next shape would compile again. Inside Dynamo's trace a dynamic
        size looks like an int, so this is decided here, before it traces.

        Equal values at one shape can be a coincidence too (batch x heads
        equal to the sequence length); equal at every shape compiled so far
        they rarely are, and a pair that stops being equal fails its guard
        and compiles again without it."""
        from torch._dynamo.pgo import auto_dynamic, auto_unset, CodeId, get_code_state

        graph_module = self.graph_module()
        if graph_module is None or not self.related_dims:
            return None, ()
        self.compiled_shapes.append(
            tuple(tuple(t.shape) if isinstance(t, torch.Tensor) else None for t in inputs)
        )
        state = get_code_state().get(CodeId.make(graph_module.forward.__code__))
        if state is None:
            return None, ()
        seen = state.automatic_dynamic

        def changes(recorded: Any, value: int) -> bool:
            return recorded is auto_dynamic or (
                recorded is not auto_unset and recorded != value
            )

        def size_is_dynamic(index: int) -> bool:
            entry = seen.get(f"L['sizes'][{index}]")
            return entry is not None and changes(entry.scalar, sizes[index])

        def dims_are_dynamic(tensor_index: int, begin: int, end: int) -> bool:
            entry = seen.get(f"L['inputs'][{tensor_index}]")
            tensor = inputs[tensor_index]
            if entry is None or not isinstance(tensor, torch.Tensor) or entry.size is auto_unset:
                return False
            if entry.size is auto_dynamic or len(entry.size) != tensor.dim():
                return True
            return any(changes(entry.size[d], tensor.size(d)) for d in range(begin, end))

        applicable = tuple(
            size_is_dynamic(size_index) == dims_are_dynamic(tensor_index, begin, end)
            for size_index, tensor_index, begin, end in self.related_dims
        )
        first_of_group: dict[tuple[int, ...], tuple[int, int]] = {}
        equal_dims = []
        for tensor_index in range(len(inputs)):
            shapes = [compiled[tensor_index] for compiled in self.compiled_shapes]
            if any(shape is None or len(shape) != len(shapes[-1]) for shape in shapes):
                continue
            for dim in range(len(shapes[-1])):
                values = tuple(shape[dim] for shape in shapes)
                if values[-1] <= 1 or not dims_are_dynamic(tensor_index, dim, dim + 1):
                    continue
                first = first_of_group.setdefault(values, (tensor_index, dim))
                if first != (tensor_index, dim):
                    equal_dims.append(((tensor_index, dim), first))
        return applicable, tuple(equal_dims)

    def __call__(self, inputs: list[torch.Tensor], *other_inputs: list[Any]) -> Any:
        _RUNNING.enter(self.frontend)
        try:
            if self.cache_hit is not None:
                result = self.cache_hit.run(self.graph_module(), inputs, *other_inputs)
                if result is not _DynamoCacheHit.MISS:
                    return result
            return self.call_compiled(inputs, other_inputs)
        finally:
            _RUNNING.exit(self.frontend)
            # Backends that do not steal the list leave it full, and Dynamo
            # keeps the list of its first call as an example value: the
            # lifted tensors must not outlive the backward.
            inputs.clear()

    def call_compiled(self, inputs: list[torch.Tensor], other_inputs: tuple[list[Any], ...]) -> Any:
        """Calls what ``compiler_fn`` returned, with what Dynamo reads if
        that call compiles: the graph's configuration and size relations
        (``_CONFIG_WHILE_COMPILING``) and its compile id. A cache hit in
        :class:`_DynamoCacheHit` compiles nothing and needs neither, as
        Dynamo's own hits run without a compile context. A graph Dynamo
        fails to trace before running any of it runs without Dynamo: if that
        run succeeds, from then on (:meth:`run_without_dynamo`); if it raises
        too, the error is the backward's own, as eager raises it, and the
        graph stays compiled."""
        config = _CONFIG_WHILE_COMPILING
        config.register()
        prior_running, config.running = config.running, (self, inputs, other_inputs[0])
        num_inputs = len(inputs)
        try:
            with torch._guards.compile_context(self.compile_context):
                return self.compiled(inputs, *other_inputs)
        except torch._dynamo.exc.TorchRuntimeError as error:
            if not self.failed_before_running(error, inputs, num_inputs):
                raise
            untraceable = error
        finally:
            config.running = prior_running
        result = self.graph_module()(inputs, *other_inputs)
        self.run_without_dynamo(untraceable)
        return result

    def failed_before_running(
        self, error: Exception, inputs: list[torch.Tensor], num_inputs: int
    ) -> bool:
        """Whether Dynamo raised ``error`` while compiling the graph's own
        frame -- which it does before running any of it -- rather than a
        resume function after a graph break, when part of the graph (a hook's
        side effects, an accumulation) has run already. The input list is
        still full then too: Dynamo's code empties it when it starts."""
        graph_module = self.graph_module()
        stack = getattr(error, "real_stack", None)
        return (
            graph_module is not None
            and len(inputs) == num_inputs
            and bool(stack)
            and stack[0].name == "forward"
            and stack[0].filename == graph_module.forward.__code__.co_filename
        )

    def run_without_dynamo(self, error: Exception) -> None:
        """From now on runs the captured graph itself, op by op, instead of
        what ``compiler_fn`` made of it: Dynamo failed to trace it and the
        graph then ran without it. Typically a node's backward formula that
        libtorch implements with int-only code (``linalg_lstsq_backward``
        calls ``numel()``) once sizes are symbolic."""
        counters["compiled_autograd"]["graphs_run_without_dynamo"] += 1
        # Dynamo's message names the failing call, then "got <error>('...')".
        failure = re.search(r"got (\w+)\('(.*?)(?:\\n|'\))", str(error))
        reason = (
            f"{failure.group(1)}: {failure.group(2)}"
            if failure
            else str(error).strip().splitlines()[0]
        )
        warnings.warn(
            "Compiled autograd (python engine): Dynamo could not compile a captured "
            f"backward graph ({reason}); that graph runs without compiler_fn from now "
            "on. Gradients are correct but not compiled.",
            stacklevel=2,
        )
        self.compiled = self.graph_module()
        self.cache_hit = None


class _RunningGraphs:
    """While any captured graph runs, in any thread, compiled autograd is off
    and the frontend's flags say so; the last one to finish restores them.
    (Saving and restoring per call would let two threads restore each
    other's state.)

    A process forked while other threads run graphs has only the forking
    thread, so graphs are also counted per thread and the child keeps that
    thread's alone: counting the others' it would never compile a backward
    again. A fork waits for the lock, which the child would otherwise
    inherit held forever."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.this_thread = threading.local()
        self.prior_flags: tuple[bool, bool, bool] = (False, False, False)
        os.register_at_fork(
            before=lambda: self.lock.acquire(),
            after_in_parent=lambda: self.lock.release(),
            after_in_child=self.after_fork_in_child,
        )

    def enter(self, frontend: Any) -> None:
        with self.lock:
            if self.count == 0:
                self.prior_flags = (
                    frontend.compiled_autograd_enabled,
                    frontend.active_disable_ctx,
                    frontend.in_compiled_autograd_region,
                )
                frontend.compiled_autograd_enabled = False
                frontend.active_disable_ctx = True
                frontend.in_compiled_autograd_region = True
                _install_engine_entry(None)
            self.count += 1
            self.this_thread.count = getattr(self.this_thread, "count", 0) + 1

    def exit(self, frontend: Any) -> None:
        with self.lock:
            self.count -= 1
            self.this_thread.count -= 1
            if self.count == 0:
                self.restore(frontend)

    def restore(self, frontend: Any) -> None:
        _install_engine_entry(_installation)
        (
            frontend.compiled_autograd_enabled,
            frontend.active_disable_ctx,
            frontend.in_compiled_autograd_region,
        ) = self.prior_flags

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        own = getattr(self.this_thread, "count", 0)
        others_were_running = self.count > own
        self.count = own
        if others_were_running and own == 0:
            from torch._dynamo import compiled_autograd as frontend

            self.restore(frontend)


_RUNNING = _RunningGraphs()


_reported_fallbacks: set[str] = set()


def _captures_allowed_per_graph() -> int:
    """Called from C++ on a cache miss of a graph whose nodes were captured
    before: how many graphs of the same nodes may be captured. Dynamo's bound
    on the recompiles of one frame serves here too."""
    return torch._dynamo.config.recompile_limit


def _report_eager_fallback(reason: str, warn: bool) -> None:
    """Called from C++ when a backward runs on the eager engine instead."""
    counters["compiled_autograd"]["eager_fallbacks"] += 1
    verbose_log.debug("backward runs on the eager engine: %s", reason)
    if warn and reason not in _reported_fallbacks:
        _reported_fallbacks.add(reason)
        # No word of the legacy engine: it raises or crashes on these
        # backwards, except under anomaly mode and TorchDispatchModes, where it
        # loses the failing node's name or does not compile either.
        warnings.warn(
            "Compiled autograd (python engine) ran this backward with eager "
            f"autograd: {reason.rstrip('. ')}. Gradients are correct but not compiled.",
            stacklevel=2,
        )
