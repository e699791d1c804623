#include <torch/csrc/dynamo/python_autograd/backward_graph.h>

#include <ATen/MemoryOverlap.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/PyInterpreter.h>
#include <torch/csrc/autograd/cpp_hook.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/generated/Functions.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/python_function.h>
#include <torch/csrc/autograd/python_hook.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstring>
#include <queue>
#include <string_view>
#include <typeinfo>
#include <unordered_map>
#include <unordered_set>

namespace torch::dynamo::python_autograd {

using torch::autograd::AccumulateGrad;
using torch::dynamo::autograd::CompiledNodeArgs;
using torch::dynamo::autograd::SizeInput;
namespace py = pybind11;

namespace {

bool runs_in_task(const GraphTask& task, Node* fn) {
  if (task.exec_info_.empty()) {
    return true;
  }
  auto it = task.exec_info_.find(fn);
  return it != task.exec_info_.end() && it->second.should_execute();
}

bool is_needed(const GraphTask& task, Node* fn) {
  return task.exec_info_.empty() || task.exec_info_.at(fn).needed_;
}

// The order in which Engine::execute runs the nodes on the CPU: a max-heap of
// ready nodes keyed by sequence number (AccumulateGrad has UINT64_MAX, so it
// runs as soon as it is ready). Using the same heap type with the same
// comparison results and the same push order reproduces eager's order, ties
// included, which is what makes hook side effects happen in eager's order.
std::vector<Node*> eager_execution_order(Node* root, const GraphTask& task) {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen{root};
  std::vector<Node*> stack{root};
  while (!stack.empty()) {
    Node* fn = stack.back();
    stack.pop_back();
    for (const auto& edge : fn->next_edges()) {
      Node* next = edge.function.get();
      if (next == nullptr || !runs_in_task(task, next)) {
        continue;
      }
      dependencies[next] += 1;
      if (seen.insert(next).second) {
        stack.push_back(next);
      }
    }
  }

  struct Ready {
    uint64_t sequence_nr;
    Node* fn;
  };
  auto runs_later = [](const Ready& a, const Ready& b) {
    return a.sequence_nr < b.sequence_nr;
  };
  std::priority_queue<Ready, std::vector<Ready>, decltype(runs_later)> ready(
      runs_later);
  ready.push({root->sequence_nr(), root});
  std::vector<Node*> order;
  order.reserve(seen.size());
  while (!ready.empty()) {
    Node* fn = ready.top().fn;
    ready.pop();
    order.push_back(fn);
    for (const auto& edge : fn->next_edges()) {
      Node* next = edge.function.get();
      if (next == nullptr || !runs_in_task(task, next)) {
        continue;
      }
      if (--dependencies[next] == 0) {
        ready.push({next->sequence_nr(), next});
      }
    }
  }
  return order;
}

template <typename T>
void append_to_key(std::string& key, const T& value) {
  key.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// libtorch's hook types do not export their type_info, so a hook's type is
// recognised by its mangled name.
template <typename Hook>
bool has_type_name(const Hook& hook, const char* mangled_name) {
  return std::strcmp(typeid(hook).name(), mangled_name) == 0;
}

// Tensor.register_hook from C++ installs a CppFunctionTensorPreHook, which
// has no compiled_args.
bool is_cpp_tensor_pre_hook(const torch::autograd::FunctionPreHook& hook) {
  return has_type_name(hook, "N5torch8autograd24CppFunctionTensorPreHookE");
}

// Registers each function of a CppFunctionTensorPreHook as a C++ tensor
// pre-hook, the way retain_grad's hook registers itself.
struct CppTensorPreHooks {
  explicit CppTensorPreHooks(
      const torch::autograd::CppFunctionTensorPreHook& hooks)
      : hooks(hooks) {}
  void compiled_args(CompiledNodeArgs& args) const {
    for (const auto& function : *hooks.hooks_) {
      if (function) { // removed hooks stay in the list, empty
        args.add_cpp_single_tensor_pre_hook(function, hooks.value_idx_);
      }
    }
  }
  const torch::autograd::CppFunctionTensorPreHook& hooks;
};

// The dict holding a Python hook type's functions, if `hook` is a `Derived`
// (whose mangled name is `mangled_name`), else null.
template <typename Derived, typename Base>
PyObject* python_hook_dict(const Base& hook, const char* mangled_name) {
  return has_type_name(hook, mangled_name)
      ? static_cast<const Derived&>(hook).dict
      : nullptr;
}

// The dict a Python hook object keeps its functions in; null for C++ hooks.
PyObject* python_dict_of(const torch::autograd::FunctionPreHook& hook) {
  using namespace torch::autograd;
  PyObject* dict = python_hook_dict<PyFunctionTensorPreHook>(
      hook, "N5torch8autograd23PyFunctionTensorPreHookE");
  return dict != nullptr ? dict
                         : python_hook_dict<PyFunctionPreHook>(
                               hook, "N5torch8autograd17PyFunctionPreHookE");
}

PyObject* python_dict_of(const torch::autograd::FunctionPostHook& hook) {
  return python_hook_dict<torch::autograd::PyFunctionPostHook>(
      hook, "N5torch8autograd18PyFunctionPostHookE");
}

PyObject* python_dict_of(const CppTensorPreHooks& /*hooks*/) {
  return nullptr;
}

PyObject* python_dict_of(const torch::autograd::PostAccumulateGradHook& hook) {
  return python_hook_dict<torch::autograd::PyFunctionTensorPostAccGradHooks>(
      hook, "N5torch8autograd32PyFunctionTensorPostAccGradHooksE");
}

size_t functions_in(PyObject* dict) {
  return dict == nullptr ? 1 : static_cast<size_t>(PyDict_Size(dict));
}

size_t hook_functions(const torch::autograd::FunctionPreHook& hook) {
  if (is_cpp_tensor_pre_hook(hook)) {
    const auto& functions =
        *static_cast<const torch::autograd::CppFunctionTensorPreHook&>(hook)
             .hooks_;
    return std::count_if(functions.begin(), functions.end(), [](const auto& f) {
      return static_cast<bool>(f);
    });
  }
  return functions_in(python_dict_of(hook));
}

template <typename Hook>
size_t hook_functions(const Hook& hook) {
  return functions_in(python_dict_of(hook));
}

} // namespace

size_t registered_hooks(Node& fn) {
  size_t count = fn.retains_grad_hooks().size();
  for (const auto& hook : fn.tensor_pre_hooks()) {
    count += hook_functions(*hook);
  }
  for (const auto& hook : fn.pre_hooks()) {
    count += hook_functions(*hook);
  }
  for (const auto& hook : fn.post_hooks()) {
    count += hook_functions(*hook);
  }
  if (const auto& hook = fn.tensor_post_acc_grad_hooks(); hook != nullptr) {
    count += hook_functions(*hook);
  }
  return count;
}

namespace {

// Lifts a hook object's functions with its own compiled_args and, for a
// Python hook object, records which dict and keys they came from.
template <typename Hook>
void lift_hook(CompiledNodeArgs& args, NodeRecord& record, const Hook& hook) {
  const auto& lifted = record.call->hooks;
  size_t begin = lifted.size();
  hook.compiled_args(args);
  PyObject* dict = python_dict_of(hook);
  if (dict == nullptr || lifted.size() == begin) {
    return;
  }
  LiftedHookDict& from = record.hook_dicts.emplace_back(
      LiftedHookDict{dict, static_cast<int>(begin), {}});
  PyObject* key = nullptr;
  PyObject* value = nullptr;
  Py_ssize_t position = 0;
  while (PyDict_Next(dict, &position, &key, &value)) {
    Py_INCREF(key);
    from.keys.emplace_back(key, getPyInterpreter());
  }
  TORCH_INTERNAL_ASSERT(from.keys.size() == lifted.size() - begin);
}

// Collects the node's hooks the way CompiledNodeArgs::collect(NodeCall) does,
// but one hook at a time, so that Python and C++ tensor pre-hooks keep the
// relative order in which the eager engine calls them.
void collect_hooks(CompiledNodeArgs& args, NodeRecord& record) {
  Node& fn = *record.node;
  NodeCall& node_call = *record.node_call;
  auto collect_tensor_pre_hook = [&](const auto& hook) {
    size_t python_before = node_call.tensor_pre_hooks.size();
    size_t cpp_before = node_call.cpp_tensor_pre_hooks.size();
    lift_hook(args, record, hook);
    for (size_t i = python_before; i < node_call.tensor_pre_hooks.size(); ++i) {
      const auto& [index, input_nr] = node_call.tensor_pre_hooks[i];
      record.tensor_pre_hooks.push_back({true, index, input_nr});
    }
    for (size_t i = cpp_before; i < node_call.cpp_tensor_pre_hooks.size();
         ++i) {
      const auto& [index, input_nr] = node_call.cpp_tensor_pre_hooks[i];
      record.tensor_pre_hooks.push_back({false, index, input_nr});
    }
  };
  for (const auto& hook : fn.tensor_pre_hooks()) {
    if (is_cpp_tensor_pre_hook(*hook)) {
      collect_tensor_pre_hook(CppTensorPreHooks(
          static_cast<const torch::autograd::CppFunctionTensorPreHook&>(
              *hook)));
    } else {
      collect_tensor_pre_hook(*hook);
    }
  }
  for (const auto& [_, hook] : fn.retains_grad_hooks()) {
    collect_tensor_pre_hook(*hook);
  }
  for (const auto& hook : fn.pre_hooks()) {
    lift_hook(args, record, *hook);
  }
  for (const auto& hook : fn.post_hooks()) {
    lift_hook(args, record, *hook);
  }
  args.collect(node_call.graph_output);
  args.collect_size(record.tensor_pre_hooks.size());
  args.collect_size(node_call.pre_hooks.size());
  args.collect_size(node_call.post_hooks.size());
}

// AccumulateGrad's own compiled_args lifts variable.grad, which would make
// the key change when .grad goes from None to a tensor. The graph calls
// inductor.accumulate_grad_, which reads .grad when it runs, so only the
// variable is lifted here.
//
// Eager adds into a .grad in place, and refuses one whose elements share
// memory (an expanded tensor assigned to .grad), or an inference tensor
// outside inference mode (a .grad made under torch.inference_mode). Traced,
// the first add failed in the backend's compile, with Dynamo's
// BackendCompilerFailed, and Inductor's kernel made the second one without a
// word; raising a c10::Error here runs the backward on the eager engine,
// which raises its own error.
void collect_accumulate_grad(
    CompiledNodeArgs& args,
    NodeRecord& record,
    AccumulateGrad& fn) {
  const at::Tensor& variable = fn.variable;
  if (args.cond(variable.defined() && variable.requires_grad())) {
    args.collect(variable);
    const at::Tensor& grad = variable.grad();
    TORCH_CHECK(
        !grad.defined() || grad.layout() != c10::kStrided ||
            at::has_internal_overlap(grad) != at::MemOverlap::Yes,
        "the .grad of a leaf the backward accumulates into has elements "
        "that share memory (e.g. an expanded tensor), which eager's "
        "in-place accumulation refuses");
    TORCH_CHECK(
        !grad.defined() || !grad.is_inference() || grad.is_sparse() ||
            c10::InferenceMode::is_enabled(),
        "the .grad of a leaf the backward accumulates into is an inference "
        "tensor, which eager's in-place accumulation refuses outside "
        "inference mode");
    // The add into .grad reads and writes its memory in a kernel that would
    // not see the negative bit (as in materialized()), and must write into
    // the .grad itself, not a copy.
    TORCH_CHECK_NOT_IMPLEMENTED(
        !grad.defined() || !grad.is_neg(),
        "the .grad of a leaf the backward accumulates into has its negative "
        "bit set (a view such as z.conj().imag was assigned to it); assign "
        "it t.resolve_neg() to run its backward compiled");
  }
  if (const auto& hook = fn.tensor_post_acc_grad_hooks(); hook != nullptr) {
    lift_hook(args, record, *hook);
  }
}

// What validate_outputs needs of the next edges: their input metadata, with
// its shapes lifted. CompiledNodeArgs::collect(edge_list) would also number
// each target node in the node's own call, which costs an allocation per
// edge; the graph-wide edge structure is part of our key instead.
void collect_edge_metadata(CompiledNodeArgs& args, const Node& fn) {
  args.collect_size(fn.next_edges().size());
  for (const auto& edge : fn.next_edges()) {
    if (args.cond(edge.is_valid())) {
      args.collect(edge.function->input_metadata(edge.input_nr));
    }
  }
}

THPFunction* python_function_ctx(const Node& fn) {
  return reinterpret_cast<THPFunction*>(
      static_cast<const torch::autograd::PyNode&>(fn).pyobj());
}

// Python autograd.Functions whose backward the graph can call itself. The
// others run as themselves: Functions carrying opaque objects, Functions
// whose saved tensors have saved-tensor hooks, and backwards of compiled
// regions that torch._compiled_autograd cannot inline (tensor subclasses,
// RNG state, ...; see _aot_backward_inlinable).
bool callable_in_graph(const Node& fn, THPFunction* ctx) {
  for (const auto& saved : ctx->saved_variables) {
    if (saved.has_hooks()) {
      return false;
    }
  }
  py::handle handle(reinterpret_cast<PyObject*>(ctx));
  if (py::hasattr(handle, "opaque_objects") &&
      py::len(handle.attr("opaque_objects")) != 0) {
    return false;
  }
  if (!fn.is_aot_backward()) {
    return true;
  }
  // Imported once and never released: it lives as long as the module.
  static py::handle inlinable = py::object(
                                    py::module::import("torch._compiled_autograd")
                                        .attr("_aot_backward_inlinable"))
                                    .release();
  return inlinable(handle.attr("_forward_cls")).cast<bool>();
}

// A region that Dynamo compiled with compiled autograd on, and that registers
// hooks on its intermediates, keeps them in a BackwardState that only the
// graph can bind (its backward asserts when run as itself): it must inline.
bool backward_callable_in_graph(const Node& fn) {
  THPFunction* ctx = python_function_ctx(fn);
  bool callable = callable_in_graph(fn, ctx);
  if (!callable && ctx->compiled_autograd_backward_state != nullptr) {
    throw UnrunnableBackward(
        "the backward of a torch.compile'd region that registers hooks on "
        "its intermediate tensors (" +
        fn.name() +
        ", compiled while compiled autograd was enabled, so Dynamo put the "
        "hooks into a BackwardState) can only run inlined in the captured "
        "graph, and this region cannot be (tensor subclasses, RNG state, "
        "saved-tensor hooks or opaque objects). Set "
        "torch._dynamo.config.compiled_autograd_engine = 'legacy' before "
        "compiling the region, or register the hook outside the compiled "
        "region.");
  }
  return callable;
}

// A C++ node that keeps Node's compiled_args (forward AD's Identity,
// UndefinedGrad, a Node subclass of an extension) says nothing of its saved
// values, so they cannot be lifted: it runs as itself, behind a graph break,
// instead of sending the whole backward to the eager engine. Node's
// compiled_args throws before collecting anything.
bool lifts_saved_values(CompiledNodeArgs& args, const Node& fn) {
  try {
    fn.compiled_args(args);
    return true;
  } catch (const c10::NotImplementedError& e) {
    static constexpr std::string_view kNodesOwn =
        "compiled_args not implemented: ";
    if (std::string_view(e.msg()).substr(0, kNodesOwn.size()) != kNodesOwn) {
      throw;
    }
    return false;
  }
}

// Built-in nodes whose formula reads a saved tensor's values on the host,
// which Dynamo's FakeTensors do not have: _pack_padded_sequence_backward
// walks batch_sizes. Behind a graph break they run on the real tensors and
// the rest of the graph still compiles.
bool reads_saved_values_on_host(const Node& fn) {
  return typeid(fn) ==
      typeid(torch::autograd::generated::PackPaddedSequenceBackward0);
}

NodeKind kind_of(const Node& fn) {
  if (typeid(fn) == typeid(AccumulateGrad)) {
    return NodeKind::kAccumulateGrad;
  }
  if (reads_saved_values_on_host(fn)) {
    return NodeKind::kApplyWithSavedDynamoDisabled;
  }
  if (is_python_function(fn)) {
    if (!backward_callable_in_graph(fn)) {
      return NodeKind::kEager;
    }
    return fn.is_aot_backward() ? NodeKind::kAotBackward
                                : NodeKind::kPythonFunction;
  }
  return NodeKind::kApplyWithSaved;
}

// TensorArgs keeps its maps private: the one from a node's SavedVariables to
// their TensorArgs is the only list of a node's SavedVariables there is, and
// emptying a call for reuse must clear them all. Explicit instantiation of a
// template may name private members, which gives access to them without
// changing the type. member(Tag{}) is a pointer to the member Tag names.
template <typename Tag, typename Tag::type Member>
struct PrivateMember {
  friend typename Tag::type member(Tag) {
    return Member;
  }
};
using torch::dynamo::autograd::TensorArgs;
using ArgsByImplMap = std::unordered_map<const c10::TensorImpl*, TensorArg>;
using SavedVariableArgs =
    std::unordered_map<const torch::autograd::SavedVariable*, TensorArg*>;
#define PCA_PRIVATE_MEMBER(TAG, TYPE, NAME)          \
  struct TAG {                                       \
    using type = TYPE TensorArgs::*;                 \
    friend type member(TAG);                         \
  };                                                 \
  template struct PrivateMember<TAG, &TensorArgs::NAME>
PCA_PRIVATE_MEMBER(ArgsByImpl, ArgsByImplMap, _args);
PCA_PRIVATE_MEMBER(ArgsBySavedVariable, SavedVariableArgs, _saved_variables);
PCA_PRIVATE_MEMBER(
    ProxyArgsBySavedVariable,
    SavedVariableArgs,
    _saved_variables_proxies);
PCA_PRIVATE_MEMBER(UndefinedArg, TensorArg, _undefined);
PCA_PRIVATE_MEMBER(NextArgId, uint32_t, _next_id);
#undef PCA_PRIVATE_MEMBER

SavedVariableArgs& saved_variable_args(TensorArgs& args) {
  return args.*member(ArgsBySavedVariable{});
}

// Leaves `call` as a newly constructed one would be, capacity aside.
void empty_call(AutogradCompilerCall& call) {
  call.active_node_call_idx = std::nullopt;
  TensorArgs& tensor_args = call.tensor_args;
  tensor_args.inputs.clear();
  tensor_args.input_origins.clear();
  (tensor_args.*member(ArgsByImpl{})).clear();
  (tensor_args.*member(ArgsBySavedVariable{})).clear();
  (tensor_args.*member(ProxyArgsBySavedVariable{})).clear();
  tensor_args.*member(UndefinedArg{}) = TensorArg();
  tensor_args.*member(NextArgId{}) = 1;
  call.all_size_inputs.clear();
  call.lifted_ivalue_args.args.clear();
  call.lifted_ivalue_args.next = 0;
  call.lifted_ivalue_args.args_origins.clear();
  call.dyn_size_inputs.clear();
  call.hooks.clear();
  call.cpp_tensor_pre_hooks.clear();
  call.packed_inputs.clear();
  call.node_calls.clear();
  call.size_input_origins.clear();
  call.sv_to_hooks.clear();
  call.pynode_objs.clear();
}

// vmap's batched tensors: torch.autograd.grad's is_grads_batched batches
// with the legacy vmap (Batched), torch.func.vmap with FuncTorchBatched.
const c10::DispatchKeySet kBatchedKeys(
    {c10::DispatchKey::Batched, c10::DispatchKey::FuncTorchBatched});

// Refuses (NotImplementedError: the backward runs on the eager engine) a
// tensor Dynamo cannot take as a graph input.
void check_dynamo_takes_as_input(const at::Tensor& t) {
  if (!t.defined()) {
    return;
  }
  // Dynamo raised IndexError reading a sparse tensor's strides.
  TORCH_CHECK_NOT_IMPLEMENTED(
      t.layout() == c10::kStrided,
      "a tensor the backward reads (saved for backward, or a gradient "
      "passed in) has layout ",
      t.layout(),
      ", and Dynamo takes only strided tensors as graph inputs");
  // torch.autograd.grad(..., is_grads_batched=True) feeds in batched
  // gradients, which Dynamo cannot fake.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !t.key_set().has_any(kBatchedKeys),
      "a tensor the backward reads is batched (a gradient of "
      "torch.autograd.grad(..., is_grads_batched=True), or of a vmap), "
      "and Dynamo cannot take a batched tensor as a graph input");
  // materialized() below gives the graph real zeros for a ZeroTensor, but a
  // leaf's gradient must reach the leaf itself, and a compiled kernel that
  // read it would read through its null data pointer (plain torch.compile of
  // `x * y` with such an x crashes too).
  TORCH_CHECK_NOT_IMPLEMENTED(
      !(t._is_zerotensor() && t.requires_grad()),
      "a tensor the backward reads is a ZeroTensor "
      "(torch._efficientzerotensor) that requires grad, which has no memory "
      "for a compiled kernel to read; give it memory (e.g. torch.zeros) to "
      "run its backward compiled");
  // materialized() gives the graph the values a negative bit stands for, in a
  // copy; a leaf's gradient must reach the leaf itself, not the copy.
  TORCH_CHECK_NOT_IMPLEMENTED(
      !(t.is_neg() && t.is_leaf() && t.requires_grad()),
      "a tensor the backward reads is a leaf that requires grad and has its "
      "negative bit set (a view such as z.conj().imag, detached); make the "
      "leaf from t.resolve_neg() to run its backward compiled");
}

// Forward AD saves some zeros as ZeroTensors (at::_efficientzerotensor):
// tensors with no memory behind them, which ATen's ops handle through the
// ZeroTensor dispatch key, but which an Inductor kernel reads through its
// null data pointer (a crash). The graph gets real zeros of the same layout.
// A view with the negative bit set (z.conj().imag saved for backward) holds
// the negated values in its memory, and an Inductor kernel reads that memory
// without the bit (plain torch.compile of `x * y` with such an x returns
// -x * y): the graph gets the values the bit stands for.
at::Tensor materialized(const at::Tensor& t) {
  if (!t.defined()) {
    return t;
  }
  if (t._is_zerotensor()) {
    return at::empty_strided(t.sizes(), t.strides(), t.options()).zero_();
  }
  if (t.is_neg()) {
    return t.resolve_neg();
  }
  return t;
}

// Enough emptied calls for the largest graphs' nodes; beyond it they are
// freed, so that one huge backward does not hold its calls for good.
constexpr size_t kMaxPooledCalls = 4096;
thread_local std::vector<std::unique_ptr<AutogradCompilerCall>> call_pool;

PooledCall pooled_call() {
  if (call_pool.empty()) {
    return PooledCall(new AutogradCompilerCall(SizeInput::DYNAMIC));
  }
  PooledCall call(call_pool.back().release());
  call_pool.pop_back();
  return call;
}

class Collector {
 public:
  Collector(const GraphTask& task, size_t num_outputs) : task_(task) {
    graph_.num_outputs = num_outputs;
  }

