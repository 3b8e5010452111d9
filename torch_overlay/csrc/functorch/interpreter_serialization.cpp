// CInterpreter.serialize / CInterpreter.deserialize for torch 2.7.1.
//
// Built as torch._functorch._interpreter_serialization_C (see setup.py); importing
// it adds the two methods to torch._C._functorch.CInterpreter. Upstream
// (pytorch#152616) has them on at::functorch::Interpreter itself
// (ATen/functorch/Interpreter.h), bound in torch/csrc/functorch/init.cpp: the
// functions below are that change's serialize / deserialize, and
// initInterpreterSerializationBindings its two .def lines.

#include <ATen/functorch/ADInterpreters.h>
#include <ATen/functorch/FunctionalizeInterpreter.h>
#include <ATen/functorch/Interpreter.h>
#include <ATen/functorch/VmapInterpreter.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <variant>

namespace py = pybind11;

// NOTE: [Interpreter serialization format]
// An Interpreter serializes to the JSON text upstream produces with
// nlohmann::json(interpreter).dump(): compact, keys sorted, e.g.
//
//   {"is_alive":true,"level":1,"meta":{"Vmap":{"batchSize":3,"randomness":0}},
//    "savedLocalDispatchKeySet":null,"type":1}
//
// "type" and "randomness" are the integer values of TransformType and
// RandomnessType; "meta" has exactly one key, the transform's name, holding that
// transform's state (Vmap: batchSize, randomness; Grad: prevGradMode; Jvp:
// prevFwdGradMode; Functionalize: functionalizeAddBackViews);
// "savedLocalDispatchKeySet" is null or {"excluded": raw, "included": raw}.
// Text from either side loads on the other: 2.13 defaults the "prevInferenceMode"
// it added to Grad and Jvp when it is absent, and 2.7.1, which has no such state,
// accepts it only when false.
//
// The 2.7.1 headers ship no JSON library, so the text is written and read with
// Python's json module through pybind11; both bindings run with the GIL held.

// NOTE: [Reading the saved local dispatch key set]
// An Interpreter holds the thread's local dispatch key set only while it is
// processing an operator (DynamicLayerFrontMode saves it, DynamicLayerBackMode
// restores and clears it). 2.7.1 offers no "is it saved?" query: the getter is an
// internal assert on the optional. Serialization is not a hot path, so the getter
// is asked and its c10::Error is taken to mean "not saved" (null in the JSON).

// NOTE: [Adding methods to a class another module bound]
// CInterpreter is bound by torch._C. Extensions built with
// torch.utils.cpp_extension share torch's pybind11 internals (the build passes
// torch's PYBIND11_COMPILER_TYPE / STDLIB / BUILD_ABI), so this module sees the
// same registered type: wrapping the existing type object in a py::class_ and
// calling def() adds methods to torch._C._functorch.CInterpreter itself, and an
// Interpreter returned by value converts to a genuine CInterpreter.

