// The entry point libtorch's autograd engine calls for every backward while
// the Python compiled autograd engine is enabled, and the module
// torch._compiled_autograd_C that the Python side talks to.
//
// Per backward: collect the graph (backward_graph.cpp), look its key up in
// the cache, on a miss have torch/_compiled_autograd.py capture and compile
// it, then run the compiled graph with the lifted values. The graph's ops call
// back into node_apply.cpp by node index.

#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/forward_grad.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/input_buffer.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/dynamo/python_autograd/backward_graph.h>
#include <torch/csrc/dynamo/python_autograd/node_apply.h>
#include <torch/csrc/dynamo/python_autograd/size_relations.h>
#include <torch/csrc/utils/pybind.h>

#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/ScopeExit.h>

#include <array>
#include <optional>
#include <string>
#include <unordered_map>

namespace torch::dynamo::python_autograd {

namespace py = pybind11;
using torch::autograd::Engine;
using torch::autograd::InputBuffer;
using torch::autograd::edge_list;

namespace {

py::module_ python_engine() {
  return py::module_::import("torch._compiled_autograd");
}

// Turns Dynamo's frame callback off in this thread while the engine's own
// Python runs. A backward called inside a torch.compile'd function (at its
// graph break) inherits that function's callback, and Dynamo compiled the
// frames the engine calls: weakref's functions while capturing, a guard's
// Python lambda on every cache hit. What compiler_fn made of a graph sets
// its own callback when called. User code the engine runs outside a
// compiled graph (final callbacks, the eager fallback) keeps the caller's.
class DynamoFrameCallbackOff {
 public:
  DynamoFrameCallbackOff() : prior_(set_eval_frame()(py::none())) {}
  ~DynamoFrameCallbackOff() {
    try {
      set_eval_frame()(prior_);
    } catch (const py::error_already_set&) {
      // set_eval_frame only swaps a thread-state pointer.
    }
  }
  DynamoFrameCallbackOff(const DynamoFrameCallbackOff&) = delete;
  DynamoFrameCallbackOff& operator=(const DynamoFrameCallbackOff&) = delete;

 private:
  static const py::object& set_eval_frame() {
    // Leaked: destroying it after the interpreter has finalized would crash.
    static const auto* function = new py::object(
        py::module_::import("torch._C._dynamo.eval_frame")
            .attr("set_eval_frame"));
    return *function;
  }