  BackwardGraph finish(std::vector<Node*>&& order) {
    std::unordered_map<Node*, int> position;
    for (size_t i = 0; i < order.size(); ++i) {
      position.emplace(order[i], static_cast<int>(i));
    }
    graph_.nodes.reserve(order.size());
    for (Node* fn : order) {
      collect(fn, position);
    }
    return std::move(graph_);
  }

 private:
  void collect(Node* fn, const std::unordered_map<Node*, int>& position) {
    NodeRecord& record = graph_.nodes.emplace_back();
    record.node = c10::intrusive_ptr<Node>::reclaim_copy(fn);
    record.kind = kind_of(*fn);
    record.needed = is_needed(task_, fn);
    record.call = pooled_call();
    AutogradCompilerCall& call = *record.call;
    record.node_call = &call.node_calls.lookup(record.node);
    if (!task_.exec_info_.empty()) {
      const auto& captures = task_.exec_info_.at(fn).captures_;
      if (captures) {
        for (const auto& capture : *captures) {
          record.captures.emplace_back(capture.input_idx_, capture.output_idx_);
          record.node_call->mark_output(
              capture.input_idx_, capture.output_idx_);
        }
      }
    }

    CompiledNodeArgs args(call, *record.node_call);
    record.hooks_registered = registered_hooks(*fn);
    collect_hooks(args, record);
    record.edge_sizes_begin = 0;
    if (args.cond(record.needed)) {
      switch (record.kind) {
        case NodeKind::kAccumulateGrad:
          collect_accumulate_grad(
              args, record, static_cast<AccumulateGrad&>(*fn));
          break;
        case NodeKind::kEager:
          // Runs as itself, on its own saved values: nothing to lift. Its
          // Python class is part of its name.
          args.collect(fn->name());
          break;
        default:
          if (!lifts_saved_values(args, *fn)) {
            record.kind = NodeKind::kEager;
            args.collect(fn->name());
          }
      }
      record.edge_sizes_begin = call.all_size_inputs.size();
      if (record.kind != NodeKind::kEager) {
        collect_edge_metadata(args, *fn);
      }
    }
    for (const auto& edge : fn->next_edges()) {
      auto it = edge.is_valid() ? position.find(edge.function.get())
                                : position.end();
      if (it == position.end()) {
        record.next_edges.emplace_back(std::nullopt);
      } else {
        record.next_edges.emplace_back(
            std::make_pair(it->second, static_cast<int>(edge.input_nr)));
      }
    }
    lift(record);
    append_key(record, args);
  }

