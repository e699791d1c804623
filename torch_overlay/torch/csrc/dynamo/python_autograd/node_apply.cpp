#include <torch/csrc/dynamo/python_autograd/node_apply.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/dynamo/python_autograd/compiler_interface.h>
#include <torch/csrc/python_headers.h>
#include <torch/csrc/utils/pybind.h>

namespace torch::dynamo::python_autograd {

using torch::dynamo::autograd::SwapSavedVariables;
using torch::dynamo::autograd::TraceState;

namespace {

thread_local std::vector<BackwardGraph*> active_backwards;

std::function<std::string(const std::string&)> error_format(const Node& node) {
  return [name = node.name()](const std::string& msg) {
    return "Function " + name + " returned an " + msg;
  };
}

// Points the node's lifted values at the given ones for the duration of one
// apply_with_saved, and drops them afterwards so that the node's private
// AutogradCompilerCall holds no fake or traced tensor past the call.
class SwappedValues {
 public:
  SwappedValues(
      NodeRecord& record,
      const variable_list& tensors,
      const std::vector<c10::IValue>& scalars)
      : record_(record) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      record.tensor_args[i]->proxy_tensor = tensors[i];
    }
    auto& lifted = record.call->lifted_ivalue_args;
    lifted.next = 0;
    for (size_t i = 0; i < scalars.size(); ++i) {
      lifted.args[i].proxy = scalars[i];
    }
  }

  ~SwappedValues() {
    for (TensorArg* arg : record_.tensor_args) {
      arg->proxy_tensor = at::Tensor();
    }
    for (auto& arg : record_.call->lifted_ivalue_args.args) {
      arg.proxy = at::IValue::uninitialized();
    }
  }

 private:
  NodeRecord& record_;
};

void check_saved_values(
    const NodeRecord& record,
    const variable_list& saved_tensors,
    size_t num_sizes,
    size_t num_scalars) {
  const auto& call = *record.call;
  TORCH_CHECK(
      saved_tensors.size() == record.tensor_args.size() &&
          num_sizes == record.sizes_end - record.sizes_begin &&
          num_scalars == call.lifted_ivalue_args.args.size(),
      "apply_with_saved(",
      record.node->name(),
      "): expected ",
      record.tensor_args.size(),
      " tensors, ",
      record.sizes_end - record.sizes_begin,
      " sizes and ",
      call.lifted_ivalue_args.args.size(),
      " scalars; got ",
      saved_tensors.size(),
      ", ",
      num_sizes,
      " and ",
      num_scalars);
  for (const auto& t : saved_tensors) {
    TORCH_CHECK(
        t.defined(),
        "apply_with_saved(",
        record.node->name(),
        "): saved tensors must not be None");
  }
}

} // namespace

ActiveBackward::ActiveBackward(BackwardGraph& graph) {
  active_backwards.push_back(&graph);
}

ActiveBackward::~ActiveBackward() {
  active_backwards.pop_back();
}

NodeRecord& ActiveBackward::node(int64_t node_idx) {
  TORCH_CHECK(
      !active_backwards.empty(),
      "the captured autograd graph runs only inside the backward call that "
      "the Python compiled autograd engine is executing");
  auto& nodes = active_backwards.back()->nodes;
  TORCH_CHECK(
      node_idx >= 0 && node_idx < static_cast<int64_t>(nodes.size()),
      "node index ",
      node_idx,
      " out of range for a backward of ",
      nodes.size(),
      " nodes");
  return nodes[node_idx];
}

void ActiveBackward::skip_hook_removed_before_its_turn(
    PyObject* dict,
    PyObject* key,
    PyObject* stand_in) {
  for (BackwardGraph* graph : active_backwards) {
    PyObject* hooks = graph->running_hooks;
    if (hooks == nullptr) {
      continue;
    }
    py::handle progress = PyList_GET_ITEM(hooks, PyList_GET_SIZE(hooks) - 1);
    auto last_called = py::cast<int64_t>(progress[py::int_(0)]);
    for (auto& record : graph->nodes) {
      for (const auto& from : record.hook_dicts) {
        if (from.dict != dict) {
          continue;
        }
        for (size_t i = 0; i < from.keys.size(); ++i) {
          int equal = PyObject_RichCompareBool(
              from.keys[i].ptr(getPyInterpreter()), key, Py_EQ);
          if (equal < 0) {
            throw python_error();
          }
          if (equal == 0) {
            continue;
          }
          ++record.hooks_removed;
          if (from.begin > last_called) {
            Py_INCREF(stand_in);
            PyList_SetItem(
                hooks, static_cast<Py_ssize_t>(from.begin + i), stand_in);
          }
        }
      }
    }
  }
}

variable_list apply_with_saved(
    NodeRecord& record,
    const variable_list& inputs,
    const variable_list& saved_tensors,
    const std::vector<c10::SymInt>& sizes,
    const std::vector<c10::IValue>& saved_scalars,
    const variable_list& unpacked) {
  check_saved_values(record, saved_tensors, sizes.size(), saved_scalars.size());
  TORCH_CHECK(
      unpacked.size() == record.unpack_hooks.size(),
      "apply_with_saved(",
      record.node->name(),
      "): expected ",
      record.unpack_hooks.size(),
      " unpacked saved tensors, got ",
      unpacked.size());
  TORCH_CHECK(
      inputs.size() == record.node->num_inputs(),
      "apply_with_saved(",
      record.node->name(),
      "): expected ",
      record.node->num_inputs(),
      " gradients, got ",
      inputs.size());
  SwappedValues swapped(record, saved_tensors, saved_scalars);
  auto saved_sizes_end =
      sizes.begin() + (record.edge_sizes_begin - record.sizes_begin);
  TraceState saved_sizes(
      std::vector<std::optional<c10::SymInt>>(sizes.begin(), saved_sizes_end),
      /*num_outputs=*/0);
  SwapSavedVariables saved(
      *record.call, saved_sizes, Py_None, *record.node_call);
  NodeApplication application(NodeApplication::Mode::kRun, &unpacked);
  variable_list outputs = record.node->apply_with_saved(inputs, saved);
  application.rethrow_if_failed();
  return outputs;
}

