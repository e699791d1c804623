"""Inductor's index simplification with loops over symbolic sizes
(patches/0004): once Dynamo makes a size dynamic, a loop over it still lets
Inductor drop the `%` and `//` that a numeric loop size lets it drop, and a
simplified index still addresses the same element at every point. An index over
Inductor's own symbols inside Max(0, ...) compiles (patches/0011).

Gradients of the graphs this matters for (Inductor after dynamic recompiles)
are compared with eager in test_models.py."""

import itertools

import pytest
import sympy
import torch
from hypothesis import given, strategies as st
from torch._dynamo.source import ConstantSource
from torch._inductor.sizevars import SizeVarAllocator
from torch._inductor.utils import sympy_index_symbol
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy.functions import FloorDiv, ModularIndexing

from helpers import check_against_eager, dynamo_compiler

X0, X1, X2 = (sympy_index_symbol(f"x{i}") for i in range(3))


def simplifier_with_two_sizes():
    """Inductor's simplifier over a shape env with two size symbols, each
    known to be at least 2, as Dynamo's are."""
    env = ShapeEnv()
    s0 = env.create_symbol(8, source=ConstantSource("s0"))
    s1 = env.create_symbol(6, source=ConstantSource("s1"))
    return SizeVarAllocator(env), s0, s1


@pytest.fixture
def sizevars():
    return simplifier_with_two_sizes()


def in_projection_gradient_index(seq):
    """The load index of the fused kernel that sums the stacked q/k/v
    gradients of a 64-wide, 4-head attention into its in-projection's bias
    gradient, over `seq` (x1) and 64 (x2), for 192 outputs (x0)."""
    within_head = ModularIndexing(X0, 1, 64)
    head_row = ModularIndexing(64 * X1 + within_head, 16, 4 * seq)
    return (
        16 * ModularIndexing(head_row, 1, 4)
        + 64 * ModularIndexing(64 * X1 + 64 * seq * X2 + within_head, 64 * seq, 64)
        + 4096 * ModularIndexing(FloorDiv(head_row, 4), 1, seq)
        + ModularIndexing(within_head, 1, 16)
    )


def test_a_loop_over_a_symbolic_size_simplifies_as_over_a_number(sizevars):
    simplifier, s0, _ = sizevars
    symbolic = simplifier.simplify_with_ranges(
        in_projection_gradient_index(s0), {X0: 192, X1: s0, X2: 64}
    )
    numeric = simplifier.simplify_with_ranges(
        in_projection_gradient_index(8), {X0: 192, X1: 8, X2: 64}
    )
    assert symbolic == numeric
    assert not symbolic.has(FloorDiv) and s0 not in symbolic.free_symbols


def test_a_bound_that_does_not_hold_keeps_the_modulus(sizevars):
    simplifier, s0, _ = sizevars
    # x1 + 1 reaches s0: the `% s0` matters there.
    index = ModularIndexing(64 * X1 + 64 + ModularIndexing(X0, 1, 64), 64, s0)
    simplified = simplifier.simplify_with_ranges(index, {X0: 64, X1: s0})
    assert simplified == ModularIndexing(X1 + 1, 1, s0)


def test_an_index_with_bounds_the_shape_env_cannot_evaluate_compiles_as_it_is():
    # With every size symbolic, a kernel of LocalResponseNorm's backward
    # indexes with Inductor's own symbols (ps*, q*) inside Max(0, q - ps);
    # ShapeEnv.simplify, proving q - ps >= 0 with its own ranges, which lack
    # those symbols, raised AssertionError ("vr must not be None") and
    # Inductor failed the compile.
    def gradient():
        x = torch.randn(1, 5, 7, 7, 7, requires_grad=True)
        y = torch.nn.LocalResponseNorm(1, alpha=1.0, beta=0.5, k=2.0)(x)
        (grad,) = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum(), x)
        return [grad]

    torch._dynamo.config.compiled_autograd_symbolic_sizes = True
    check_against_eager(gradient, dynamo_compiler("inductor"), exact=False)