  // Moves the node's lifted values into the graph-wide lists.
  void lift(NodeRecord& record) {
    AutogradCompilerCall& call = *record.call;
    record.tensor_ids.reserve(call.tensor_args.inputs.size());
    record.tensor_args.reserve(call.tensor_args.inputs.size());
    for (const at::Tensor& t : call.tensor_args.inputs) {
      record.tensor_args.push_back(&call.tensor_args.lookup(t));
      auto [it, inserted] = tensor_ids_.try_emplace(
          t.unsafeGetTensorImpl(), graph_.tensors.size());
      if (inserted) {
        check_dynamo_takes_as_input(t);
        graph_.tensors.push_back(materialized(t));
      }
      record.tensor_ids.push_back(it->second);
    }

    record.sizes_begin = graph_.sizes.size();
    record.edge_sizes_begin += record.sizes_begin;
    for (const auto& size : call.all_size_inputs) {
      graph_.sizes.push_back(size.value);
    }
    record.sizes_end = graph_.sizes.size();

    record.scalars_begin = graph_.scalars.size();
    for (const auto& arg : call.lifted_ivalue_args.args) {
      graph_.scalars.push_back(*arg.actual_ptr);
    }
    record.scalars_end = graph_.scalars.size();

    int hooks_begin = static_cast<int>(graph_.hooks.size());
    for (auto& hook : call.hooks) {
      graph_.hooks.push_back(std::move(hook));
    }
    call.hooks.clear();
    auto to_global = [hooks_begin](int local) { return hooks_begin + local; };
    for (auto& from : record.hook_dicts) {
      from.begin = to_global(from.begin);
    }
    for (auto& hook : record.tensor_pre_hooks) {
      if (hook.is_python) {
        hook.index = to_global(hook.index);
      }
    }
    for (int hook : record.node_call->pre_hooks) {
      record.pre_hooks.push_back(to_global(hook));
    }
    for (int hook : record.node_call->post_hooks) {
      record.post_hooks.push_back(to_global(hook));
    }
    for (int hook : record.node_call->post_acc_grad_hooks) {
      record.post_acc_grad_hooks.push_back(to_global(hook));
    }
    if ((record.kind == NodeKind::kPythonFunction ||
         record.kind == NodeKind::kAotBackward) &&
        record.needed) {
      lift_python_function(record, hooks_begin);
    }

    int packed_begin = static_cast<int>(graph_.packed_data.size());
    record.unpack_hooks.resize(call.packed_inputs.size());
    for (const auto& [_, ids] : call.sv_to_hooks) {
      const auto& [hook, input] = ids;
      record.unpack_hooks.at(input) = {
          to_global(static_cast<int>(hook)),
          packed_begin + static_cast<int>(input)};
    }
    for (auto& packed : call.packed_inputs) {
      graph_.packed_data.push_back(std::move(packed));
    }
    call.packed_inputs.clear();
  }

