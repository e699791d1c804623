#include <torch/csrc/dynamo/python_autograd/compiler_interface.h>

#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <pthread.h>

#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

namespace torch::dynamo::python_autograd {

namespace py = pybind11;
using torch::autograd::functional_apply_t;
using torch::autograd::ivalue_list;
using torch::autograd::variable_list;
using torch::dynamo::autograd::PyCompilerGuard;
using torch::dynamo::autograd::PyCompilerInterface;

namespace {

thread_local NodeApplication* current_application = nullptr;

// Name handed back to a C++ custom function by bind_function: its functional
// is kept on the NodeApplication, since CppNode binds on every application.
constexpr const char* kCustomFunction = "python_autograd.custom_function";

variable_list to_variable_list(const py::handle& values) {
  variable_list result;
  for (const auto& value : values) {
    result.emplace_back(
        value.is_none() ? at::Tensor() : py::cast<at::Tensor>(value));
  }
  return result;
}

// Built-in nodes bind their functional backward on their first
// apply_with_saved in the process only, whichever engine applies them; the
// two engines therefore share one namespace of bound functionals,
// torch._dynamo.compiled_autograd.ops, where the legacy engine looks too.
class SharedFunctionals {
 public:
  static void bind(
      const std::string& name,
      functional_apply_t fn,
      std::vector<at::TypePtr> schema) {
    py::object ops = legacy_ops();
    if (!py::hasattr(ops, name.c_str())) {
      ops.attr("add")(
          name,
          python_callable(fn, schema),
          /*is_custom_function=*/false,
          /*is_traceable=*/true);
    }
    functionals().insert_or_assign(name, std::move(fn));
  }

  static variable_list call(
      const std::string& name,
      const variable_list& inputs,
      const ivalue_list& packed_args) {
    auto it = functionals().find(name);
    if (it != functionals().end()) {
      return it->second(inputs, packed_args);
    }
    // Bound earlier by the legacy engine: only its Python op knows the
    // functional.
    py::tuple args(packed_args.size() + 1);
    args[0] = py::cast(inputs);
    for (size_t i = 0; i < packed_args.size(); ++i) {
      const c10::IValue& arg = packed_args[i];
      // toPyObject turns wrapped-number tensors (a Python scalar in an
      // expression like x * 0.9) into Python floats; the op wants tensors.
      args[i + 1] = arg.isTensor() ? py::cast(arg.toTensor())
                                   : torch::jit::toPyObject(arg);
    }
    py::object result = legacy_ops().attr("get")(name)(*args);
    return to_variable_list(result);
  }

 private:
  static std::unordered_map<std::string, functional_apply_t>& functionals() {
    static std::unordered_map<std::string, functional_apply_t> bound;
    return bound;
  }

  static py::object legacy_ops() {
    return py::module_::import("torch._dynamo.compiled_autograd").attr("ops");
  }

  // The calling convention the legacy engine's graph uses for ops:
  // op(grads, *packed_args), packed args as Python values.
  static py::object python_callable(
      functional_apply_t fn,
      std::vector<at::TypePtr> schema) {
    return py::cpp_function(
        [fn = std::move(fn), schema = std::move(schema)](
            const py::list& grads, const py::args& args) {
          TORCH_CHECK(
              args.size() == schema.size(),
              "expected ",
              schema.size(),
              " packed arguments, got ",
              args.size());
          ivalue_list packed_args;
          packed_args.reserve(args.size());
          for (size_t i = 0; i < args.size(); ++i) {
            packed_args.push_back(torch::jit::toIValue(args[i], schema[i]));
          }
          return fn(to_variable_list(grads), packed_args);
        });
  }
};

size_t num_outputs(const c10::IValue& output_metadata) {
  return output_metadata.isList() ? output_metadata.toListRef().size() : 0;
}

NodeApplication& current() {
  TORCH_INTERNAL_ASSERT(
      current_application != nullptr,
      "python compiled autograd: a node called the compiler interface "
      "outside of apply_with_saved");
  return *current_application;
}

} // namespace

class EngineCompilerInterface final : public PyCompilerInterface {
 public:
  std::string bind_function(
      PyObject* /*py_compiler*/,
      const std::string& fn_name,
      functional_apply_t fn,
      std::vector<at::TypePtr> packed_args_schema,
      bool is_custom_function,
      bool is_traceable) const override {
    NodeApplication& application = current();
    if (is_custom_function) {
      application.custom_function_traceable_ = is_traceable;
      application.custom_function_ = std::move(fn);
      return kCustomFunction;
    }
    SharedFunctionals::bind(fn_name, std::move(fn), std::move(packed_args_schema));
    return fn_name;
  }

  variable_list call_function(
      PyObject* /*py_compiler*/,
      const char* method_name,
      const std::string& fn_name,
      const variable_list& inputs,
      const ivalue_list& packed_args,
      const c10::IValue& output_metadata) const override {
    return contain(num_outputs(output_metadata), [&]() {
      TORCH_CHECK_NOT_IMPLEMENTED(
          std::strcmp(method_name, "apply_functional") == 0,
          "the Python compiled autograd engine cannot apply a node that "
          "calls '",
          method_name,
          "' (",
          fn_name,
          ")");
      NodeApplication& application = current();
      if (fn_name == kCustomFunction) {
        return application.custom_function_(inputs, packed_args);
      }
      return SharedFunctionals::call(fn_name, inputs, packed_args);
    });
  }

