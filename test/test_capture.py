"""Phase 1: the backward is captured by symbolically tracing python_autograd,
without FakeTensors, make_fx or proxy dispatch modes."""

import contextlib
import linecache
import re
from unittest import mock

import expecttest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental import proxy_tensor
from torch.testing._internal.logging_utils import logs_to_string

import torch._compiled_autograd as python_engine
from helpers import check_against_eager, compiled_autograd, dynamo_compiler, identity_compiler


def capture_graph(backward):
    graphs = []

    def keep_graph(gm):
        graphs.append(gm)
        return gm

    with compiled_autograd(keep_graph):
        backward()
    (graph,) = graphs
    return graph


def hooked_square_sum():
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x**2
    y.register_hook(lambda grad: grad * 2)
    y.sum().backward()
    return x


def called_targets(gm):
    return {node.target for node in gm.graph.nodes if node.op == "call_function"}


class TestCapture(expecttest.TestCase):
    def test_phase_one_enters_no_fake_or_proxy_mode(self):
        entered = []

        def refuse(name):
            def enter(self, *args, **kwargs):
                entered.append(name)
                raise AssertionError(f"{name} entered during capture")

            return enter

        with contextlib.ExitStack() as stack:
            stack.enter_context(mock.patch.object(FakeTensorMode, "__enter__", refuse("FakeTensorMode")))
            stack.enter_context(
                mock.patch.object(proxy_tensor.ProxyTorchDispatchMode, "__enter__", refuse("ProxyTorchDispatchMode"))
            )
            stack.enter_context(mock.patch.object(proxy_tensor, "make_fx", refuse("make_fx")))
            x = hooked_square_sum()
            gm = capture_graph(lambda: hooked_square_sum())
        self.assertEqual(entered, [])
        self.assertEqual(x.grad.tolist(), [4.0, 8.0, 12.0])
        self.assertIn(python_engine.apply_with_saved, called_targets(gm))

    def test_graph_calls_nodes_and_hooks(self):
        gm = capture_graph(hooked_square_sum)
        targets = called_targets(gm)
        for op in (
            python_engine.apply_with_saved,
            python_engine.call_hook,
            python_engine.accumulate_grad,
        ):
            self.assertIn(op, targets)

    def test_node_outputs_are_cast_and_reduced_like_eager(self):
        # MulBackward0 returns float64 gradients for both inputs and the
        # broadcast shape for y; the eager engine's validate_outputs casts and
        # sums them to each input's dtype and shape, and so must the graph.
        def mixed_dtype_broadcast_mul():
            x = torch.randn(2, 3, dtype=torch.float32, requires_grad=True)
            y = torch.randn(3, dtype=torch.float64, requires_grad=True)
            (x * y).sum().backward()
            return x.grad, y.grad

        for compiler in (identity_compiler, dynamo_compiler("aot_eager")):
            x_grad, y_grad = check_against_eager(mixed_dtype_broadcast_mul, compiler)
            self.assertEqual((x_grad.dtype, x_grad.shape), (torch.float32, (2, 3)))
            self.assertEqual((y_grad.dtype, y_grad.shape), (torch.float64, (3,)))

    def test_captured_graph_text(self):
        gm = capture_graph(hooked_square_sum)
        self.assertExpectedInline(
            gm.code.strip(),
            """\
def forward(self, inputs, sizes, scalars, hooks, packed_data):
    getitem = inputs[0]
    getitem_1 = inputs[1];  inputs = None
    related_sizes = torch._compiled_autograd.related_sizes(sizes, [getitem, getitem_1], ((0, 1, 0, 1), (1, 1, 0, 1), (2, 1, 0, 1)));  sizes = None
    apply_with_saved = torch._compiled_autograd.apply_with_saved(0, [None], [getitem], related_sizes, (0, 0), scalars, (0, 0));  getitem = None
    getitem_2 = apply_with_saved[0];  apply_with_saved = None
    apply_with_saved_1 = torch._compiled_autograd.apply_with_saved(1, [getitem_2], [], related_sizes, (0, 2), scalars, (0, 0));  getitem_2 = None
    getitem_3 = apply_with_saved_1[0];  apply_with_saved_1 = None
    call_hook = torch._compiled_autograd.call_hook(hooks, 0, getitem_3, hook_type = 'tensor_pre_hook');  hooks = getitem_3 = None
    apply_with_saved_2 = torch._compiled_autograd.apply_with_saved(2, [call_hook], [getitem_1], related_sizes, (2, 3), scalars, (0, 0));  call_hook = related_sizes = scalars = None
    getitem_4 = apply_with_saved_2[0];  apply_with_saved_2 = None
    accumulate_grad = torch._compiled_autograd.accumulate_grad(getitem_1, getitem_4);  getitem_1 = getitem_4 = accumulate_grad = None
    _exec_final_callbacks_stub = torch__dynamo_external_utils__exec_final_callbacks_stub();  _exec_final_callbacks_stub = None
    return []""",
        )

    def test_every_capture_says_why_the_cache_missed(self):
        reasons = []

        def record_reason(gm):
            reasons.append(gm.meta["capture_reason"])
            return gm

        x = torch.randn(3, requires_grad=True)
        with compiled_autograd(record_reason):
            (x.sin() * 2).sum().backward()
            (x.sin() * 2).sum().backward()  # same structure: no capture
            (x.cos() * 2).sum().backward()
        self.assertEqual(len(reasons), 2)
        self.assertEqual(reasons[0], "no graph captured yet")
        self.assertIn("(CosBackward0) replaces SinBackward0", reasons[1])

    def test_logged_graph_names_the_autograd_node_of_each_op(self):
        logs, logging_enabled = logs_to_string("torch._dynamo.compiled_autograd", "compiled_autograd")
        with logging_enabled():
            capture_graph(hooked_square_sum)
        origins = re.findall(r"code: (.*)$", logs.getvalue(), flags=re.MULTILINE)
        self.assertExpectedInline(
            "\n".join(origins),
            """\
torch::autograd::GraphRoot (NodeCall 0)
SumBackward0 (NodeCall 1)
PowBackward0 (NodeCall 2)
torch::autograd::AccumulateGrad (NodeCall 3)""",
        )

    def test_verbose_log_names_the_first_new_node_of_each_cache_miss(self):
        logs, logging_enabled = logs_to_string("torch._dynamo.compiled_autograd", "compiled_autograd_verbose")
        with logging_enabled(), compiled_autograd():
            for batch in (2, 3):  # sizes are not key material: one miss
                (torch.randn(batch, requires_grad=True).sin() * 2).sum().backward()
            (torch.randn(3, requires_grad=True).cos() * 2).sum().backward()
        misses = re.findall(r"^Cache miss due to new autograd node: (.*)$", logs.getvalue(), flags=re.MULTILINE)
        self.assertEqual(len(misses), 2, logs.getvalue())
        self.assertRegex(misses[0], r"^torch::autograd::GraphRoot \(NodeCall 0\) with key size \d+, previous key sizes=\[\]$")
        self.assertRegex(misses[1], r"^CosBackward0 \(NodeCall 3\) with key size \d+, previous key sizes=\[\d+\]$")

    def test_printed_graph_shows_a_compiled_regions_backward(self):
        region = torch.compile(lambda x: x.sin() * 1.5, backend="aot_eager")
        x = torch.randn(4, requires_grad=True)
        text = capture_graph(lambda: region(x).sum().backward()).print_readable(print_output=False)
        (aot_id,) = set(re.findall(r"self\.CompiledFunctionBackward(\d+)\(", text))
        self.assertIn(f"class CompiledFunctionBackward{aot_id}(torch.nn.Module):", text)
        self.assertRegex(text, rf"aot{aot_id}_cos\w*(: .*)? = torch.ops.aten.cos.default\(aot{aot_id}_primals_1\)")

    def test_graph_code_is_named_after_its_graph_and_its_lines_are_readable(self):
        """Whatever else made GraphModules in between, the same backward gets
        the same code name (Dynamo's profile-guided state is found by it in a
        restarted program), and tracebacks and Dynamo's logs read its lines."""
        x = torch.randn(4, requires_grad=True)
        m = torch.randn(3, 4, requires_grad=True)
        first = capture_graph(lambda: (x.sin() * 2).sum().backward())
        torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
        python_engine.reset()
        again = capture_graph(lambda: (x.sin() * 2).sum().backward())
        other_nodes = capture_graph(lambda: (x.cos() * 2).sum().backward())
        over_rows = capture_graph(lambda: m.sum(0).sin().sum().backward())
        over_columns = capture_graph(lambda: m.sum(1).sin().sum().backward())
        name = first.forward.__code__.co_filename
        self.assertRegex(name, r"^<eval_with_key>\.compiled_autograd\.[0-9a-f]{16}$")
        self.assertEqual(again.forward.__code__.co_filename, name)
        self.assertNotEqual(other_nodes.forward.__code__.co_filename, name)
        # Same code and nodes, but a node that sums over another dim.
        self.assertEqual(
            over_columns.forward.__code__.co_filename, f"{over_rows.forward.__code__.co_filename}.1"
        )
        self.assertEqual(linecache.getlines(name), first.code.splitlines(keepends=True))
        first.recompile()
        self.assertEqual(first.forward.__code__.co_filename, name)

    def test_python_autograd_runs_directly_on_real_values(self):
        """The engine loop is plain Python: run on the real lifted values
        instead of being traced, it is an (uncompiled) backward pass."""
        x = torch.randn(4, requires_grad=True)
        loss = (x.exp() * x).sum()
        (expected,) = torch.autograd.grad(loss, [x], retain_graph=True)

        def run_the_loop(gm):
            def run(*inputs):
                nodes, num_outputs = gm.meta["backward_nodes"], gm.meta["num_outputs"]
                lifted = python_engine.Lifted(*inputs)
                return python_engine.python_autograd(nodes, num_outputs, lifted)

            return run

        with compiled_autograd(run_the_loop):
            (actual,) = torch.autograd.grad(loss, [x])
        self.assertTrue(torch.equal(actual, expected))


if __name__ == "__main__":
    expecttest.run_tests()