  py::object prior_;
};

struct CompiledGraph {
  py::object compiled;
  // Enough of the captured BackwardGraph to say how a later one differs.
  std::vector<size_t> node_key_ends;
  std::vector<std::string> node_names;
};

// Captured-and-compiled graphs by BackwardGraph::key. Touched only with the
// GIL held.
struct CompiledGraphs {
  std::unordered_map<std::string, CompiledGraph> by_key;
  // Captures per sequence of node names (node_names_key): graphs of the same
  // nodes whose keys differ in values libtorch compiles into a node's
  // backward, such as an op's Scalar argument. Bounded like Dynamo's
  // recompiles of one frame, so a value that changes every backward does not
  // capture and compile every backward.
  std::unordered_map<std::string, int64_t> captures_by_node_names;
  // The entry the previous backward used: a miss is explained against it.
  const std::pair<const std::string, CompiledGraph>* last_used = nullptr;
};

// One cache per value of compiled_autograd_symbolic_sizes: a graph compiled
// with Dynamo's default shape handling must not serve an installation that
// asked for symbolic sizes, nor the other way round.
std::array<CompiledGraphs, 2>& all_compiled_graphs() {
  static auto* caches = new std::array<CompiledGraphs, 2>();
  return *caches;
}
bool symbolic_sizes = false;

CompiledGraphs& compiled_graphs() {
  return all_compiled_graphs()[symbolic_sizes];
}

size_t node_key_begin(const std::vector<size_t>& node_key_ends, size_t i) {
  return i == 0 ? 0 : node_key_ends[i - 1];
}

// How many leading nodes of `graph` have the same part of the key as in a
// cached graph.
size_t common_nodes(
    const BackwardGraph& graph,
    const std::string& cached_key,
    const CompiledGraph& cached) {
  size_t common =
      std::min(graph.node_key_ends.size(), cached.node_key_ends.size());
  for (size_t i = 0; i < common; ++i) {
    size_t begin = node_key_begin(graph.node_key_ends, i);
    size_t end = graph.node_key_ends[i];
    if (end != cached.node_key_ends[i] ||
        graph.key.compare(begin, end - begin, cached_key, begin, end - begin) !=
            0) {
      return i;
    }
  }
  return common;
}

// Why `graph` missed the cache. `reason` compares it with the graph the
// previous backward used; the other fields locate the first node that no
// cached graph has after the same nodes (the legacy engine's "new autograd
// node", whose cache is a trie of nodes), with the size of its part of the
// key and those of the cached graphs at that position.
struct CacheMiss {
  std::string reason;
  size_t node_index = 0;
  std::string node_name;
  size_t key_size = 0;
  std::vector<size_t> previous_key_sizes;
};

std::string compare_with_previous(const BackwardGraph& graph) {
  const auto* previous = compiled_graphs().last_used;
  if (previous == nullptr) {
    return "no graph captured yet";
  }
  const auto& [previous_key, previous_graph] = *previous;
  size_t i = common_nodes(graph, previous_key, previous_graph);
  if (i < graph.nodes.size() && i < previous_graph.node_names.size()) {
    std::string name = graph.nodes[i].node->name();
    const std::string& previous_name = previous_graph.node_names[i];
    return "node " + std::to_string(i) + " (" + name + ") " +
        (name == previous_name ? "has different saved state, hooks or edges"
                               : "replaces " + previous_name) +
        " compared with the previous backward's graph";
  }
  return "the graph has " + std::to_string(graph.nodes.size()) +
      " nodes, the previous backward's had " +
      std::to_string(previous_graph.node_names.size());
}

CacheMiss explain_cache_miss(const BackwardGraph& graph) {
  TORCH_INTERNAL_ASSERT(!graph.nodes.empty());
  CacheMiss miss{compare_with_previous(graph)};
  std::vector<size_t> common_per_graph;
  for (const auto& [key, cached] : compiled_graphs().by_key) {
    common_per_graph.push_back(common_nodes(graph, key, cached));
    miss.node_index = std::max(miss.node_index, common_per_graph.back());
  }
  // A graph that is a prefix of a cached one is new at its last node.
  miss.node_index =
      std::min(miss.node_index, graph.nodes.size() - 1);
  miss.node_name = graph.nodes[miss.node_index].node->name();
  miss.key_size = graph.node_key_ends[miss.node_index] -
      node_key_begin(graph.node_key_ends, miss.node_index);
  size_t position = 0;
  for (const auto& [key, cached] : compiled_graphs().by_key) {
    if (common_per_graph[position++] >= miss.node_index &&
        miss.node_index < cached.node_key_ends.size()) {
      miss.previous_key_sizes.push_back(
          cached.node_key_ends[miss.node_index] -
          node_key_begin(cached.node_key_ends, miss.node_index));
    }
  }
  return miss;
}

// The modes' class names, innermost first: the user may not know that a
// context manager they entered (allow_mutation_on_saved_tensors, a
// FlopCounterMode, ...) is one. Called with the GIL held.
std::string active_dispatch_modes() {
  using c10::impl::TorchDispatchModeTLS;
  std::string names;
  for (int64_t i = TorchDispatchModeTLS::stack_len() - 1; i >= 0; --i) {
    PyObject* mode =
        TorchDispatchModeTLS::get_stack_at(i)->ptr(getPyInterpreter());
    names += (names.empty() ? "" : ", ") + std::string(Py_TYPE(mode)->tp_name);
  }
  return names;
}

std::optional<Unsupported> unsupported_mode() {
  if (torch::autograd::AnomalyMode::is_enabled()) {
    return Unsupported{
        "anomaly detection (torch.autograd.detect_anomaly) is enabled", false};
  }
  if (torch::autograd::GradMode::is_enabled()) {
    return Unsupported{
        "create_graph=True (a compiled backward would be differentiable only "
        "once, eager's any number of times)",
        false};
  }
  if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    return Unsupported{
        "a TorchDispatchMode is active (" + active_dispatch_modes() + ")",
        false};
  }
  // Saved dual tensors then carry tangents, which AOTAutograd refuses
  // ("Trying to use forward AD with aten::copy"). Levels do not nest, so the
  // active one is level 0.
  if (torch::autograd::ForwardADLevel::try_get_by_idx(0) != nullptr) {
    return Unsupported{
        "a forward-mode AD level (torch.autograd.forward_ad.dual_level) is "
        "active",
        false};
  }
  return std::nullopt;
}

// Runs the backward on libtorch's eager engine instead, on the graph task
// Engine::execute prepared before handing it to us.
variable_list run_on_eager_engine(
    const c10::intrusive_ptr<Node>& graph_root,
    const GraphTask& graph_task,
    const Unsupported& why) {
  auto report = [&why](bool warn) {
    python_engine().attr("_report_eager_fallback")(why.reason, warn);
  };
  if (!why.eager_may_raise) {
    report(true);
  }
  // Engine::execute owns the task through a shared_ptr; we were only lent a
  // reference to it.
  std::shared_ptr<GraphTask> task =
      const_cast<GraphTask&>(graph_task).shared_from_this();
  variable_list grads;
  try {
    py::gil_scoped_release no_gil;
    auto future = Engine::get_default_engine().execute_with_graph_task(
        task, graph_root, InputBuffer(variable_list()));
    future->wait();
    grads = future->value().toTensorVector();
  } catch (...) {
    if (why.eager_may_raise) {
      try {
        report(false);
      } catch (const py::error_already_set&) {
        // The backward's own error is the one to raise.
      }
    }
    throw;
  }
  if (why.eager_may_raise) {
    report(true);
  }
  return grads;
}

py::list describe_nodes(const BackwardGraph& graph) {
  py::list nodes;
  for (const auto& record : graph.nodes) {
    py::list next_edges;
    for (const auto& edge : record.next_edges) {
      next_edges.append(edge ? py::cast(*edge) : py::none());
    }
    py::list tensor_pre_hooks;
    for (const auto& hook : record.tensor_pre_hooks) {
      tensor_pre_hooks.append(
          py::make_tuple(hook.is_python, hook.index, hook.input_nr));
    }
    py::dict node;
    node["name"] = record.node->name();
    node["kind"] = static_cast<int>(record.kind);
    node["num_inputs"] = record.node->num_inputs();
    node["needed"] = record.needed;
    node["next_edges"] = next_edges;
    node["captures"] = record.captures;
    node["tensor_pre_hooks"] = tensor_pre_hooks;
    node["pre_hooks"] = record.pre_hooks;
    node["post_hooks"] = record.post_hooks;
    node["post_acc_grad_hooks"] = record.post_acc_grad_hooks;
    node["unpack_hooks"] = record.unpack_hooks;
    node["python_ctx"] = record.python_ctx;
    node["backward_state"] = record.backward_state;
    node["saved_layout"] = record.saved_layout;
    const THPFunction* ctx = record.python_ctx < 0
        ? nullptr
        : reinterpret_cast<THPFunction*>(
              static_cast<const torch::autograd::PyNode&>(*record.node).pyobj());
    node["is_variable_input"] =
        ctx ? ctx->is_variable_input : std::vector<bool>();
    node["num_symints"] = ctx ? ctx->compiled_autograd_symints.size() : 0;
    node["aot_forward_cls"] = record.kind == NodeKind::kAotBackward
        ? py::object(py::handle(reinterpret_cast<PyObject*>(
                                    const_cast<THPFunction*>(ctx)))
                         .attr("_forward_cls"))
        : py::object(py::none());
    node["saved_tensors"] = record.tensor_ids;
    node["sizes"] = py::make_tuple(record.sizes_begin, record.sizes_end);
    node["saved_scalars"] =
        py::make_tuple(record.scalars_begin, record.scalars_end);
    nodes.append(node);
  }
  return nodes;
}

std::vector<std::string> node_names(const BackwardGraph& graph) {
  std::vector<std::string> names;
  names.reserve(graph.nodes.size());
  for (const auto& record : graph.nodes) {
    names.push_back(record.node->name());
  }
  return names;
}

std::string node_names_key(const std::vector<std::string>& names) {
  std::string key;
  for (const auto& name : names) {
    key += name;
    key += '\n';
  }
  return key;
}

// The compiled function cached for `graph`'s key; null on a miss.
py::object cached_graph(const BackwardGraph& graph) {
  auto& cache = compiled_graphs();
  auto it = cache.by_key.find(graph.key);
  if (it == cache.by_key.end()) {
    return py::object();
  }
  cache.last_used = &*it;
  return it->second.compiled;
}

// Why `graph`, a cache miss, must not be captured: graphs of the same nodes
// were captured torch._dynamo.config.recompile_limit times already.
std::optional<Unsupported> capture_limit_reached(const BackwardGraph& graph) {
  auto& captures = compiled_graphs().captures_by_node_names;
  auto it = captures.find(node_names_key(node_names(graph)));
  if (it == captures.end()) {
    return std::nullopt;
  }
  auto limit = python_engine()
                   .attr("_captures_allowed_per_graph")()
                   .cast<int64_t>();
  if (it->second < limit) {
    return std::nullopt;
  }
  return Unsupported{
      "the same autograd graph (" + std::to_string(graph.nodes.size()) +
          " nodes) was captured " + std::to_string(it->second) +
          " times (torch._dynamo.config.recompile_limit), each time with "
          "other values compiled into it or other hooks; this time " +
          compare_with_previous(graph) +
          ". A number passed to an op that changes between backwards (clamp's "
          "min or max, leaky_relu's negative_slope, pow's exponent, add's "
          "alpha) is part of the graph: pass it as a tensor to reuse one "
          "graph. Hooks registered again before every backward add up: "
          "register them once. Or raise torch._dynamo.config.recompile_limit",
      false};
}

// Captures and compiles `graph`, a cache miss, and caches the result.
py::object capture_and_compile(BackwardGraph& graph) {
  classify_custom_functions(graph);
  CacheMiss miss = explain_cache_miss(graph);
  py::list related_dims;
  for (const auto& relation : relate_sizes(graph)) {
    related_dims.append(py::make_tuple(
        relation.size_index,
        relation.tensor_index,
        relation.dim_begin,
        relation.dim_end));
  }
  py::object compiled = python_engine().attr("_capture")(
      describe_nodes(graph),
      graph.num_outputs,
      graph.tensors.size(),
      miss.reason,
      py::make_tuple(
          miss.node_index,
          miss.node_name,
          miss.key_size,
          miss.previous_key_sizes),
      related_dims);
  std::vector<std::string> names = node_names(graph);
  auto& cache = compiled_graphs();
  cache.captures_by_node_names[node_names_key(names)] += 1;
  auto it =
      cache.by_key
          .emplace(
              graph.key,
              CompiledGraph{compiled, graph.node_key_ends, std::move(names)})
          .first;
  cache.last_used = &*it;
  return it->second.compiled;
}

py::object scalar_to_python(const c10::IValue& scalar) {
  if (scalar.isDouble() || scalar.isSymFloat()) {
    return py::cast(scalar.toSymFloat());
  }
  return py::cast(scalar.toSymInt());
}

// What compiler_fn made of a captured graph must return what the GraphModule
// returns; a user's compiler that does not is told so, not given an internal
// assert or a bare "not iterable".
[[noreturn]] void refuse_compiled_result(const std::string& what) {
  TORCH_CHECK_TYPE(
      false,
      "compiled autograd: the function that compiler_fn returned for a captured "
      "graph ",
      what,
      "; it must return what calling the captured GraphModule returns: a list "
      "with one gradient (a Tensor or None) per graph output");
}

variable_list gradients_returned(const py::object& result, size_t num_outputs) {
  if (!PyList_Check(result.ptr()) && !PyTuple_Check(result.ptr())) {
    refuse_compiled_result(
        "returned " + std::string(Py_TYPE(result.ptr())->tp_name));
  }
  auto values = py::reinterpret_borrow<py::sequence>(result);
  if (values.size() != num_outputs) {
    refuse_compiled_result(
        "returned a sequence of length " + std::to_string(values.size()) +
        " for a graph of " + std::to_string(num_outputs) + " outputs");
  }
  variable_list grads;
  grads.reserve(num_outputs);
  for (const auto& grad : values) {
    if (grad.is_none()) {
      grads.emplace_back();
    } else if (THPVariable_Check(grad.ptr())) {
      grads.emplace_back(THPVariable_Unpack(grad.ptr()));
    } else {
      refuse_compiled_result(
          "returned a " + std::string(Py_TYPE(grad.ptr())->tp_name) +
          " where a gradient belongs");
    }
  }
  return grads;
}

variable_list run_compiled(const py::object& compiled, BackwardGraph& graph) {
  // The compiled graph may steal this list and free each tensor after its
  // last use; nothing else may keep them alive (see detach_saved_values).
  py::list tensors = py::cast(graph.tensors);
  graph.tensors.clear();
  py::list sizes = py::cast(graph.sizes);
  py::list scalars;
  for (const auto& scalar : graph.scalars) {
    scalars.append(scalar_to_python(scalar));
  }
  py::list hooks;
  for (auto& hook : graph.hooks) {
    hooks.append(py::reinterpret_steal<py::object>(hook.release()));
  }
  graph.hooks.clear();
  // call_hook keeps here the index of the hook it called last.
  py::list progress;
  progress.append(-1);
  hooks.append(progress);
  py::list packed_data;
  for (auto& packed : graph.packed_data) {
    packed_data.append(py::reinterpret_steal<py::object>(packed.release()));
  }
  graph.packed_data.clear();
  graph.running_hooks = hooks.ptr();
  auto not_running =
      c10::make_scope_exit([&graph] { graph.running_hooks = nullptr; });
  py::object result = compiled(tensors, sizes, scalars, hooks, packed_data);
  return gradients_returned(result, graph.num_outputs);
}

// A hook that registers a hook on a node of the running graph: the eager
// engine would run the new hook if its node had not run yet, the captured
// graph runs only those registered when it was collected. Which case it was
// is not known here, so the backward fails rather than leave gradients that
// may differ from eager's.
void refuse_hooks_registered_while_running(const BackwardGraph& graph) {
  for (const auto& record : graph.nodes) {
    if (registered_hooks(*record.node) + record.hooks_removed >
        record.hooks_registered) {
      TORCH_CHECK(
          false,
          "compiled autograd: a hook was registered on ",
          record.node->name(),
          " (or on a tensor it computes the gradient of) while this backward ran. "
          "The compiled backward runs the hooks that were registered when it "
          "started, so this backward's gradients may differ from eager "
          "autograd's. Register hooks before calling backward, or run this "
          "backward under torch._dynamo.compiled_autograd._disable()");
    }
  }
}

void release_saved_variables(BackwardGraph& graph, const GraphTask& graph_task) {
  if (!graph_task.keep_graph_) {
    for (auto& record : graph.nodes) {
      record.node->release_variables();
    }
  }
}

// Callbacks queued with queue_callback run after the last node, as on the
// eager engine.
void run_final_callbacks(const GraphTask& graph_task) {
  auto& task = const_cast<GraphTask&>(graph_task);
  std::unique_lock<std::mutex> lock(task.final_callbacks_lock_);
  // A callback may queue more callbacks.
  for (size_t i = 0; i < task.final_callbacks_.size(); ++i) {
    auto callback = task.final_callbacks_[i];
    lock.unlock();
    callback();
    lock.lock();
  }
}

variable_list run_backward(
    const c10::intrusive_ptr<Node>& graph_root,
    const GraphTask& graph_task,
    bool accumulate_grad,
    const edge_list& outputs) {
  py::gil_scoped_acquire gil;
  at::ThreadLocalStateGuard tls_guard(graph_task.thread_locals_);
  if (auto why = unsupported_mode()) {
    return run_on_eager_engine(graph_root, graph_task, *why);
  }
  std::optional<DynamoFrameCallbackOff> callback_off(std::in_place);
  auto collected = collect_backward_graph(
      graph_root, graph_task, accumulate_grad, outputs.size());
  if (auto* why = std::get_if<Unsupported>(&collected)) {
    callback_off.reset();
    return run_on_eager_engine(graph_root, graph_task, *why);
  }
  BackwardGraph& graph = std::get<BackwardGraph>(collected);
  py::object compiled = cached_graph(graph);
  if (!compiled) {
    if (auto why = capture_limit_reached(graph)) {
      // Frees the collected graph, and the tensors it holds, before eager
      // runs; `graph` is not used again.
      collected = std::move(*why);
      callback_off.reset();
      return run_on_eager_engine(
          graph_root, graph_task, std::get<Unsupported>(collected));
    }
  }
  ActiveBackward active(graph);
  if (!compiled) {
    compiled = capture_and_compile(graph);
  }
  detach_saved_values(graph, graph_task.keep_graph_);
  variable_list grads = run_compiled(compiled, graph);
  callback_off.reset();
  release_saved_variables(graph, graph_task);
  refuse_hooks_registered_while_running(graph);
  run_final_callbacks(graph_task);
  return grads;
}

variable_list to_variable_list(
    const std::vector<std::optional<at::Tensor>>& values) {
  variable_list result;
  result.reserve(values.size());
  for (const auto& value : values) {
    result.emplace_back(value.value_or(at::Tensor()));
  }
  return result;
}

std::vector<c10::IValue> to_scalars(
    const NodeRecord& record,
    const py::list& values) {
  const auto& lifted = record.call->lifted_ivalue_args.args;
  TORCH_CHECK(
      values.size() == lifted.size(),
      "apply_with_saved(",
      record.node->name(),
      "): expected ",
      lifted.size(),
      " scalars, got ",
      values.size());
  std::vector<c10::IValue> scalars;
  scalars.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const c10::IValue& original = *lifted[i].actual_ptr;
    if (original.isDouble() || original.isSymFloat()) {
      scalars.emplace_back(py::cast<c10::SymFloat>(values[i]));
    } else {
      scalars.emplace_back(py::cast<c10::SymInt>(values[i]));
    }
  }
  return scalars;
}

} // namespace
} // namespace torch::dynamo::python_autograd