  // CopySlices::apply_impl's prologue, as a function of its inputs.
  variable_list call_copy_slices_prologue(
      PyObject* /*py_compiler*/,
      const variable_list& inputs,
      const at::TensorGeometry& base,
      const at::TensorGeometry& view) const override {
    return contain(3, [&]() -> variable_list {
      const at::Tensor& grad = inputs.at(0);
      at::Tensor result =
          grad.new_empty_strided_symint(base.sym_sizes(), base.sym_strides());
      result.copy_(grad);
      at::Tensor grad_slice = result.as_strided_symint(
          view.sym_sizes(),
          view.sym_strides(),
          view.sym_storage_offset() - base.sym_storage_offset());
      at::Tensor grad_slice_clone =
          grad_slice.clone(at::MemoryFormat::Contiguous);
      return {result, grad_slice, grad_slice_clone};
    });
  }

  // CopySlices::apply_impl's epilogue, as a function of its inputs.
  variable_list call_copy_slices_epilogue(
      PyObject* /*py_compiler*/,
      const std::vector<bool>& needs_input_grad,
      const at::Tensor& result,
      const variable_list& res,
      const at::Tensor& grad_slice) const override {
    return contain(needs_input_grad.size(), [&]() {
      variable_list grad_inputs(needs_input_grad.size());
      for (size_t i = 0; i < res.size() && i < grad_inputs.size(); ++i) {
        if (!needs_input_grad[i] || !res[i].defined()) {
          continue;
        }
        if (i == 0) {
          grad_slice.copy_(res[0]);
          grad_inputs[0] = result;
        } else {
          grad_inputs[i] = res[i];
        }
      }
      return grad_inputs;
    });
  }

  // A saved variable with saved-tensor hooks: its unpack hook already ran
  // in the graph, before the node.
  at::Tensor call_unpack(
      PyObject* /*py_compiler*/,
      std::optional<size_t> /*hook_id*/,
      size_t hook_input_id) const override {
    NodeApplication& application = current();
    if (application.unpacked_ == nullptr) {
      // A probe: the node's own unpack must not run the hook here.
      return at::Tensor();
    }
    TORCH_CHECK(
        hook_input_id < application.unpacked_->size(),
        "python compiled autograd: no unpacked value for saved variable ",
        hook_input_id);
    return application.unpacked_->at(hook_input_id);
  }

  at::Tensor call_accumulate_grad(
      PyObject* /*py_compiler*/,
      const at::Tensor& /*variable*/,
      const at::Tensor& /*variable_grad*/,
      const at::Tensor& /*grad*/,
      bool /*has_post_hooks*/) const override {
    TORCH_INTERNAL_ASSERT(
        false,
        "python compiled autograd: AccumulateGrad is run by "
        "accumulate_grad, never through apply_with_saved");
  }

 private:
  // Runs `body` unless the application is a probe or already failed; an
  // error is kept for NodeApplication::rethrow_if_failed and `count` empty
  // gradients are returned, so that apply_with_saved restores the node.
  template <typename Body>
  static variable_list contain(size_t count, Body&& body) {
    NodeApplication& application = current();
    if (application.mode_ == NodeApplication::Mode::kProbe ||
        application.error_) {
      return variable_list(count);
    }
    try {
      return body();
    } catch (...) {
      application.error_ = std::current_exception();
      return variable_list(count);
    }
  }
};

namespace {

// libtorch has one process-wide PyCompilerInterface slot, and
// PyCompilerGuard asserts when nested; applications on several threads (or
// nested ones) share a single installation.
class InterfaceInstallation {
 public:
  static void acquire() {
    std::lock_guard<std::mutex> lock(mutex());
    if (users()++ == 0) {
      guard() = std::make_unique<PyCompilerGuard>(
          std::make_unique<EngineCompilerInterface>());
    }
  }
  static void release() {
    std::lock_guard<std::mutex> lock(mutex());
    if (--users() == 0) {
      guard().reset();
    }
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    // Held across a fork by another thread, the child's copy would stay
    // locked: a fork waits for it.
    static const int fork_handlers_registered = pthread_atfork(
        [] { m.lock(); }, [] { m.unlock(); }, [] { m.unlock(); });
    (void)fork_handlers_registered;
    return m;
  }
  static int& users() {
    static int n = 0;
    return n;
  }
  static std::unique_ptr<PyCompilerGuard>& guard() {
    static std::unique_ptr<PyCompilerGuard> g;
    return g;
  }
};

} // namespace

NodeApplication::NodeApplication(
    Mode mode,
    const torch::autograd::variable_list* unpacked)
    : mode_(mode), unpacked_(unpacked), outer_(current_application) {
  InterfaceInstallation::acquire();
  current_application = this;
}

NodeApplication::~NodeApplication() {
  current_application = outer_;
  InterfaceInstallation::release();
}

void NodeApplication::rethrow_if_failed() {
  if (error_) {
    std::rethrow_exception(std::exchange(error_, nullptr));
  }
}

} // namespace torch::dynamo::python_autograd
