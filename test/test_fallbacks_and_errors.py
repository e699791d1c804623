"""What the Python engine does not compile runs on the eager engine, with a
warning that says so; errors surface exactly as in eager.

A C++ hook that refuses compiled autograd (DDP's C++ reducer) is tested in
test_distributed.py (test_ddp_cpp_reducer_*), in spawned processes: a gloo
process group torn down inside a pytest process can deadlock it
(docs/distributed.md, *Failures*)."""

import copy
import warnings

import pytest
import torch
import torch.autograd.forward_ad as fwAD

from helpers import (
    COMPILERS,
    assert_same,
    captures,
    check_against_eager,
    compiled_autograd,
    eager_fallbacks,
    run_eager_and_compiled,
)
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode


def test_create_graph_falls_back_to_eager_and_double_backward_works():
    def fn():
        x = torch.randn(3, requires_grad=True)
        (gx,) = torch.autograd.grad((x**3).sum(), [x], create_graph=True)
        (ggx,) = torch.autograd.grad(gx.sum(), [x])
        return [gx.detach(), ggx]

    with pytest.warns(UserWarning, match="create_graph=True"):
        check_against_eager(fn, falls_back=True)
    # The first-order backward builds a graph, so it runs eagerly; the
    # second-order one is an ordinary backward and is compiled.
    assert eager_fallbacks() == 1
    assert captures() == 1