variable_list validate_outputs(
    const NodeRecord& record,
    variable_list outputs,
    const std::vector<c10::SymInt>& sizes) {
  auto metadata =
      torch::dynamo::autograd::get_input_metadata(record.node->next_edges());
  TORCH_CHECK(
      sizes.size() == record.sizes_end - record.sizes_begin,
      "validate_outputs(",
      record.node->name(),
      "): expected ",
      record.sizes_end - record.sizes_begin,
      " sizes, got ",
      sizes.size());
  size_t next = record.edge_sizes_begin - record.sizes_begin;
  for (auto& input_metadata : metadata) {
    if (!input_metadata.has_value()) {
      continue;
    }
    for (auto& size : input_metadata->mutable_shape_as_dim_vector()) {
      TORCH_CHECK(
          next < sizes.size(),
          "validate_outputs(",
          record.node->name(),
          "): too few sizes");
      size = sizes[next++];
    }
  }
  TORCH_INTERNAL_ASSERT(next == sizes.size());
  torch::autograd::validate_outputs(
      metadata, outputs, error_format(*record.node));
  return outputs;
}

variable_list apply_eagerly(NodeRecord& record, variable_list inputs) {
  variable_list outputs = (*record.node)(std::move(inputs));
  torch::autograd::validate_outputs(
      record.node->next_edges(), outputs, error_format(*record.node));
  return outputs;
}

at::Tensor call_cpp_tensor_pre_hook(
    const NodeRecord& record,
    int64_t hook_idx,
    const at::Tensor& grad) {
  const auto& hooks = record.call->cpp_tensor_pre_hooks;
  TORCH_CHECK(
      hook_idx >= 0 && hook_idx < static_cast<int64_t>(hooks.size()),
      "C++ tensor pre-hook index out of range");
  return at::Tensor(hooks[hook_idx](grad));
}

variable_list materialize_grads(
    const NodeRecord& record,
    variable_list grads,
    const std::vector<c10::SymInt>& sizes) {
  const auto* ctx = reinterpret_cast<const THPFunction*>(
      static_cast<const torch::autograd::PyNode&>(*record.node).pyobj());
  TORCH_CHECK(
      grads.size() == ctx->output_info.size(),
      "materialize_grads(",
      record.node->name(),
      "): expected ",
      ctx->output_info.size(),
      " gradients, got ",
      grads.size());
  // PyNode::compiled_args lifts compiled_autograd_symints, then the sizes of
  // output_info.
  size_t next = ctx->compiled_autograd_symints.size();
  for (size_t i = 0; i < grads.size(); ++i) {
    const auto& info = ctx->output_info[i];
    size_t rank = info.size.size();
    TORCH_CHECK(
        next + rank <= sizes.size(),
        "materialize_grads(",
        record.node->name(),
        "): too few sizes");
    bool keep = grads[i].defined() || !ctx->materialize_grads ||
        (record.node->input_metadata(i).was_default_constructed() &&
         !ctx->materialize_non_diff_grads);
    // As VariableInfo::zeros: a non-tensor output (is_empty) gets an
    // undefined gradient, a nested tensor zeros like itself.
    if (!keep && !info.is_empty) {
      auto options = at::TensorOptions()
                         .dtype(info.scalar_type)
                         .device(info.device)
                         .layout(info.layout);
      grads[i] = info.the_var.has_value()
          ? at::zeros_like(*info.the_var)
          : at::zeros_symint(
                c10::SymIntArrayRef(sizes.data() + next, rank), options);
    }
    next += rank;
  }
  return grads;
}

void accumulate_grad(const at::Tensor& variable, const at::Tensor& grad) {
  at::Tensor& variable_grad = variable.mutable_grad();
  // The eager engine holds one reference to the incoming gradient; it may
  // steal the gradient rather than copy it when nothing else refers to it.
  torch::autograd::AccumulateGrad::accumulateGrad(
      variable,
      variable_grad,
      grad,
      /*num_expected_refs=*/1,
      [&variable_grad](at::Tensor&& update) {
        variable_grad = std::move(update);
      });
}

void classify_custom_functions(BackwardGraph& graph) {
  for (auto& record : graph.nodes) {
    if (!record.needed || !is_cpp_custom_function(*record.node)) {
      continue;
    }
    variable_list tensors;
    for (uint32_t id : record.tensor_ids) {
      tensors.push_back(graph.tensors[id]);
    }
    std::vector<c10::IValue> scalars;
    for (const auto& arg : record.call->lifted_ivalue_args.args) {
      scalars.push_back(*arg.actual_ptr);
    }
    SwappedValues swapped(record, tensors, scalars);
    // nullopt sizes keep the node's own values.
    TraceState sizes(
        std::vector<std::optional<c10::SymInt>>(
            record.edge_sizes_begin - record.sizes_begin),
        /*num_outputs=*/0);
    SwapSavedVariables saved(*record.call, sizes, Py_None, *record.node_call);
    NodeApplication probe(NodeApplication::Mode::kProbe);
    record.node->apply_with_saved(
        variable_list(record.node->num_inputs()), saved);
    probe.rethrow_if_failed();
    if (probe.custom_function_traceable() == false) {
      record.kind = NodeKind::kApplyWithSavedDynamoDisabled;
    }
  }
}

} // namespace torch::dynamo::python_autograd
