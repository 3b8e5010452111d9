// torch._functorch._interpreter_serialization_C: binds CInterpreter.serialize /
// CInterpreter.deserialize (InterpreterSerialization.cpp) for torch 2.7.1.
//
// Built by setup.py together with InterpreterSerialization.cpp; importing it adds
// the two methods to torch._C._functorch.CInterpreter. Upstream, the same two
// .def lines sit in the CInterpreter binding of torch/csrc/functorch/init.cpp:
// the upstream export copies the chain between the BEGIN/END markers below there.

#include "InterpreterSerialization.h"

#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

namespace py = pybind11;

// NOTE: [Adding methods to a class another module bound]
// CInterpreter is bound by torch._C. Extensions built with
// torch.utils.cpp_extension share torch's pybind11 internals (the build passes
// torch's PYBIND11_COMPILER_TYPE / STDLIB / BUILD_ABI), so this module sees the
// same registered type: wrapping the existing type object in a py::class_ and
// calling def() adds methods to torch._C._functorch.CInterpreter itself, and an
// Interpreter returned by value converts to a genuine CInterpreter.

namespace torch::functorch::impl {

void initInterpreterSerializationBindings() {
  using namespace at::functorch;
  // Bad text is a c10::ValueError; Python sees a ValueError.
  py::register_local_exception_translator([](std::exception_ptr error) {
    try {
      if (error) {
        std::rethrow_exception(error);
      }
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    }
  });
  // See NOTE: [Adding methods to a class another module bound]
  py::class_<Interpreter> interpreter_class(py::type::of<Interpreter>());
  interpreter_class
      // BEGIN CInterpreter serialization bindings
      .def(
          "serialize",
          &serializeInterpreter,
          "The interpreter as JSON text: transform type, level, whether it is "
          "alive, its saved local dispatch key set and the transform's state "
          "(vmap batch size and randomness, grad / jvp previous mode, "
          "functionalize add-back-views). CInterpreter.deserialize reads it back.")
      .def_static(
          "deserialize",
          &deserializeInterpreter,
          py::arg("serialized"),
          "A new interpreter with the state CInterpreter.serialize wrote. It is "
          "not pushed on the functorch interpreter stack. Raises ValueError for "
          "text that does not describe an interpreter.")
      // END CInterpreter serialization bindings
      ;
}

} // namespace torch::functorch::impl

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "Adds serialize() and deserialize() to torch._C._functorch.CInterpreter "
      "(torch 2.7.1 backport of pytorch#152616).";
  torch::functorch::impl::initInterpreterSerializationBindings();
}
