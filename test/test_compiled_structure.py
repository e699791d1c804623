"""Structural properties of what the engine hands to the compiler: one
capture and one Dynamo compile across batch sizes and sequence lengths, and a
captured graph at most three times the size of the autograd graph. (Speed itself is
measured by `make bench`, never asserted.)"""

import collections
import contextlib
import json
import operator
import os
import pathlib
import subprocess
import sys
import warnings
from unittest import mock

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._inductor.graph import GraphLowering
from torch._inductor.utils import fresh_cache

from helpers import captures, compiled_autograd, CountingCompiler
from models import transformer_encoder, transformer_input


def autograd_node_count(tensor):
    seen, stack = set(), [tensor.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(next_fn for next_fn, _ in fn.next_functions)
    return len(seen)


def assert_grads_equal_eager(model, x, compiler):
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with compiled_autograd(compiler):
        model(x).sum().backward()
    for e, p in zip(expected, model.parameters()):
        assert torch.equal(e, p.grad)


def test_symbolic_sizes_new_shapes_neither_capture_nor_compile_again():
    torch._dynamo.config.compiled_autograd_symbolic_sizes = True
    torch.manual_seed(0)
    model = transformer_encoder()
    compiler = CountingCompiler()
    for batch, seq in [(4, 8), (5, 8), (6, 8), (8, 8), (8, 12), (8, 16)]:
        assert_grads_equal_eager(model, transformer_input(batch, seq), compiler)
    assert captures() == 1
    assert compiler.dynamo_compiles == 1


def test_captured_graph_is_at_most_three_times_the_autograd_graph():
    torch.manual_seed(0)
    model = transformer_encoder(layers=4, d_model=64)
    loss = model(transformer_input(4, seq=16, d_model=64)).sum()
    num_autograd_nodes = autograd_node_count(loss)
    compiler = CountingCompiler()
    with compiled_autograd(lambda gm: compiler.captured.append(gm) or gm):
        loss.backward()
    (captured,) = compiler.captured
    assert len(captured.graph.nodes) <= 3 * num_autograd_nodes


def test_by_default_new_shapes_do_not_capture_and_dynamo_generalizes_once_per_dimension():
    torch.manual_seed(0)
    model = transformer_encoder()
    compiler = CountingCompiler()
    compiles = []
    for batch, seq in [(4, 8), (4, 8), (5, 8), (6, 8), (6, 12), (7, 16)]:
        model.zero_grad(set_to_none=True)
        with compiled_autograd(compiler):
            model(transformer_input(batch, seq)).sum().backward()
        compiles.append(compiler.dynamo_compiles)
    assert captures() == 1
    # Static first compile; automatic dynamic shapes make the batch size
    # symbolic when it first changes, then the sequence length.
    assert compiles == [1, 1, 2, 2, 3, 3]


def shape_symbols(value):
    if not isinstance(value, torch.Tensor):
        return set()
    return {
        symbol
        for size in value.shape
        if isinstance(size, torch.SymInt)
        for symbol in size.node.expr.free_symbols
    }


def is_graph_input(node):
    """A placeholder, or an element of one (the lifted tensors are a list)."""
    return node.op == "placeholder" or (
        node.target is operator.getitem and node.args[0].op == "placeholder"
    )


class ShapeCheckingCompiler(CountingCompiler):
    """Also records, per Dynamo graph, the size symbols that shapes in it use
    but no input tensor's dims are: lifted sizes that Dynamo knows no
    relation of, which Inductor must index with div/mod arithmetic. And the
    symbols of the input tensors' dims, by the value each dim has."""

    def __init__(self):
        super().__init__()
        self.unrelated_symbols = []
        self.input_symbols_by_value = []

    def backend(self, graph_module, example_inputs):
        input_symbols, other_symbols = set(), set()
        by_value = collections.defaultdict(set)
        for node in graph_module.graph.nodes:
            value = node.meta.get("example_value")
            symbols = shape_symbols(value)
            (input_symbols if is_graph_input(node) else other_symbols).update(symbols)
            if is_graph_input(node) and symbols:
                for size in value.shape:
                    if isinstance(size, torch.SymInt):
                        by_value[size.node.hint].add(size.node.expr)
        self.unrelated_symbols.append(other_symbols - input_symbols)
        self.input_symbols_by_value.append(dict(by_value))
        return super().backend(graph_module, example_inputs)


def test_once_sizes_are_dynamic_shapes_are_expressions_in_one_symbol_per_changed_dim():
    torch.manual_seed(0)
    model = transformer_encoder()
    compiler = ShapeCheckingCompiler()
    for batch, seq in [(4, 10), (5, 10), (5, 14)]:
        assert_grads_equal_eager(model, transformer_input(batch, seq), compiler)
    assert compiler.dynamo_compiles == 3
    # The recompiles made the batch size, then the sequence length, dynamic;
    # the views and expands of the backward still only use the input
    # tensors' dims.
    assert compiler.unrelated_symbols == [set(), set(), set()]
    # Each lifted tensor's changed dim is a symbol of its own until the graph
    # compares the dims equal at every compile: then all batch dims are one
    # symbol, and all sequence dims another. A view between shapes spelled
    # with two symbols for one size would leave Inductor an equality of
    # products it cannot simplify.
    last = compiler.input_symbols_by_value[-1]
    assert len(last[5]) == 1 and len(last[14]) == 1


def test_sizes_equal_by_coincidence_give_eagers_gradients_when_they_part():
    # The head size is 8 (d_model 32, 4 heads), the sequence length starts at
    # 8: sizes that are the sequence length also equal dims that are the head
    # size, until the sequence length changes, and again when it returns.
    torch.manual_seed(0)
    model = transformer_encoder()
    compiler = ShapeCheckingCompiler()
    for batch, seq in [(4, 8), (5, 8), (5, 12), (5, 8), (4, 8), (6, 16)]:
        assert_grads_equal_eager(model, transformer_input(batch, seq), compiler)
    assert captures() == 1
    assert all(symbols == set() for symbols in compiler.unrelated_symbols)


# A program that trains test/models.py's mlp over changing batch sizes,
# compiling its backward with profile-guided dynamic shapes on: Dynamo saves
# which inputs of each compiled frame turned out dynamic and a restarted
# program compiles them dynamic from its first compile. Prints the Dynamo
# compiles per batch size; every gradient must equal eager's bit for bit
# (backend="eager" runs the same kernels).
RESTARTED_PROGRAM = """
import json, sys
import torch
from torch._dynamo.utils import counters
sys.path.insert(0, {test_dir!r})
from models import mlp, mlp_input

torch.compiler.config.job_id = "python-compiled-autograd-test"
if sys.argv[1] == "restarted":
    # One more GraphModule made first: fx numbers generated code in creation
    # order, and a restart with Inductor's caches warm makes fewer.
    torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
torch.manual_seed(0)
model = mlp()
compiles = []
for batch in (8, 4, 5, 6, 7, 8):
    x = mlp_input(batch)
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    eager = [p.grad for p in model.parameters()]
    before = counters["stats"]["unique_graphs"]
    model.zero_grad(set_to_none=True)
    with torch._dynamo.compiled_autograd._enable(
        lambda gm: torch.compile(gm, backend="eager")
    ):
        model(x).square().mean().backward()
    compiles.append(counters["stats"]["unique_graphs"] - before)
    for param, expected in zip(model.parameters(), eager):
        assert torch.equal(param.grad, expected)
print(json.dumps(compiles))
"""


def test_a_restarted_program_compiles_once_over_batch_sizes_it_saw_change(tmp_path):
    # The mean's backward lifts the output's element count, batch x 4, which
    # at batch 8 equals the hidden width, 32: related to the hidden width by
    # value, it would turn static again in the restarted program, whose next
    # batch size would then compile once more.
    program = RESTARTED_PROGRAM.format(test_dir=str(pathlib.Path(__file__).parent))
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", program, run], env=env, check=True,
                capture_output=True, text=True,
            ).stdout
        )
        for run in ("first", "restarted")
    ]
    assert runs == [[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]]