def test_a_fallback_warns_once_per_reason_and_again_after_reset():
    def create_graph_backward():
        x = torch.randn(3, requires_grad=True)
        torch.autograd.grad((x**3).sum(), [x], create_graph=True)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with compiled_autograd():
            create_graph_backward()
            create_graph_backward()
        assert len(fallback_warnings(caught)) == 1
        # reset() also turns compiled autograd off, so it comes between two enables.
        torch._dynamo.compiled_autograd.reset()
        with compiled_autograd():
            create_graph_backward()
    assert len(fallback_warnings(caught)) == 2
    assert eager_fallbacks() == 3


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
def test_third_order_gradients_through_create_graph_backwards_match_eager(compiler_name):
    # A compiled create_graph backward would be differentiable only once:
    # d2u's graph would inline du's compiled backward, whose saved
    # activations carry no history, and the parameters' gradients would be
    # wrong (docs/design.md, Known limits).
    def physics_informed_step():
        torch.manual_seed(0)
        net = torch.nn.Sequential(
            torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
        t = torch.linspace(0, 1, 10).unsqueeze(1).requires_grad_()
        u = net(t)
        (du,) = torch.autograd.grad(u.sum(), t, create_graph=True)
        (d2u,) = torch.autograd.grad(du.sum(), t, create_graph=True)
        ((d2u + u) ** 2).mean().backward()
        return [p.grad for p in net.parameters()]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning: the test above
        check_against_eager(physics_informed_step, COMPILERS[compiler_name], falls_back=True)
    assert eager_fallbacks() == 2
    assert captures() == 1


def test_anomaly_mode_raises_eagers_error_naming_the_node():
    def backward_producing_nan():
        x = torch.tensor([0.0], requires_grad=True)
        with torch.autograd.detect_anomaly(check_nan=True):
            (x.sqrt() * 0).sum().backward()

    with pytest.raises(RuntimeError) as eager_error, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backward_producing_nan()
    with pytest.raises(RuntimeError) as compiled_error, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with compiled_autograd():
            backward_producing_nan()
    assert "SqrtBackward0" in str(eager_error.value)
    assert str(compiled_error.value) == str(eager_error.value)


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
def test_error_in_hook_propagates_and_engine_stays_usable(compiler_name):
    class HookError(Exception):
        pass

    def failing_hook(grad):
        raise HookError("from a hook")

    x = torch.randn(3, requires_grad=True)
    y = x * 2
    y.register_hook(failing_hook)
    with compiled_autograd(COMPILERS[compiler_name]):
        with pytest.raises(HookError, match="from a hook"):
            y.sum().backward()
        z = torch.randn(3, requires_grad=True)
        (z * z).sum().backward()
    assert torch.equal(z.grad, 2 * z)


@pytest.mark.parametrize("returned", [None, 3], ids=["None", "int"])
def test_a_compiler_fn_returning_a_non_callable_is_refused_and_not_cached(returned):
    x = torch.randn(3, requires_grad=True)
    with compiled_autograd(lambda gm: returned):
        with pytest.raises(TypeError, match="compiler_fn returned .*, not a callable"):
            (x.exp() * x).sum().backward()
    assert x.grad is None
    with compiled_autograd():
        (x.exp() * x).sum().backward()
    assert_same(x.grad, x.exp() * x + x.exp())


@pytest.mark.parametrize(
    "result, message",
    [
        (lambda grads: None, "returned NoneType"),
        (lambda grads: [*grads, None], "returned a sequence of length 2 for a graph of 1 outputs"),
        (lambda grads: ["a gradient"], "returned a str where a gradient belongs"),
    ],
    ids=["None", "too_many", "not_a_tensor"],
)
def test_a_compiled_function_returning_wrong_gradients_raises_a_type_error_naming_compiler_fn(
    result, message
):
    def compiler(gm):
        return lambda *inputs: result(gm(*inputs))

    x = torch.randn(3, requires_grad=True)
    with compiled_autograd(compiler):
        with pytest.raises(TypeError, match=f"compiler_fn returned for a captured graph {message}"):
            torch.autograd.grad((x * x).sum(), [x])


def fallback_warnings(caught):
    return [w for w in caught if "ran this backward with eager autograd" in str(w.message)]


def test_backward_twice_without_retain_graph_raises_eagers_error_without_a_fallback_warning():
    x = torch.randn(3, requires_grad=True)
    y = (x.exp() * x).sum()
    with compiled_autograd(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y.backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.backward()
    assert fallback_warnings(caught) == []


def test_in_place_modification_of_saved_tensor_raises_eagers_error_without_a_fallback_warning():
    x = torch.randn(3, requires_grad=True)
    a = x * 1
    y = a.exp()
    y.add_(1)  # exp saved its output
    with compiled_autograd(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
    assert fallback_warnings(caught) == []


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
def test_accumulating_into_an_expanded_grad_raises_eagers_error_without_a_fallback_warning(
    compiler_name,
):
    # Traced, the in-place accumulation failed in the backend's compile,
    # with Dynamo's BackendCompilerFailed instead of eager's message.
    x = torch.randn(4, 3, requires_grad=True)
    x.grad = torch.zeros(1, 3).expand(4, 3)
    with compiled_autograd(COMPILERS[compiler_name]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="^unsupported operation: more than one element") as raised:
            (x * x).sum().backward()
        assert raised.type is RuntimeError
        assert captures() == 0
        x.grad = None
        (x * x).sum().backward()
    assert fallback_warnings(caught) == []
    assert captures() == 1
    torch.testing.assert_close(x.grad, 2 * x.detach())


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
def test_accumulating_into_an_inference_tensor_grad_raises_eagers_error_without_a_fallback_warning(
    compiler_name,
):
    # Inductor's kernel added into the inference tensor without a word, where
    # eager refuses an in-place update of one outside inference mode.
    x = torch.randn(3, requires_grad=True)
    with torch.inference_mode():
        x.grad = torch.ones(3)
    with compiled_autograd(COMPILERS[compiler_name]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(RuntimeError, match="^Inplace update to inference tensor outside InferenceMode"):
            (x * x).sum().backward()
    assert fallback_warnings(caught) == []
    assert captures() == 0


@pytest.mark.parametrize("compiler_name", sorted(COMPILERS))
@pytest.mark.parametrize(
    "hook, message",
    [
        (lambda grad: grad[:2], "has changed the size of value"),
        (lambda grad: grad.double(), r"has changed the type of value \(was torch.FloatTensor got torch.DoubleTensor\)"),
    ],
    ids=["size", "dtype"],
)
def test_a_tensor_hook_that_changes_a_gradients_size_or_dtype_raises_eagers_error(
    compiler_name, hook, message
):
    def backward_through_hook():
        x = torch.randn(3, requires_grad=True)
        y = x * 2
        y.register_hook(hook)
        y.sum().backward()

    with pytest.raises(RuntimeError, match=message):
        backward_through_hook()
    with compiled_autograd(COMPILERS[compiler_name]), pytest.raises(RuntimeError, match=message) as raised:
        backward_through_hook()
    assert raised.type is RuntimeError
    assert eager_fallbacks() == 0


def check_backward_falls_back_to_eager(fn, warning):
    """``fn``'s backward runs on the eager engine, with a warning matching
    ``warning``, captures nothing, and gives eager's gradients. The warning
    does not send the user to the legacy engine, which raises or crashes on
    these backwards."""
    with pytest.warns(UserWarning, match=warning) as caught:
        check_against_eager(fn, COMPILERS["aot_eager"], falls_back=True)
    assert not [w for w in fallback_warnings(caught) if "legacy" in str(w.message)]
    assert eager_fallbacks() == 1
    assert captures() == 0


@pytest.mark.parametrize(
    "layout, name", [(torch.sparse_coo, "Sparse"), (torch.sparse_csr, "SparseCsr")]
)
def test_a_sparse_tensor_saved_for_backward_falls_back_to_eager_with_a_warning(
    layout, name
):
    # Dynamo raised IndexError on a sparse graph input (both engines).
    def fn():
        dense = torch.randn(4, 5)
        dense[dense < 0.3] = 0
        sparse = dense.to_sparse(layout=layout).requires_grad_()
        weight = torch.randn(5, 3, requires_grad=True)
        (sparse @ weight).sum().backward()
        return [sparse.grad.layout, sparse.grad.to_dense(), weight.grad]

    check_backward_falls_back_to_eager(fn, f"has layout {name}, and Dynamo takes only strided")


def test_batched_gradients_fall_back_to_eager_with_a_warning():
    # Dynamo cannot fake vmap's batched tensors ("meta converter nyi"): it
    # graph-broke on them, an error under fullgraph=True. Legacy raises.
    def fn():
        x = torch.randn(3, requires_grad=True)
        y = x.exp() * x
        (jacobian,) = torch.autograd.grad(y, x, torch.eye(3), is_grads_batched=True)
        return [jacobian]

    check_backward_falls_back_to_eager(fn, "batched .*is_grads_batched=True")


def test_a_zero_tensor_leaf_falls_back_to_eager_with_a_warning():
    # A ZeroTensor has no memory: an Inductor kernel reading this leaf crashed
    # the process (both engines; plain torch.compile of `x * y` too). Saved
    # ZeroTensors that do not require grad are lifted as real zeros
    # (test_semantics.py), but a leaf's gradient must reach the leaf itself.
    def fn():
        x = torch._efficientzerotensor(4).requires_grad_()
        y = torch.randn(4, requires_grad=True)
        (x * x + x * y).sum().backward()
        return [x.grad, y.grad]

    check_backward_falls_back_to_eager(fn, "ZeroTensor .*that requires grad")


def test_a_leaf_with_the_negative_bit_falls_back_to_eager_with_a_warning():
    # The graph reads a tensor with the negative bit through a copy that holds
    # the values the bit stands for (test_semantics.py), but a leaf's gradient
    # must reach the leaf itself, not the copy.
    def fn():
        x = torch.randn(4, dtype=torch.complex128).conj().imag.detach().requires_grad_()
        y = torch.randn(4, dtype=torch.float64, requires_grad=True)
        (x * y).sum().backward()
        return [x.grad, y.grad]

    check_backward_falls_back_to_eager(fn, "negative bit set .*resolve_neg")


def test_a_grad_with_the_negative_bit_falls_back_to_eager_with_a_warning():
    # The accumulation must add into that .grad in place, through its negative
    # bit, which an Inductor kernel did not see: it gave a wrong .grad.
    def fn():
        x = torch.randn(4, dtype=torch.float64, requires_grad=True)
        x.grad = torch.randn(4, dtype=torch.complex128).conj().imag
        (x * x).sum().backward()
        return [x.grad]

    check_backward_falls_back_to_eager(fn, "grad of a leaf .*negative bit set")


@torch._dynamo.config.patch(recompile_limit=3)
def test_a_number_an_op_bakes_in_stops_capturing_at_the_recompile_limit():
    # libtorch puts an op's Scalar argument (leaky_relu's negative_slope) into
    # the node's key, on both engines, so each new value is a new graph.
    # Legacy captures and compiles one per value without bound.
    def fn(slope):
        x = torch.randn(5, requires_grad=True)
        torch.nn.functional.leaky_relu(x.sin(), slope).sum().backward()
        return [x.grad]

    warning = "captured 3 times .*recompile_limit.*negative_slope.* pass it as a tensor"
    with pytest.warns(UserWarning, match=warning) as caught:
        for slope in [0.1, 0.2, 0.3, 0.4, 0.5]:
            check_against_eager(lambda: fn(slope), COMPILERS["aot_eager"], falls_back=True)
    assert len(fallback_warnings(caught)) == 1
    assert (captures(), eager_fallbacks()) == (3, 2)

    # A value captured before still runs its compiled graph.
    check_against_eager(lambda: fn(0.2), COMPILERS["aot_eager"])
    assert captures() == 3


@torch._dynamo.config.patch(recompile_limit=3)
def test_a_hook_registered_again_every_backward_stops_capturing_at_the_recompile_limit():
    # Each backward sees one more hook on the leaf: a new graph of the same nodes.
    def fn():
        w = torch.randn(4, requires_grad=True)
        grads = []
        for _ in range(5):
            w.register_hook(lambda grad: grad * 2)
            (w * w).sum().backward()
            grads.append(w.grad.clone())
        return grads

    with pytest.warns(UserWarning, match="captured 3 times .*register them once"):
        check_against_eager(fn, COMPILERS["aot_eager"], falls_back=True)
    assert (captures(), eager_fallbacks()) == (3, 2)


def test_a_number_passed_as_a_tensor_reuses_one_graph():
    def fn(slope):
        x = torch.randn(5, requires_grad=True)
        y = x.sin()
        torch.where(y > 0, y, y * torch.tensor(slope)).sum().backward()
        return [x.grad]

    for slope in [0.1, 0.2, 0.3, 0.4, 0.5]:
        check_against_eager(lambda: fn(slope), COMPILERS["aot_eager"])
    assert captures() == 1


def test_a_nested_tensor_in_the_backward_falls_back_to_eager_with_a_warning():
    # libtorch's compiled_args refuses nested tensors (compiled_autograd.h);
    # the legacy engine raises that NotImplementedError.
    def fn():
        a = torch.randn(3, 4, requires_grad=True)
        b = torch.randn(5, 4, requires_grad=True)
        nested = torch.nested.as_nested_tensor([a, b], layout=torch.jagged)
        (nested.sin() * 2).values().sum().backward()
        return [a.grad, b.grad]

    check_backward_falls_back_to_eager(fn, "NestedTensor support not implemented")


def test_a_backward_inside_a_forward_ad_dual_level_falls_back_to_eager_with_a_warning():
    # The saved dual tensor carries a tangent, which AOTAutograd refuses.
    def fn():
        x = torch.randn(4, requires_grad=True)
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, torch.randn(4))
            (dual.sin() * 3).sum().backward()
        return [x.grad]

    check_backward_falls_back_to_eager(fn, "forward-mode AD level")


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_backward_under_a_torch_dispatch_mode_falls_back_to_eager_and_the_mode_sees_its_ops():
    # Eager autograd runs the backward's ops through the mode, which may
    # count, log or change them: it sees the same ops as in eager. The warning
    # names the mode.
    def fn():
        x = torch.randn(3, requires_grad=True)
        loss = (x.sin() * x).sum()
        with OpLog() as log:
            loss.backward()
        return [x.grad, log.ops]

    check_backward_falls_back_to_eager(fn, r"a TorchDispatchMode is active \(OpLog\)")


def test_allow_mutation_on_saved_tensors_falls_back_to_eager_naming_its_mode():
    def fn():
        x = torch.randn(3, requires_grad=True)
        with torch.autograd.graph.allow_mutation_on_saved_tensors():
            y = x.clone()
            squared = y * y
            y.mul_(2)
            squared.sum().backward()
        return [x.grad]

    check_backward_falls_back_to_eager(fn, r"TorchDispatchMode is active \(_CloneArgBeforeMutateMode\)")


def test_a_graph_dynamo_cannot_trace_runs_without_dynamo_with_a_warning():
    # libtorch's linalg_lstsq_backward calls numel() where residuals have a
    # gradient, which a FakeTensor with symbolic sizes refuses: Dynamo raises
    # while tracing the node's formula (on the legacy engine too).
    torch._dynamo.config.compiled_autograd_symbolic_sizes = True

    def fn(rows):
        def gradients():
            a = torch.randn(rows, 3, dtype=torch.float64, requires_grad=True)
            b = torch.randn(rows, 2, dtype=torch.float64, requires_grad=True)
            out = torch.linalg.lstsq(a, b, driver="gels")
            (out.solution.pow(2).sum() + out.residuals.sum()).backward()
            return [a.grad, b.grad]

        return gradients

    with pytest.warns(UserWarning, match="Cannot call numel.*runs without compiler_fn"):
        assert_same(*run_eager_and_compiled(fn(4), COMPILERS["aot_eager"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_same(*run_eager_and_compiled(fn(5), COMPILERS["aot_eager"]))
    assert counters["compiled_autograd"]["graphs_run_without_dynamo"] == 1
    assert captures() == 1
    assert eager_fallbacks() == 0


def test_legacy_and_python_engines_in_one_process():
    def fn():
        model = torch.nn.Linear(4, 2)
        # `* 0.9` saves a wrapped-number tensor: the engine that runs second
        # calls the functional the first one bound, with that tensor.
        (model(torch.randn(3, 4)) * 0.9).sum().backward()
        return [p.grad for p in model.parameters()]

    torch.manual_seed(0)
    expected = fn()
    for engine in ("legacy", "python", "legacy"):
        torch._dynamo.config.compiled_autograd_engine = engine
        torch.manual_seed(0)
        with compiled_autograd(COMPILERS["eager"]):
            actual = fn()
        assert_same(expected, actual)
    assert captures() == 2  # each engine captured once


def test_unknown_engine_name_is_refused():
    torch._dynamo.config.compiled_autograd_engine = "quantum"
    with pytest.raises(ValueError, match="'python' or 'legacy'"):
        with compiled_autograd():
            pass


def compiled_train_step(model, loss_fn, **compile_options):
    """torch.compile (aot_eager) of a step computing ``loss_fn(model(x))`` and
    its backward, made with torch._dynamo.config.compiled_autograd on: the
    backward it calls runs on compiled autograd. Dynamo reads that option
    when torch.compile is called."""
    torch._dynamo.config.compiled_autograd = True
    try:

        @torch.compile(backend="aot_eager", **compile_options)
        def train_step(x):
            loss_fn(model(x)).backward()

    finally:
        torch._dynamo.config.compiled_autograd = False
    return train_step


def test_torch_compile_with_config_compiled_autograd():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    x = torch.randn(5, 4)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)

    compiled_train_step(model, torch.sum)(x)
    assert_same(expected, [p.grad for p in model.parameters()])
    assert captures() == 1


def test_a_backward_in_a_torch_compiled_function_leaves_dynamo_only_that_function_and_the_graphs(
    monkeypatch,
):
    # The backward runs at the compiled function's graph break, with its
    # frame callback set: Dynamo compiled the Python the engine called
    # (weakref's functions while capturing, a guard's lambda on every hit).
    from torch._dynamo import convert_frame

    traced_files = []
    compile_frame = convert_frame._compile

    def recording_compile(code, *args, **kwargs):
        traced_files.append(code.co_filename)
        return compile_frame(code, *args, **kwargs)

    monkeypatch.setattr(convert_frame, "_compile", recording_compile)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    eager_model = copy.deepcopy(model)

    def mean_square(output):
        return output.pow(2).mean()

    train_step = compiled_train_step(model, mean_square, dynamic=True)
    for batch in (5, 6, 7):
        x = torch.randn(batch, 4)
        train_step(x)
        mean_square(eager_model(x)).backward()
        assert_same([p.grad for p in eager_model.parameters()], [p.grad for p in model.parameters()])
    assert captures() == 1
    graphs = [name for name in traced_files if name.startswith("<eval_with_key>.compiled_autograd.")]
    assert graphs
    assert [name for name in traced_files if name != __file__ and name not in graphs] == []


def test_torch_compile_with_config_compiled_autograd_builds_the_backward_compiler_only_to_capture(
    monkeypatch,
):
    # Upstream built it (a copy of Inductor's whole config) on every call of
    # the compiled function, ~0.4 ms, on both engines (patches/0012).
    from torch._dynamo import eval_frame

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    eager_model = copy.deepcopy(model)
    train_step = compiled_train_step(model, torch.sum)
    builds = []
    build_context = eval_frame.optimize

    def counting_build(*args, **kwargs):
        builds.append(args)
        return build_context(*args, **kwargs)

    monkeypatch.setattr(eval_frame, "optimize", counting_build)
    for _ in range(4):
        x = torch.randn(5, 4)
        train_step(x)
        eager_model(x).sum().backward()
    assert_same([p.grad for p in eager_model.parameters()], [p.grad for p in model.parameters()])
    assert captures() == 1
    assert len(builds) == 1
