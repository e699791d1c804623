"""Property test: random autograd graphs (elementwise, reductions, views,
matmul, indexing, in-place ops, tensors used several times, random hooks,
some of which remove other hooks while the backward runs) give eager's
gradients and hook calls: bit for bit without Dynamo, within
assert_close through Dynamo with aot_eager and with Inductor.

`make test` runs 200 examples without Dynamo and 10 per Dynamo backend, `make fuzz`
2,000 and 100 (PCA_HYPOTHESIS_PROFILE)."""

import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from helpers import COMPILERS, compiled_autograd, eager_fallbacks

SHAPE = (3, 4)

# Each op takes operands from the pool of values (all of shape SHAPE) and
# appends one result of shape SHAPE.
UNARY = {
    "sin": torch.sin,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "exp_small": lambda a: (a * 0.1).exp(),
    "scale": lambda a: a * 1.5,
    "square": lambda a: a * a,
    "transpose_back": lambda a: a.t().contiguous().t(),
    "reshape": lambda a: a.reshape(2, 6).reshape(SHAPE),
    "row_sum": lambda a: a.sum(1, keepdim=True).expand(SHAPE),
    "col_mean": lambda a: a.mean(0, keepdim=True).expand(SHAPE),
    "index": lambda a: a[torch.tensor([2, 0, 1])],
    "slice_cat": lambda a: torch.cat([a[:, 2:], a[:, :2]], 1),
    "inplace_mul": lambda a: a.clone().mul_(2.0),
    "inplace_on_view": lambda a: _inplace_on_view(a),
}
BINARY = {
    "add": torch.add,
    "mul": torch.mul,
    "matmul": lambda a, b: a @ b.t() @ torch.ones(3, 4),
    "where": lambda a, b: torch.where(a > 0, a, b),
}


def _inplace_on_view(a):
    b = a.clone()
    b[:, 1] *= 3
    return b


@st.composite
def programs(draw):
    num_leaves = draw(st.integers(1, 3))
    ops = []
    for _ in range(draw(st.integers(1, 8))):
        pool = num_leaves + len(ops)
        if draw(st.booleans()):
            name = draw(st.sampled_from(sorted(UNARY)))
            args = (draw(st.integers(0, pool - 1)),)
        else:
            name = draw(st.sampled_from(sorted(BINARY)))
            args = (draw(st.integers(0, pool - 1)), draw(st.integers(0, pool - 1)))
        hook = draw(st.sampled_from([None, "record", "scale", "record_and_scale", "record_and_remove"]))
        if hook == "record_and_remove":
            # Removes the hook of that op, if it has one (its own included).
            hook = (hook, draw(st.integers(0, 7)))
        ops.append((name, args, hook))
    seed = draw(st.integers(0, 2**16))
    outputs = draw(st.lists(st.integers(0, num_leaves + len(ops) - 1), min_size=1, max_size=3))
    return num_leaves, ops, seed, outputs


def run_program(program):
    """Builds the graph, runs backward, returns leaf grads and hook log."""
    num_leaves, ops, seed, outputs = program
    generator = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(SHAPE, generator=generator).requires_grad_() for _ in range(num_leaves)]
    values = list(leaves)
    log = []
    handles = {}
    for i, (name, args, hook) in enumerate(ops):
        fn = UNARY.get(name) or BINARY[name]
        value = fn(*(values[a] for a in args))
        if hook is not None:
            handles[i] = value.register_hook(_hook(hook, i, log, handles))
        values.append(value)
    loss = sum(values[o].sum() for o in outputs)
    if loss.requires_grad:
        loss.backward()
    grads = [leaf.grad for leaf in leaves]
    return grads, log


def _hook(kind, index, log, handles):
    kind, removed = kind if isinstance(kind, tuple) else (kind, None)

    def hook(grad):
        if "record" in kind:
            log.append((index, grad.clone()))
        if removed in handles:
            handles[removed].remove()
        return grad * 0.5 if "scale" in kind else None

    return hook


@given(programs())
def test_random_graph_matches_eager(program):
    # The cache is kept across examples, so that an example may run a graph
    # captured for another with other hooks. Programs of the same ops share
    # node names: more than recompile_limit of them (8) would run eagerly.
    expected_grads, expected_log = run_program(program)
    with torch._dynamo.config.patch(recompile_limit=10**6), compiled_autograd(COMPILERS["no_dynamo"]):
        grads, log = run_program(program)
    assert eager_fallbacks() == 0
    for e, a in zip(expected_grads, grads):
        assert (e is None) == (a is None)
        if e is not None:
            assert torch.equal(e, a)
    assert [i for i, _ in log] == [i for i, _ in expected_log]
    for (_, e), (_, a) in zip(expected_log, log):
        assert torch.equal(e, a)


# Dynamo and AOTAutograd compile each new graph (a second or so; Inductor a
# few), so fewer examples; AOTAutograd's decompositions and Inductor's fusions
# may reorder floating-point math.
DYNAMO_EXAMPLES = 100 if os.environ.get("PCA_HYPOTHESIS_PROFILE") == "fuzz" else 10


@pytest.mark.parametrize("compiler_name", ["aot_eager", "inductor"])
@settings(max_examples=DYNAMO_EXAMPLES)
@given(program=programs())
def test_random_graph_through_dynamo_matches_eager_compiled_and_from_the_cache(compiler_name, program):
    """The first run compiles; the second finds the compiled graph in
    Dynamo's cache (the engine's cache-hit path), hooks' side effects
    included."""
    torch._dynamo.reset()
    expected_grads, expected_log = run_program(program)
    with compiled_autograd(COMPILERS[compiler_name]):
        runs = [run_program(program) for _ in range(2)]
    assert eager_fallbacks() == 0
    for grads, log in runs:
        for e, a in zip(expected_grads, grads):
            assert (e is None) == (a is None)
            if e is not None:
                torch.testing.assert_close(a, e)
        assert [i for i, _ in log] == [i for i, _ in expected_log]
        for (_, e), (_, a) in zip(expected_log, log):
            torch.testing.assert_close(a, e)