def test_symbolic_and_default_installations_do_not_share_compiled_graphs():
    model = torch.nn.Linear(4, 2)
    for symbolic in (True, False, True, False):
        torch._dynamo.config.compiled_autograd_symbolic_sizes = symbolic
        with compiled_autograd(CountingCompiler()):
            model(torch.randn(3, 4)).sum().backward()
    assert captures() == 2


def test_forward_inputs_marked_dynamic_compile_under_both_size_modes():
    @torch.compile(backend="aot_eager")
    def region(x):
        return x.sin().sin()

    for symbolic in (False, True):
        torch._dynamo.reset()
        torch._dynamo.config.compiled_autograd_symbolic_sizes = symbolic
        with compiled_autograd(torch.compile(backend="aot_eager")):
            for batch in (2, 4):
                x = torch.randn(batch, 3, requires_grad=True)
                torch._dynamo.mark_dynamic(x, 0)
                region(x).sum().backward()
                torch.testing.assert_close(x.grad, (x.sin().cos() * x.cos()).detach())


def grads_of_a_compiled_forward(model, compiled_model, x, compiler):
    """Parameter gradients of ``compiled_model(x)``'s loss, computed eagerly
    after the compiled region, under compiled autograd; and eager's of
    ``model(x)``."""
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    with compiled_autograd(compiler):
        compiled_model(x).square().mean().backward()
    return expected, [p.grad for p in model.parameters()]


