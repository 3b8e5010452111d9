// torch._functorch._interpreter_serialization_C (backport only, never exported):
// binds CInterpreter.serialize / CInterpreter.deserialize for torch 2.7.1, whose
// own bindings (torch/csrc/functorch/init.cpp, built into torch._C) lack them.
//
// Upstream, the two bindings are .def lines of the CInterpreter binding in
// init.cpp: torch_overlay/csrc/torch/csrc/functorch/init.cpp.patch. This module
// adds the same two methods to the class torch._C already bound, over the same
// at::functorch functions (torch_overlay/csrc/aten/src/ATen/functorch/
// InterpreterSerialization.cpp, built into this module).

#include <ATen/functorch/InterpreterSerialization.h>

#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>

#include <exception>

namespace py = pybind11;

// NOTE: [Adding methods to a class another module bound]
// CInterpreter is bound by torch._C. Extensions built with
// torch.utils.cpp_extension share torch's pybind11 internals (the build passes
// torch's PYBIND11_COMPILER_TYPE / STDLIB / BUILD_ABI), so this module sees the
// same registered type: wrapping the existing type object in a py::class_ and
// calling def() adds methods to torch._C._functorch.CInterpreter itself, and an
// Interpreter returned by value converts to a genuine CInterpreter.

namespace {

void bindInterpreterSerialization() {
  using namespace at::functorch;
  // torch._C translates c10::ValueError to ValueError for its own bindings;
  // this module's bindings need the same translation.
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
  py::class_<Interpreter>(py::type::of<Interpreter>())
      .def(
          "serialize",
          &serializeInterpreter,
          "The interpreter as JSON text; CInterpreter.deserialize reads it back.")
      .def_static(
          "deserialize",
          &deserializeInterpreter,
          "A CInterpreter from the text of CInterpreter.serialize, not pushed on "
          "the interpreter stack. Raises ValueError for other text.");
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "Adds serialize() and deserialize() to torch._C._functorch.CInterpreter "
      "(torch 2.7.1 backport of pytorch#152616).";
  bindInterpreterSerialization();
}
