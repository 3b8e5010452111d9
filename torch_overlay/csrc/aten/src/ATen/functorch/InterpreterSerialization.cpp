// Serialization of functorch interpreters: at::functorch::serializeInterpreter
// and deserializeInterpreter, bound as torch._C._functorch.CInterpreter.serialize
// and CInterpreter.deserialize (pytorch#152616).

#include <ATen/functorch/InterpreterSerialization.h>

#include <ATen/functorch/ADInterpreters.h>
#include <ATen/functorch/FunctionalizeInterpreter.h>
#include <ATen/functorch/VmapInterpreter.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

// NOTE: [Interpreter serialization format]
// An Interpreter serializes to a JSON object, written with nlohmann::json's
// dump(): compact, keys sorted. For example
//
//   {"is_alive":true,"level":2,
//    "meta":{"Grad":{"prevGradMode":true,"prevInferenceMode":false}},
//    "savedLocalDispatchKeySet":null,"type":2}
//
// "type" and "randomness" are the integer values of TransformType and
// RandomnessType; "meta" has exactly one key, the transform's name, holding that
// transform's state (Vmap: batchSize, randomness; Grad: prevGradMode,
// prevInferenceMode; Jvp: prevFwdGradMode, prevInferenceMode; Functionalize:
// functionalizeAddBackViews); "savedLocalDispatchKeySet" is null or
// {"excluded": raw, "included": raw}. This is the text later torch versions
// write for the same interpreter stack. Their grad and jvp interpreters keep
// the inference mode that was on when the transform began; these interpreters
// do not, so they write false, and reading refuses true rather than drop it.
//
// The text may come from anywhere: every field is checked before use, and
// anything the schema does not allow is a c10::ValueError naming the field.
// Members the schema does not know are ignored.

// NOTE: [Reading the saved local dispatch key set]
// An Interpreter holds the thread's local dispatch key set only while it is
// processing an operator (DynamicLayerFrontMode saves it, DynamicLayerBackMode
// restores and clears it). Interpreter offers no "is it saved?" query: the
// getter is an internal assert on the optional. Serialization is not a hot
// path, so the getter is asked and its c10::Error is taken to mean "not saved"
// (null in the JSON).