@pytest.mark.parametrize("forward_backend", ["aot_eager", "inductor"])
def test_a_backward_through_a_region_compiled_for_every_batch_size_compiles_once(
    forward_backend,
):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    compiled_model = torch.compile(model, backend=forward_backend, dynamic=True)
    compiler = CountingCompiler()
    with fresh_cache():
        for batch in (3, 5, 6, 7):
            expected, actual = grads_of_a_compiled_forward(
                model, compiled_model, torch.randn(batch, 16), compiler
            )
            for e, a in zip(expected, actual):
                torch.testing.assert_close(a, e)
    assert captures() == 1
    # The region's symbolic sizes: its symints and saved activations' batch
    # dims, and by value its forward's input and output shapes and the
    # eagerly computed loss's sizes after it.
    assert compiler.dynamo_compiles == 1


def test_a_backward_through_a_region_compiles_again_only_when_its_forward_does():
    # Sizes chosen so that no batch size, sequence length or product of them
    # equals a constant size of the layer: the graph outside the region
    # relates sizes to the region's symbols by value.
    torch.manual_seed(0)
    model = transformer_encoder(layers=1, d_model=40)
    compiled_model = torch.compile(model, backend="inductor")
    compiler = CountingCompiler()
    compiles = []
    with fresh_cache():
        for batch, seq in [(6, 22), (7, 22), (9, 22), (6, 15), (6, 13)]:
            x = transformer_input(batch, seq, d_model=40)
            expected, actual = grads_of_a_compiled_forward(model, compiled_model, x, compiler)
            for e, a in zip(expected, actual):
                torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
            compiles.append((captures(), compiler.dynamo_compiles))
    # The forward compiles static, then dynamic in the batch size, then in the
    # sequence length too: each new region is a new capture, compiled once.
    assert compiles == [(1, 1), (2, 2), (2, 2), (3, 3), (3, 3)]
    # Inlined, not run as itself: its backward graph (which torch.fx cannot
    # trace back from its code, for nn.MultiheadAttention's aten.full of
    # symbolic sizes) came from the live module (patches/0019).
    assert all("apply_eagerly" not in graph.code for graph in compiler.captured)


def test_aot_autograds_serialized_backward_keeps_which_dims_are_symbols():
    from torch._functorch._aot_autograd.aot_autograd_result import serialize_graph_module
    from torch.fx.experimental.proxy_tensor import make_fx

    def full_of_the_batch_size(x):
        return torch.full([2, x.shape[0]], 3.0) * x

    graph = make_fx(full_of_the_batch_size, tracing_mode="symbolic")(torch.randn(4))
    serialized = serialize_graph_module(graph)
    x = torch.randn(5)
    restored = serialized.deserialize()
    torch.testing.assert_close(restored(x), 3.0 * x.expand(2, 5))
    assert restored.meta["placeholder_symbolic_dims"] == ((0,),)
    # In another process (the module is not pickled) only the code is there,
    # and torch.fx cannot trace an aten call whose size list holds a
    # symbolic size back from it.
    assert "live_module" not in serialized.__getstate__()
    serialized.live_module = None
    with pytest.raises(RuntimeError, match="full"):
        serialized.deserialize()


