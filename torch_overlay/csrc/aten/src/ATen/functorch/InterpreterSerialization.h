#pragma once

#include <ATen/functorch/Interpreter.h>
#include <c10/macros/Export.h>

#include <string>

namespace at::functorch {

// The interpreter as JSON text (transform type, level, whether it is alive, its
// saved local dispatch key set, the transform's state) and back; see NOTE:
// [Interpreter serialization format] in InterpreterSerialization.cpp. Bound as
// torch._C._functorch.CInterpreter.serialize / CInterpreter.deserialize.
// Text that does not describe an interpreter is a c10::ValueError naming what
// is wrong with it.
TORCH_API std::string serializeInterpreter(const Interpreter& interpreter);
TORCH_API Interpreter deserializeInterpreter(const std::string& serialized);

} // namespace at::functorch