namespace at::functorch {
namespace {

using json = nlohmann::json;

constexpr const char* kWho = "CInterpreter.deserialize: ";

const char* transformName(TransformType type) {
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
  TORCH_CHECK_VALUE(
      false,
      "CInterpreter.serialize: the Torch transform type has no interpreter "
      "state to serialize");
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

// The transform's own state: the value under "meta"'s one key.
json transformState(const Interpreter& interpreter) {
  json state = json::object();
  switch (interpreter.key()) {
    case TransformType::Vmap: {
      VmapInterpreterPtr vmap(&interpreter);
      auto batch_size = vmap.batchSize().maybe_as_int();
      TORCH_CHECK_VALUE(
          batch_size.has_value(),
          "CInterpreter.serialize: a vmap interpreter with a symbolic batch "
          "size cannot be serialized");
      state["batchSize"] = *batch_size;
      state["randomness"] = static_cast<int64_t>(vmap.randomness());
      break;
    }
    case TransformType::Grad:
      state["prevGradMode"] = GradInterpreterPtr(&interpreter).prevGradMode();
      state["prevInferenceMode"] = false; // NOTE: [Interpreter serialization format]
      break;
    case TransformType::Jvp:
      state["prevFwdGradMode"] = JvpInterpreterPtr(&interpreter).prevFwdGradMode();
      state["prevInferenceMode"] = false;
      break;
    case TransformType::Functionalize:
      state["functionalizeAddBackViews"] =
          FunctionalizeInterpreterPtr(&interpreter).functionalizeAddBackViews();
      break;
    case TransformType::Torch:
      break; // serializeInterpreter refused it (transformName)
  }
  return state;
}

const json& field(const json& object, const char* key, const char* where) {
  auto it = object.find(key);
  TORCH_CHECK_VALUE(it != object.end(), kWho, where, " has no \"", key, "\"");
  return *it;
}

const json& objectField(const json& object, const char* key, const char* where) {
  const json& value = field(object, key, where);
  TORCH_CHECK_VALUE(
      value.is_object(), kWho, "\"", key, "\" of ", where, " must be an object");
  return value;
}

bool boolField(const json& object, const char* key, const char* where) {
  const json& value = field(object, key, where);
  TORCH_CHECK_VALUE(
      value.is_boolean(),
      kWho, "\"", key, "\" of ", where, " must be true or false");
  return value.get<bool>();
}

int64_t intField(
    const json& object,
    const char* key,
    const char* where,
    int64_t min_value,
    int64_t max_value) {
  const json& value = field(object, key, where);
  TORCH_CHECK_VALUE(
      value.is_number_integer(),
      kWho, "\"", key, "\" of ", where, " must be an integer");
  // nlohmann keeps a non-negative integer unsigned: one above int64's range
  // must not wrap around.
  const bool fits = !value.is_number_unsigned() ||
      value.get<uint64_t>() <=
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const int64_t result = fits ? value.get<int64_t>() : 0;
  TORCH_CHECK_VALUE(
      fits && result >= min_value && result <= max_value,
      kWho, "\"", key, "\" of ", where, " is out of range");
  return result;
}

c10::DispatchKeySet keySetField(const json& saved, const char* key) {
  const json& value = field(saved, key, "savedLocalDispatchKeySet");
  TORCH_CHECK_VALUE(
      value.is_number_integer(),
      kWho, "\"", key, "\" of savedLocalDispatchKeySet must be an integer");
  TORCH_CHECK_VALUE(
      value.is_number_unsigned(),
      kWho, "\"", key, "\" of savedLocalDispatchKeySet is not a 64-bit key set");
  return c10::DispatchKeySet(c10::DispatchKeySet::RAW, value.get<uint64_t>());
}

// An interpreter of ``type`` at ``level`` from the transform's state.
Interpreter interpreterFromState(TransformType type, int64_t level, const json& state) {
  const char* name = transformName(type);
  switch (type) {
    case TransformType::Vmap: {
      const int64_t batch_size = intField(
          state, "batchSize", name, 0, std::numeric_limits<int64_t>::max());
      const auto randomness = static_cast<RandomnessType>(intField(
          state,
          "randomness",
          name,
          static_cast<int64_t>(RandomnessType::Error),
          static_cast<int64_t>(RandomnessType::Different)));
      return Interpreter::Vmap(level, c10::SymInt(batch_size), randomness);
    }
    case TransformType::Grad:
    case TransformType::Jvp: {
      // See NOTE: [Interpreter serialization format]
      TORCH_CHECK_VALUE(
          !state.contains("prevInferenceMode") ||
              !boolField(state, "prevInferenceMode", name),
          kWho,
          "prevInferenceMode=true was saved by a newer torch; these "
          "interpreters have no inference-mode state");
      if (type == TransformType::Grad) {
        return Interpreter::Grad(level, boolField(state, "prevGradMode", name));
      }
      return Interpreter::Jvp(level, boolField(state, "prevFwdGradMode", name));
    }
    case TransformType::Functionalize:
      return Interpreter::Functionalize(
          level, boolField(state, "functionalizeAddBackViews", name));
    case TransformType::Torch:
      break;
  }
  TORCH_INTERNAL_ASSERT(false, "transformName refused the Torch type");
}

} // namespace

std::string serializeInterpreter(const Interpreter& interpreter) {
  // See NOTE: [Interpreter serialization format]
  const char* name = transformName(interpreter.key()); // refuses Torch
  json serialized = json::object();
  serialized["type"] = static_cast<int64_t>(interpreter.key());
  serialized["level"] = interpreter.level();
  serialized["is_alive"] = interpreter.is_alive();
  serialized["meta"] = json::object({{name, transformState(interpreter)}});
  serialized["savedLocalDispatchKeySet"] = nullptr;
  if (auto keys = savedLocalDispatchKeySet(interpreter)) {
    serialized["savedLocalDispatchKeySet"] = json::object(
        {{"included", keys->included_.raw_repr()},
         {"excluded", keys->excluded_.raw_repr()}});
  }
  return serialized.dump();
}

Interpreter deserializeInterpreter(const std::string& serialized) {
  // See NOTE: [Interpreter serialization format]
  json parsed;
  try {
    parsed = json::parse(serialized);
  } catch (const json::parse_error& e) {
    TORCH_CHECK_VALUE(false, kWho, "not JSON (", e.what(), ")");
  }
  TORCH_CHECK_VALUE(
      parsed.is_object(), kWho, "expected a JSON object describing an interpreter");
  const auto type = static_cast<TransformType>(intField(
      parsed,
      "type",
      "the interpreter",
      static_cast<int64_t>(TransformType::Vmap),
      static_cast<int64_t>(TransformType::Functionalize)));
  const int64_t level = intField(
      parsed, "level", "the interpreter", 1, std::numeric_limits<int64_t>::max());
  const json& meta = objectField(parsed, "meta", "the interpreter");
  TORCH_CHECK_VALUE(
      meta.size() == 1, kWho, "\"meta\" must hold exactly one transform");
  Interpreter interpreter = interpreterFromState(
      type, level, objectField(meta, transformName(type), "\"meta\""));

  const json& saved = field(parsed, "savedLocalDispatchKeySet", "the interpreter");
  if (!saved.is_null()) {
    TORCH_CHECK_VALUE(
        saved.is_object(),
        kWho, "\"savedLocalDispatchKeySet\" must be null or an object");
    c10::impl::PODLocalDispatchKeySet pod{};
    pod.set_included(keySetField(saved, "included"));
    pod.set_excluded(keySetField(saved, "excluded"));
    interpreter.saveLocalDispatchKeySet(c10::impl::LocalDispatchKeySet(pod));
  }
  interpreter.set_is_alive(boolField(parsed, "is_alive", "the interpreter"));
  return interpreter;
}

} // namespace at::functorch