class InductorCountingCompiler(CountingCompiler):
    """torch.compile with Inductor that counts Dynamo's graph compiles."""

    def backend(self, graph_module, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.dynamo_compiles += 1
        return compile_fx(graph_module, example_inputs)


def test_inductor_sums_across_its_chunk_size_share_one_compile():
    # Inductor's C++ kernels sum more than 4,096 float elements in chunks,
    # for precision. The weight's gradient sums batch * 1024 elements: 4,096
    # at batch 4, 5,120 at batch 5. Choosing the chunked sum must not guard
    # on the symbolic batch size (patches/0006). Small integers make every
    # summation order exact, so the gradients must equal eager's bit for bit.
    torch._dynamo.config.compiled_autograd_symbolic_sizes = True
    torch.manual_seed(0)
    weight = torch.randn(16, requires_grad=True)
    compiler = InductorCountingCompiler()
    for batch in (4, 5, 6):
        x = torch.randint(0, 3, (batch, 1024, 16)).float()
        (expected,) = torch.autograd.grad((x * weight).sum(), weight)
        weight.grad = None
        with compiled_autograd(compiler):
            (x * weight).sum().backward()
        assert torch.equal(weight.grad, expected)
    assert captures() == 1
    assert compiler.dynamo_compiles == 1


@contextlib.contextmanager
def inductor_code():
    """Collects the code Inductor generates inside the block, from fresh
    caches. (run_and_get_code would reset Dynamo, which disables compiled
    autograd.)"""
    codes = []
    with mock.patch.object(GraphLowering, "save_output_code", codes.append), fresh_cache():
        yield codes


@pytest.fixture(params=[False, True], ids=["specialized_sizes", "symbolic_sizes"])
def size_mode(request):
    torch._dynamo.config.compiled_autograd_symbolic_sizes = request.param
    return request.param


def test_captured_graphs_leave_input_checks_to_dynamos_guards(size_mode):
    # Inductor asserts each input's size and stride every time its code runs
    # (~0.5 us per input and backward); for captured graphs Dynamo's guards
    # check the same (patches/0007). A saved activation with other strides
    # must fail a guard and compile again, with eager's gradients.
    weight = torch.randn(4, 4, requires_grad=True)
    compiler = InductorCountingCompiler()
    for x in (torch.randn(4, 4), torch.randn(4, 4).t()):
        activation = x.sin()  # the multiplication saves it, with x's strides
        (expected,) = torch.autograd.grad((activation * weight).sum(), weight)
        weight.grad = None
        with inductor_code() as codes, compiled_autograd(compiler):
            (activation * weight).sum().backward()
        assert torch.equal(weight.grad, expected)
        assert codes and not any("assert_size_stride(" in code for code in codes)
    assert captures() == 1
    assert compiler.dynamo_compiles == 2


def pregraph_ranges(compiled_function):
    """Whether Dynamo's code for the function calls the profiler-range
    functions around the unpacking of its inputs."""
    codes = [entry.code for entry in _debug_get_cache_entry_list(compiled_function.__code__)]
    assert codes
    return ["record_pregraph_bytecode_enter" in code.co_names for code in codes]


def test_captured_graphs_unpack_their_inputs_without_profiler_ranges(size_mode):
    # Each range call goes through a disable wrapper on every backward, profiler
    # on or off. Only the captured graphs lose them, not the user's frames.
    x = torch.randn(8, requires_grad=True)
    (expected,) = torch.autograd.grad(x.sin().mul(x).sum(), x)
    compiler = CountingCompiler()
    with compiled_autograd(compiler):
        x.sin().mul(x).sum().backward()
    assert torch.equal(x.grad, expected)
    assert pregraph_ranges(compiler.captured[0].forward) == [False]

    def user_function(t):
        return t.sin() + 1

    torch.compile(user_function, backend="eager")(torch.randn(8))
    assert pregraph_ranges(user_function) == [True]


def assert_embedding_gradient_is_eagers(tokens, embedding, scale, compiler):
    (expected,) = torch.autograd.grad((embedding(tokens) * scale).sum(), embedding.weight)
    embedding.weight.grad = None
    with compiled_autograd(compiler):
        (embedding(tokens) * scale).sum().backward()
    assert torch.equal(embedding.weight.grad, expected)


def embedding_backward_code(tokens, embedding, scale):
    """Inductor's code for the captured backward of an embedding lookup, after
    checking that the gradient equals eager's bit for bit."""
    with inductor_code() as codes:
        assert_embedding_gradient_is_eagers(tokens, embedding, scale, InductorCountingCompiler())
    assert codes
    return "\n".join(codes)


def test_inductor_leaves_cpu_embedding_backwards_to_atens_kernel(size_mode):
    # Inductor's decomposition into atomic adds ran 4-90x slower on CPU than
    # ATen's kernel where indices repeat, as a position embedding's do
    # (patches/0008). Running ATen's kernel also gives eager's gradient exactly.
    torch.manual_seed(0)
    embedding, scale = torch.nn.Embedding(8, 16), torch.randn(16)
    code = embedding_backward_code(torch.randint(0, 8, (4, 32)), embedding, scale)
    assert "aten.embedding_dense_backward" in code
    assert "atomic_add" not in code


def test_inductor_decomposes_cpu_embedding_backwards_when_told_to():
    embedding = torch.nn.Embedding(8, 16)
    tokens = torch.zeros(4, 32, dtype=torch.long)  # one row: exact sums of equal terms
    with torch._inductor.config.patch({"cpp.fallback_embedding_dense_backward": False}):
        code = embedding_backward_code(tokens, embedding, torch.ones(16))
    assert "aten.embedding_dense_backward" not in code
    assert "atomic_add" in code


def test_atens_embedding_backward_keeps_padding_and_frequency_scaling_as_batches_change(size_mode):
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(8, 16, padding_idx=0, scale_grad_by_freq=True)
    scale = torch.randn(16)
    compiler = InductorCountingCompiler()
    for batch in (4, 6):
        assert_embedding_gradient_is_eagers(torch.randint(0, 8, (batch, 32)), embedding, scale, compiler)
    assert not embedding.weight.grad[0].any()
    assert captures() == 1


def test_a_cached_inductor_graph_whose_guards_name_a_size_it_does_not_take_is_a_miss(
    monkeypatch,
):
    # patches/0009. A restarted program with gpt2's compiled backward found, in
    # Inductor's FX graph cache, a graph whose inputs are 8 SymInts and whose
    # guards relate one of them to the dims of a lifted tensor it does not
    # take (`L['t3'] == L['inputs'][146].size()[1]*L['inputs'][78].size()[0]`,
    # from related_sizes): evaluating them raised KeyError: 'inputs' and the
    # backward failed. Such an entry cannot be checked, so it is not reused.
    from torch._inductor.codecache import FxGraphCache
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    candidate = mock.Mock(guards_expr="L['t0'] == 2*L['inputs'][3].size()[0]")
    monkeypatch.setattr(
        FxGraphCache,
        "iterate_over_candidates",
        classmethod(lambda cls, local, remote_cache, key: iter([(candidate, b"", True)])),
    )
    graph, _, info = FxGraphCache.find_guarded_entry(
        "key", True, None, ShapeEnv().evaluate_guards_expression, [8]
    )
    assert graph is None
    assert info["cache_status_detailed"] == "guard_miss"


@pytest.mark.parametrize(
    "add_with_alpha",
    [
        lambda w, a, b: w.add(a @ b, alpha=-0.1),
        lambda w, a, b: torch.add(a @ b, w, alpha=-0.1),
    ],
    ids=["matmul_scaled", "other_operand_scaled"],
)
def test_inductor_keeps_the_alpha_of_an_add_of_a_matmul(add_with_alpha):
    """Inductor's addmm fusion matched add(w, mm) whatever its alpha, and the
    addmm it made had none (patches/0016)."""
    torch._dynamo.reset()
    w, a, b = torch.randn(4, 4), torch.randn(4, 3), torch.randn(3, 4)
    compiled = torch.compile(add_with_alpha, backend="inductor")
    torch.testing.assert_close(compiled(w, a, b), add_with_alpha(w, a, b))


def test_a_packed_sequences_backward_breaks_the_graph_only_where_it_reads_batch_sizes():
    """PackPaddedSequenceBackward0 walks its saved batch_sizes on the host,
    which FakeTensors cannot: it runs behind a graph break, so Dynamo
    compiles the GRU's backward before it and the input's accumulation after
    it, instead of giving up on the whole graph with a warning."""
    torch.manual_seed(0)
    gru = torch.nn.GRU(3, 4)
    padded = torch.nn.utils.rnn.pad_sequence([torch.randn(5, 3), torch.randn(3, 3), torch.randn(2, 3)])
    padded.requires_grad_()

    def backward():
        gru.zero_grad(set_to_none=True)
        padded.grad = None
        packed = torch.nn.utils.rnn.pack_padded_sequence(padded, [5, 3, 2])
        out, _ = gru(packed)
        torch.nn.utils.rnn.pad_packed_sequence(out)[0].pow(2).sum().backward()
        return [padded.grad] + [p.grad for p in gru.parameters()]

    expected = backward()
    compiler = CountingCompiler()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Compiled autograd")
        with compiled_autograd(compiler):
            actual = backward()
    for e, a in zip(expected, actual):
        assert torch.equal(e, a)
    assert captures() == 1
    assert compiler.dynamo_compiles == 2