# Random indices: loops nested in row-major order over sizes that are numbers
# or size symbols, their flat index (sometimes shifted, so that bounds fail or
# the base goes negative), then `%` and `//` by products of the sizes or by
# unrelated values.
SIZE_CHOICES = ["2", "3", "4", "s0", "s1", "2*s0", "s0*s1"]
DIVISOR_CHOICES = ["1", "2", "4", "s0", "s1", "4*s0", "s0 + 1"]


@st.composite
def indices(draw):
    num_loops = draw(st.integers(1, 3))
    sizes = [draw(st.sampled_from(SIZE_CHOICES)) for _ in range(num_loops)]
    loop_vars = [X0, X1, X2][:num_loops]
    strides = ["1"]
    for size in reversed(sizes[1:]):
        strides.insert(0, f"({strides[0]})*({size})")
    offset = draw(st.sampled_from(["0", "0", "1", "-1", "s0"]))
    flat = " + ".join(f"({stride})*{var}" for stride, var in zip(strides, loop_vars))
    flat = f"{flat} + ({offset})"
    products = [
        "*".join(f"({size})" for size in sizes[i:j])
        for i in range(num_loops)
        for j in range(i + 1, num_loops + 1)
    ]
    divisor = draw(st.sampled_from(products + DIVISOR_CHOICES))
    modulus = draw(st.sampled_from(products + DIVISOR_CHOICES))
    inner_divisor = draw(st.sampled_from(["1", "2"] + products))
    form = draw(st.sampled_from(["mod", "div", "div_of_mod", "mod_of_div", "sum"]))
    return sizes, form, flat, divisor, modulus, inner_divisor


def build(sizes, form, flat, divisor, modulus, inner_divisor, s0, s1):
    def parse(text):
        return sympy.sympify(
            text, locals={"s0": s0, "s1": s1, "x0": X0, "x1": X1, "x2": X2}
        )

    base = parse(flat)
    d, m, inner = parse(divisor), parse(modulus), parse(inner_divisor)
    if form == "mod":
        index = ModularIndexing(base, d, m)
    elif form == "div":
        index = FloorDiv(base, d)
    elif form == "div_of_mod":
        index = FloorDiv(ModularIndexing(base, inner, m), d)
    elif form == "mod_of_div":
        index = ModularIndexing(FloorDiv(base, inner), d, m)
    else:
        index = ModularIndexing(base, 1, m) + 7 * FloorDiv(base, d)
    loop_sizes = {var: parse(size) for var, size in zip([X0, X1, X2], sizes)}
    return index, loop_sizes


def evaluate(expr, values):
    def visit(e):
        if isinstance(e, ModularIndexing):
            base, divisor, modulus = (visit(a) for a in e.args)
            return (base // divisor) % modulus
        if isinstance(e, FloorDiv):
            base, divisor = (visit(a) for a in e.args)
            return base // divisor
        if e.is_Symbol:
            return values[e]
        if e.is_Integer:
            return int(e)
        if e.is_Add:
            return sum(visit(a) for a in e.args)
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            return visit(e.base) ** int(e.exp)
        if e.is_Mul:
            result = 1
            for a in e.args:
                result *= visit(a)
            return result
        raise AssertionError(f"unexpected term in an index: {e!r}")

    return visit(expr)


@given(indices())
def test_a_simplified_index_addresses_the_same_element_everywhere(example):
    # A fresh shape env per example: hypothesis reruns examples, and a
    # function-scoped fixture would be shared between them.
    simplifier, s0, s1 = simplifier_with_two_sizes()
    index, loop_sizes = build(*example, s0, s1)
    simplified = simplifier.simplify_with_ranges(index, loop_sizes)
    for s0_value, s1_value in [(2, 2), (2, 3), (3, 2), (5, 3)]:
        values = {s0: s0_value, s1: s1_value}
        ranges = [range(evaluate(size, values)) for size in loop_sizes.values()]
        for point in itertools.product(*ranges):
            values.update(zip(loop_sizes, point))
            assert evaluate(simplified, values) == evaluate(index, values), (
                f"{index} simplified to {simplified} differs at {values}"
            )