PYBIND11_MODULE(_compiled_autograd_C, m) {
  using namespace torch::dynamo::python_autograd;
  m.doc() =
      "C++ half of the Python compiled autograd engine "
      "(torch/_compiled_autograd.py).";

  m.def(
      "install",
      [](bool enabled, bool symbolic) {
        symbolic_sizes = symbolic;
        Engine::set_compiled_autograd(enabled ? &run_backward : nullptr);
      },
      "Routes every backward to the Python engine (True) or to nothing "
      "(False: eager autograd, unless the legacy engine installs itself); "
      "`symbolic` selects the cache of graphs compiled with symbolic sizes.");
  m.def(
      "skip_hook_removed_before_its_turn",
      [](py::handle dict, py::handle key, py::handle stand_in) {
        ActiveBackward::skip_hook_removed_before_its_turn(
            dict.ptr(), key.ptr(), stand_in.ptr());
      },
      "Called before a RemovableHandle deletes dict[key]; see node_apply.h.");
  m.def("clear_cache", []() {
    for (auto& cache : all_compiled_graphs()) {
      cache.last_used = nullptr;
      cache.by_key.clear();
      cache.captures_by_node_names.clear();
    }
  });
  m.def("cache_size", []() {
    size_t size = 0;
    for (const auto& cache : all_compiled_graphs()) {
      size += cache.by_key.size();
    }
    return size;
  });

  m.def(
      "apply_with_saved",
      [](int64_t node_idx,
         const std::vector<std::optional<at::Tensor>>& inputs,
         const std::vector<std::optional<at::Tensor>>& saved_tensors,
         const std::vector<c10::SymInt>& sizes,
         const py::list& saved_scalars,
         const std::vector<std::optional<at::Tensor>>& unpacked) {
        // One op per node rather than two keeps the captured graph, and
        // what Dynamo traces, small.
        NodeRecord& record = ActiveBackward::node(node_idx);
        return validate_outputs(
            record,
            apply_with_saved(
                record,
                to_variable_list(inputs),
                to_variable_list(saved_tensors),
                sizes,
                to_scalars(record, saved_scalars),
                to_variable_list(unpacked)),
            sizes);
      });
  m.def(
      "validate_outputs",
      [](int64_t node_idx,
         const std::vector<std::optional<at::Tensor>>& outputs,
         const std::vector<c10::SymInt>& sizes) {
        return validate_outputs(
            ActiveBackward::node(node_idx), to_variable_list(outputs), sizes);
      });
  m.def(
      "apply_eagerly",
      [](int64_t node_idx,
         const std::vector<std::optional<at::Tensor>>& inputs) {
        return apply_eagerly(
            ActiveBackward::node(node_idx), to_variable_list(inputs));
      });
  m.def("accumulate_grad", &accumulate_grad);
  m.def(
      "materialize_grads",
      [](int64_t node_idx,
         const std::vector<std::optional<at::Tensor>>& grads,
         const std::vector<c10::SymInt>& sizes) {
        return materialize_grads(
            ActiveBackward::node(node_idx), to_variable_list(grads), sizes);
      });
  m.def(
      "call_cpp_tensor_pre_hook",
      [](int64_t node_idx, int64_t hook_idx, const at::Tensor& grad) {
        return call_cpp_tensor_pre_hook(
            ActiveBackward::node(node_idx), hook_idx, grad);
      });
}