  // Where the graph finds the ctx and, in ctx.saved_tensors order, the saved
  // tensors of a Python autograd.Function.
  static void lift_python_function(NodeRecord& record, int hooks_begin) {
    AutogradCompilerCall& call = *record.call;
    const auto& objects = call.pynode_objs.at(record.node.get());
    record.python_ctx = hooks_begin + static_cast<int>(std::get<0>(objects));
    if (const auto& state = std::get<1>(objects); state.has_value()) {
      record.backward_state = hooks_begin + static_cast<int>(*state);
    }
    for (const auto& saved : python_function_ctx(*record.node)->saved_variables) {
      TensorArg* arg = &call.tensor_args.lookup(saved);
      auto it = std::find(
          record.tensor_args.begin(), record.tensor_args.end(), arg);
      record.saved_layout.push_back(
          it == record.tensor_args.end()
              ? -1
              : static_cast<int>(it - record.tensor_args.begin()));
    }
  }

  void append_key(const NodeRecord& record, const CompiledNodeArgs& args) {
    std::string& key = graph_.key;
    const std::type_info* type = &typeid(*record.node);
    append_to_key(key, type);
    append_to_key(key, record.kind);
    auto node_key = args.key();
    append_to_key(key, node_key.key_size);
    key.append(reinterpret_cast<const char*>(node_key.key), node_key.key_size);
    append_to_key(key, record.node->num_inputs());
    append_to_key(key, record.next_edges.size());
    for (const auto& edge : record.next_edges) {
      std::pair<int, int> target = edge.value_or(std::make_pair(-1, -1));
      append_to_key(key, target);
    }
    append_to_key(key, record.tensor_ids.size());
    for (uint32_t id : record.tensor_ids) {
      append_to_key(key, id);
    }
    for (const auto& hook : record.tensor_pre_hooks) {
      append_to_key(key, hook.is_python);
    }
    append_to_key(key, record.sizes_end - record.sizes_begin);
    append_to_key(key, record.scalars_end - record.scalars_begin);
    append_to_key(key, record.unpack_hooks.size());
    for (int position : record.saved_layout) {
      append_to_key(key, position);
    }
    graph_.node_key_ends.push_back(key.size());
  }

