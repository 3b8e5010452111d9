// Declarations of the functorch interpreter serialization
// (InterpreterSerialization.cpp). The upstream export inserts the block between
// the namespace lines into ATen/functorch/Interpreter.h, before its closing
// namespace, and adds InterpreterSerialization.cpp under aten/src/ATen/functorch/.
#pragma once

#include <ATen/functorch/Interpreter.h>
#include <c10/macros/Export.h>

#include <string>

namespace at::functorch {

// The interpreter as JSON text (transform type, level, whether it is alive, its
// saved local dispatch key set, the transform's state) and back; see NOTE:
// [Interpreter serialization format] in InterpreterSerialization.cpp. Bound as
// torch._C._functorch.CInterpreter.serialize / CInterpreter.deserialize.
TORCH_API std::string serializeInterpreter(const Interpreter& interpreter);
TORCH_API Interpreter deserializeInterpreter(const std::string& serialized);

} // namespace at::functorch