namespace at::functorch {
namespace {

const char* metaKey(TransformType type) {
  switch (type) {
    case TransformType::Vmap:
      return "Vmap";
    case TransformType::Grad:
      return "Grad";
    case TransformType::Jvp:
      return "Jvp";
    case TransformType::Functionalize:
      return "Functionalize";
    case TransformType::Torch:
      break;
  }
  return nullptr;
}

std::optional<c10::impl::LocalDispatchKeySet> savedLocalDispatchKeySet(
    const Interpreter& interpreter) {
  // See NOTE: [Reading the saved local dispatch key set]
  try {
    return interpreter.getSavedLocalDispatchKeySet();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

py::dict metaToDict(const Interpreter& interpreter) {
  py::dict meta;
  switch (interpreter.key()) {
    case TransformType::Vmap: {
      VmapInterpreterPtr vmap(&interpreter);
      auto batch_size = vmap.batchSize().maybe_as_int();
      if (!batch_size.has_value()) {
        throw std::runtime_error(
            "CInterpreter.serialize: a vmap interpreter with a symbolic batch "
            "size cannot be serialized");
      }
      meta["batchSize"] = *batch_size;
      meta["randomness"] = static_cast<int64_t>(vmap.randomness());
      break;
    }
    case TransformType::Grad:
      meta["prevGradMode"] = GradInterpreterPtr(&interpreter).prevGradMode();
      break;
    case TransformType::Jvp:
      meta["prevFwdGradMode"] = JvpInterpreterPtr(&interpreter).prevFwdGradMode();
      break;
    case TransformType::Functionalize:
      meta["functionalizeAddBackViews"] =
          FunctionalizeInterpreterPtr(&interpreter).functionalizeAddBackViews();
      break;
    case TransformType::Torch:
      throw std::runtime_error(
          "CInterpreter.serialize: the Torch transform type has no interpreter "
          "state to serialize");
  }
  py::dict wrapped;
  wrapped[metaKey(interpreter.key())] = meta;
  return wrapped;
}

// Reading JSON written by someone else: every field is checked before use.
py::object field(const py::dict& obj, const char* key, const char* where) {
  if (!obj.contains(key)) {
    throw py::value_error(
        std::string("CInterpreter.deserialize: ") + where + " has no \"" + key +
        "\"");
  }
  return obj[key];
}

bool boolField(const py::dict& obj, const char* key, const char* where) {
  py::object value = field(obj, key, where);
  if (!py::isinstance<py::bool_>(value)) {
    throw py::value_error(
        std::string("CInterpreter.deserialize: \"") + key + "\" of " + where +
        " must be true or false");
  }
  return value.cast<bool>();
}

int64_t intField(
    const py::dict& obj,
    const char* key,
    const char* where,
    int64_t min_value,
    int64_t max_value) {
  py::object value = field(obj, key, where);
  if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value)) {
    throw py::value_error(
        std::string("CInterpreter.deserialize: \"") + key + "\" of " + where +
        " must be an integer");
  }
  const auto out_of_range = py::value_error(
      std::string("CInterpreter.deserialize: \"") + key + "\" of " + where +
      " is out of range");
  int64_t result = 0;
  try {
    result = value.cast<int64_t>();
  } catch (const py::cast_error&) {
    throw out_of_range;
  }
  if (result < min_value || result > max_value) {
    throw out_of_range;
  }
  return result;
}

uint64_t rawKeySetField(const py::dict& obj, const char* key) {
  py::object value = field(obj, key, "savedLocalDispatchKeySet");
  if (!py::isinstance<py::int_>(value) || py::isinstance<py::bool_>(value)) {
    throw py::value_error(
        std::string("CInterpreter.deserialize: \"") + key +
        "\" of savedLocalDispatchKeySet must be an integer");
  }
  try {
    return value.cast<uint64_t>();
  } catch (const py::cast_error&) {
    throw py::value_error(
        std::string("CInterpreter.deserialize: \"") + key +
        "\" of savedLocalDispatchKeySet is not a 64-bit key set");
  }
}

py::dict dictField(const py::dict& obj, const char* key, const char* where) {
  py::object value = field(obj, key, where);
  if (!py::isinstance<py::dict>(value)) {
    throw py::value_error(
        std::string("CInterpreter.deserialize: \"") + key + "\" of " + where +
        " must be an object");
  }
  return value.cast<py::dict>();
}

Interpreter interpreterFromDict(const py::dict& json) {
  const auto type = static_cast<TransformType>(intField(
      json,
      "type",
      "the interpreter",
      static_cast<int64_t>(TransformType::Vmap),
      static_cast<int64_t>(TransformType::Functionalize)));
  const int64_t level = intField(
      json, "level", "the interpreter", 1, std::numeric_limits<int64_t>::max());
  const char* name = metaKey(type);
  py::dict outer_meta = dictField(json, "meta", "the interpreter");
  if (py::len(outer_meta) != 1) {
    throw py::value_error(
        "CInterpreter.deserialize: \"meta\" must hold exactly one transform");
  }
  py::dict meta = dictField(outer_meta, name, "\"meta\"");

  std::optional<Interpreter> interpreter;
  switch (type) {
    case TransformType::Vmap: {
      const int64_t batch_size = intField(
          meta, "batchSize", "Vmap", 0, std::numeric_limits<int64_t>::max());
      const auto randomness = static_cast<RandomnessType>(intField(
          meta,
          "randomness",
          "Vmap",
          static_cast<int64_t>(RandomnessType::Error),
          static_cast<int64_t>(RandomnessType::Different)));
      interpreter =
          Interpreter::Vmap(level, c10::SymInt(batch_size), randomness);
      break;
    }
    case TransformType::Grad:
    case TransformType::Jvp: {
      const bool is_grad = type == TransformType::Grad;
      if (meta.contains("prevInferenceMode") &&
          boolField(meta, "prevInferenceMode", name)) {
        throw py::value_error(
            "CInterpreter.deserialize: prevInferenceMode=true was saved by a "
            "newer torch; torch 2.7.1 interpreters have no inference-mode state");
      }
      const bool prev_mode = boolField(
          meta, is_grad ? "prevGradMode" : "prevFwdGradMode", name);
      interpreter = is_grad ? Interpreter::Grad(level, prev_mode)
                            : Interpreter::Jvp(level, prev_mode);
      break;
    }
    case TransformType::Functionalize:
      interpreter = Interpreter::Functionalize(
          level, boolField(meta, "functionalizeAddBackViews", name));
      break;
    case TransformType::Torch:
      break;
  }
  TORCH_INTERNAL_ASSERT(interpreter.has_value());

  py::object saved =
      field(json, "savedLocalDispatchKeySet", "the interpreter");
  if (!saved.is_none()) {
    if (!py::isinstance<py::dict>(saved)) {
      throw py::value_error(
          "CInterpreter.deserialize: \"savedLocalDispatchKeySet\" must be null "
          "or an object");
    }
    auto saved_dict = saved.cast<py::dict>();
    c10::impl::PODLocalDispatchKeySet pod{};
    pod.set_included(c10::DispatchKeySet(
        c10::DispatchKeySet::RAW, rawKeySetField(saved_dict, "included")));
    pod.set_excluded(c10::DispatchKeySet(
        c10::DispatchKeySet::RAW, rawKeySetField(saved_dict, "excluded")));
    interpreter->saveLocalDispatchKeySet(c10::impl::LocalDispatchKeySet(pod));
  }
  interpreter->set_is_alive(boolField(json, "is_alive", "the interpreter"));
  return std::move(*interpreter);
}

} // namespace

std::string serializeInterpreter(const Interpreter& interpreter) {
  // See NOTE: [Interpreter serialization format]
  py::dict json;
  json["type"] = static_cast<int64_t>(interpreter.key());
  json["level"] = interpreter.level();
  json["is_alive"] = interpreter.is_alive();
  json["meta"] = metaToDict(interpreter);
  auto saved = savedLocalDispatchKeySet(interpreter);
  if (saved.has_value()) {
    py::dict keys;
    keys["included"] = saved->included_.raw_repr();
    keys["excluded"] = saved->excluded_.raw_repr();
    json["savedLocalDispatchKeySet"] = keys;
  } else {
    json["savedLocalDispatchKeySet"] = py::none();
  }
  return py::module_::import("json")
      .attr("dumps")(
          json, py::arg("sort_keys") = true, py::arg("separators") = py::make_tuple(",", ":"))
      .cast<std::string>();
}

Interpreter deserializeInterpreter(const std::string& serialized) {
  // See NOTE: [Interpreter serialization format]
  py::object json;
  try {
    json = py::module_::import("json").attr("loads")(serialized);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ValueError)) {
      throw;
    }
    throw py::value_error(
        "CInterpreter.deserialize: not JSON (" +
        py::str(e.value()).cast<std::string>() + ")");
  }
  if (!py::isinstance<py::dict>(json)) {
    throw py::value_error(
        "CInterpreter.deserialize: expected a JSON object describing an "
        "interpreter");
  }
  return interpreterFromDict(json.cast<py::dict>());
}

} // namespace at::functorch

namespace torch::functorch::impl {

void initInterpreterSerializationBindings(py::module_& m) {
  using at::functorch::Interpreter;
  // See NOTE: [Adding methods to a class another module bound]
  py::class_<Interpreter> interpreter_class(py::type::of<Interpreter>());
  interpreter_class
      .def(
          "serialize",
          &at::functorch::serializeInterpreter,
          "The interpreter as JSON text: transform type, level, whether it is "
          "alive, its saved local dispatch key set and the transform's state "
          "(vmap batch size and randomness, grad / jvp previous mode, "
          "functionalize add-back-views). CInterpreter.deserialize reads it back.")
      .def_static(
          "deserialize",
          &at::functorch::deserializeInterpreter,
          py::arg("serialized"),
          "A new interpreter with the state CInterpreter.serialize wrote. It is "
          "not pushed on the functorch interpreter stack. Raises ValueError for "
          "text that does not describe an interpreter.");
}

} // namespace torch::functorch::impl

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "Adds serialize() and deserialize() to torch._C._functorch.CInterpreter "
      "(torch 2.7.1 backport of pytorch#152616).";
  torch::functorch::impl::initInterpreterSerializationBindings(m);
}