  const GraphTask& task_;
  BackwardGraph graph_;
  std::unordered_map<const c10::TensorImpl*, uint32_t> tensor_ids_;
};

} // namespace

void RecycleCall::operator()(AutogradCompilerCall* call) const noexcept {
  std::unique_ptr<AutogradCompilerCall> owned(call);
  if (call_pool.size() < kMaxPooledCalls) {
    empty_call(*call);
    try {
      call_pool.push_back(std::move(owned));
    } catch (const std::bad_alloc&) {
      // Not pooled: `owned` still holds the call and frees it.
    }
  }
}

void detach_saved_values(BackwardGraph& graph, bool keep_graph) {
  for (auto& record : graph.nodes) {
    auto& tensor_args = record.call->tensor_args;
    tensor_args.inputs.clear();
    bool swapped_when_applied = record.kind == NodeKind::kApplyWithSaved ||
        record.kind == NodeKind::kApplyWithSavedDynamoDisabled ||
        record.kind == NodeKind::kPythonFunction ||
        record.kind == NodeKind::kAotBackward;
    if (keep_graph || !swapped_when_applied) {
      continue;
    }
    for (auto& [saved, _] : saved_variable_args(tensor_args)) {
      const_cast<torch::autograd::SavedVariable*>(saved)->reset_data();
    }
  }
}

bool is_cpp_custom_function(const Node& node) {
  return std::strncmp(
             typeid(node).name(), "N5torch8autograd7CppNodeI", 25) == 0;
}

// PyNode's type_info is not exported from libtorch_python, so it is
// recognised by its mangled name.
bool is_python_function(const Node& node) {
  return std::strcmp(typeid(node).name(), "N5torch8autograd6PyNodeE") == 0;
}

std::variant<BackwardGraph, Unsupported> collect_backward_graph(
    const c10::intrusive_ptr<Node>& root,
    const GraphTask& graph_task,
    bool accumulate_grad,
    size_t num_outputs) {
  Collector collector(graph_task, accumulate_grad ? 0 : num_outputs);
  std::vector<Node*> order = eager_execution_order(root.get(), graph_task);
  BackwardGraph graph;
  try {
    graph = collector.finish(std::move(order));
  } catch (const UnrunnableBackward&) {
    throw;
  } catch (const c10::NotImplementedError& e) {
    return Unsupported{e.what_without_backtrace(), false};
  } catch (const c10::Error& e) {
    return Unsupported{e.what_without_backtrace(), true};
  } catch (const std::exception& e) {
    return Unsupported{e.what(), true};
  }
  return graph;
}

} // namespace torch::dynamo::python_autograd
