// Serialization of functorch interpreters: at::functorch::serializeInterpreter
// and deserializeInterpreter (pytorch#152616's CInterpreter.serialize /
// CInterpreter.deserialize).
//
// Plain C++ on ATen and c10 only, so that the same file is built into the
// torch_overlay extension for torch 2.7.1 and goes upstream unchanged as
// aten/src/ATen/functorch/InterpreterSerialization.cpp (the upstream export
// declares the two functions in ATen/functorch/Interpreter.h and binds them in
// torch/csrc/functorch/init.cpp).

#include <ATen/functorch/ADInterpreters.h>
#include <ATen/functorch/FunctionalizeInterpreter.h>
#include <ATen/functorch/Interpreter.h>
#include <ATen/functorch/VmapInterpreter.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <cctype>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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
// The schema is small and fixed, and 2.7.1 ships no JSON library in its headers,
// so the text is written here directly and read by a strict little parser (any
// JSON is parsed; what the schema does not allow is a c10::ValueError naming the
// field). Bad input never reaches an Interpreter constructor.

// NOTE: [Reading the saved local dispatch key set]
// An Interpreter holds the thread's local dispatch key set only while it is
// processing an operator (DynamicLayerFrontMode saves it, DynamicLayerBackMode
// restores and clears it). 2.7.1 offers no "is it saved?" query: the getter is an
// internal assert on the optional. Serialization is not a hot path, so the getter
// is asked and its c10::Error is taken to mean "not saved" (null in the JSON).

namespace at::functorch {
namespace {

constexpr const char* kWho = "CInterpreter.deserialize: ";

// ---------------------------------------------------------------------------
// Reading JSON
// ---------------------------------------------------------------------------

struct JsonValue {
  enum class Kind { Null, Bool, Integer, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  // An integer is its sign and magnitude, so that both int64 and uint64 fit.
  bool negative = false;
  uint64_t magnitude = 0;
  bool magnitude_overflow = false;
  std::vector<std::pair<std::string, std::unique_ptr<JsonValue>>> members;

  // The last member named ``key`` (JSON readers keep the last duplicate).
  const JsonValue* find(const std::string& key) const {
    for (auto it = members.rbegin(); it != members.rend(); ++it) {
      if (it->first == key) {
        return it->second.get();
      }
    }
    return nullptr;
  }
};

class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : text_(text) {}

  std::unique_ptr<JsonValue> parseDocument() {
    auto value = parseValue(0);
    skipWhitespace();
    check(pos_ == text_.size(), "trailing characters");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  void check(bool ok, const char* what) const {
    TORCH_CHECK_VALUE(
        ok, kWho, "not JSON (", what, " at character ", pos_, ")");
  }

  void skipWhitespace() {
    while (pos_ < text_.size() &&
           (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
            text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool consumeLiteral(const char* literal) {
    const std::string word(literal);
    if (text_.compare(pos_, word.size(), word) == 0) {
      pos_ += word.size();
      return true;
    }
    return false;
  }

  std::unique_ptr<JsonValue> parseValue(int depth) {
    check(depth <= kMaxDepth, "nested too deeply");
    skipWhitespace();
    check(pos_ < text_.size(), "unexpected end of text");
    auto value = std::make_unique<JsonValue>();
    const char c = text_[pos_];
    if (c == '{') {
      value->kind = JsonValue::Kind::Object;
      parseItems('}', [&] {
        check(pos_ < text_.size() && text_[pos_] == '"', "expected a key");
        std::string key = parseString();
        skipWhitespace();
        check(pos_ < text_.size() && text_[pos_] == ':', "expected ':'");
        ++pos_;
        value->members.emplace_back(std::move(key), parseValue(depth + 1));
      });
    } else if (c == '[') {
      value->kind = JsonValue::Kind::Array; // the schema has none: not kept
      parseItems(']', [&] { parseValue(depth + 1); });
    } else if (c == '"') {
      value->kind = JsonValue::Kind::String;
      parseString();
    } else if (consumeLiteral("true")) {
      value->kind = JsonValue::Kind::Bool;
      value->boolean = true;
    } else if (consumeLiteral("false")) {
      value->kind = JsonValue::Kind::Bool;
    } else if (!consumeLiteral("null")) {
      parseNumber(*value);
    }
    return value;
  }

  // The comma-separated items of an object or array, up to ``close``; the
  // opening bracket is at pos_.
  template <typename ParseItem>
  void parseItems(char close, ParseItem parseItem) {
    ++pos_;
    skipWhitespace();
    if (pos_ < text_.size() && text_[pos_] == close) {
      ++pos_;
      return;
    }
    while (true) {
      skipWhitespace();
      parseItem();
      skipWhitespace();
      check(pos_ < text_.size(), "unexpected end of text");
      if (text_[pos_] != ',') {
        break;
      }
      ++pos_;
    }
    check(text_[pos_] == close, "expected ',' or a closing bracket");
    ++pos_;
  }

  std::string parseString() {
    ++pos_; // the opening quote
    std::string out;
    while (true) {
      check(pos_ < text_.size(), "unterminated string");
      const char c = text_[pos_++];
      if (c == '"') {
        return out;
      }
      check(static_cast<unsigned char>(c) >= 0x20, "control character in string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      check(pos_ < text_.size(), "unterminated string");
      const char escaped = text_[pos_++];
      switch (escaped) {
        case '"':
        case '\\':
        case '/':
          out.push_back(escaped);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u':
          // No key of the schema needs one: kept as a placeholder character.
          for (int i = 0; i < 4; ++i) {
            check(
                pos_ < text_.size() && std::isxdigit(static_cast<unsigned char>(text_[pos_])),
                "bad \\u escape");
            ++pos_;
          }
          out.push_back('?');
          break;
        default:
          check(false, "bad escape");
      }
    }
  }

  bool digitAt(size_t pos) const {
    return pos < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos]));
  }

  // Digits at pos_ (at least one); each is passed to ``onDigit``.
  template <typename OnDigit>
  void parseDigits(const char* what, OnDigit onDigit) {
    check(digitAt(pos_), what);
    while (digitAt(pos_)) {
      onDigit(static_cast<uint64_t>(text_[pos_++] - '0'));
    }
  }

  void parseNumber(JsonValue& value) {
    value.kind = JsonValue::Kind::Integer;
    if (pos_ < text_.size() && text_[pos_] == '-') {
      value.negative = true;
      ++pos_;
    }
    check(!(digitAt(pos_) && text_[pos_] == '0' && digitAt(pos_ + 1)), "leading zero");
    parseDigits("unexpected character", [&](uint64_t digit) {
      if (value.magnitude > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
        value.magnitude_overflow = true;
      } else {
        value.magnitude = value.magnitude * 10 + digit;
      }
    });
    if (pos_ < text_.size() && text_[pos_] == '.') {
      value.kind = JsonValue::Kind::Number;
      ++pos_;
      parseDigits("bad fraction", [](uint64_t) {});
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      value.kind = JsonValue::Kind::Number;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) {
        ++pos_;
      }
      parseDigits("bad exponent", [](uint64_t) {});
    }
  }

  const std::string& text_;
  size_t pos_ = 0;
};

// Every field is checked before use: the text may come from anywhere.
const JsonValue& field(const JsonValue& obj, const char* key, const char* where) {
  const JsonValue* value = obj.find(key);
  TORCH_CHECK_VALUE(value != nullptr, kWho, where, " has no \"", key, "\"");
  return *value;
}

bool boolField(const JsonValue& obj, const char* key, const char* where) {
  const JsonValue& value = field(obj, key, where);
  TORCH_CHECK_VALUE(
      value.kind == JsonValue::Kind::Bool,
      kWho, "\"", key, "\" of ", where, " must be true or false");
  return value.boolean;
}

int64_t intField(
    const JsonValue& obj,
    const char* key,
    const char* where,
    int64_t min_value,
    int64_t max_value) {
  const JsonValue& value = field(obj, key, where);
  TORCH_CHECK_VALUE(
      value.kind == JsonValue::Kind::Integer,
      kWho, "\"", key, "\" of ", where, " must be an integer");
  const uint64_t int64_max = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const bool fits = !value.magnitude_overflow &&
      value.magnitude <= (value.negative ? int64_max + 1 : int64_max);
  int64_t result = 0;
  if (fits) {
    result = value.negative
        ? (value.magnitude == int64_max + 1
               ? std::numeric_limits<int64_t>::min()
               : -static_cast<int64_t>(value.magnitude))
        : static_cast<int64_t>(value.magnitude);
  }
  TORCH_CHECK_VALUE(
      fits && result >= min_value && result <= max_value,
      kWho, "\"", key, "\" of ", where, " is out of range");
  return result;
}

uint64_t rawKeySetField(const JsonValue& obj, const char* key) {
  const JsonValue& value = field(obj, key, "savedLocalDispatchKeySet");
  TORCH_CHECK_VALUE(
      value.kind == JsonValue::Kind::Integer,
      kWho, "\"", key, "\" of savedLocalDispatchKeySet must be an integer");
  TORCH_CHECK_VALUE(
      !value.negative && !value.magnitude_overflow,
      kWho, "\"", key, "\" of savedLocalDispatchKeySet is not a 64-bit key set");
  return value.magnitude;
}

const JsonValue& objectField(const JsonValue& obj, const char* key, const char* where) {
  const JsonValue& value = field(obj, key, where);
  TORCH_CHECK_VALUE(
      value.kind == JsonValue::Kind::Object,
      kWho, "\"", key, "\" of ", where, " must be an object");
  return value;
}

// ---------------------------------------------------------------------------
// The interpreter
// ---------------------------------------------------------------------------

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

const char* jsonBool(bool value) {
  return value ? "true" : "false";
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

// The transform's state as a JSON object with sorted keys.
std::string metaJson(const Interpreter& interpreter) {
  switch (interpreter.key()) {
    case TransformType::Vmap: {
      VmapInterpreterPtr vmap(&interpreter);
      auto batch_size = vmap.batchSize().maybe_as_int();
      TORCH_CHECK_VALUE(
          batch_size.has_value(),
          "CInterpreter.serialize: a vmap interpreter with a symbolic batch "
          "size cannot be serialized");
      return "{\"batchSize\":" + std::to_string(*batch_size) +
          ",\"randomness\":" +
          std::to_string(static_cast<int64_t>(vmap.randomness())) + "}";
    }
    case TransformType::Grad:
      return std::string("{\"prevGradMode\":") +
          jsonBool(GradInterpreterPtr(&interpreter).prevGradMode()) + "}";
    case TransformType::Jvp:
      return std::string("{\"prevFwdGradMode\":") +
          jsonBool(JvpInterpreterPtr(&interpreter).prevFwdGradMode()) + "}";
    case TransformType::Functionalize:
      return std::string("{\"functionalizeAddBackViews\":") +
          jsonBool(FunctionalizeInterpreterPtr(&interpreter)
                       .functionalizeAddBackViews()) +
          "}";
    case TransformType::Torch:
      break;
  }
  TORCH_CHECK_VALUE(
      false,
      "CInterpreter.serialize: the Torch transform type has no interpreter "
      "state to serialize");
  return std::string();
}

Interpreter interpreterFromJson(const JsonValue& json) {
  const auto type = static_cast<TransformType>(intField(
      json,
      "type",
      "the interpreter",
      static_cast<int64_t>(TransformType::Vmap),
      static_cast<int64_t>(TransformType::Functionalize)));
  const int64_t level = intField(
      json, "level", "the interpreter", 1, std::numeric_limits<int64_t>::max());
  const char* name = metaKey(type);
  const JsonValue& outer_meta = objectField(json, "meta", "the interpreter");
  TORCH_CHECK_VALUE(
      outer_meta.members.size() == 1,
      kWho, "\"meta\" must hold exactly one transform");
  const JsonValue& meta = objectField(outer_meta, name, "\"meta\"");

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
      TORCH_CHECK_VALUE(
          meta.find("prevInferenceMode") == nullptr ||
              !boolField(meta, "prevInferenceMode", name),
          kWho,
          "prevInferenceMode=true was saved by a newer torch; torch 2.7.1 "
          "interpreters have no inference-mode state");
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

  const JsonValue& saved = field(json, "savedLocalDispatchKeySet", "the interpreter");
  if (saved.kind != JsonValue::Kind::Null) {
    TORCH_CHECK_VALUE(
        saved.kind == JsonValue::Kind::Object,
        kWho, "\"savedLocalDispatchKeySet\" must be null or an object");
    c10::impl::PODLocalDispatchKeySet pod{};
    pod.set_included(c10::DispatchKeySet(
        c10::DispatchKeySet::RAW, rawKeySetField(saved, "included")));
    pod.set_excluded(c10::DispatchKeySet(
        c10::DispatchKeySet::RAW, rawKeySetField(saved, "excluded")));
    interpreter->saveLocalDispatchKeySet(c10::impl::LocalDispatchKeySet(pod));
  }
  interpreter->set_is_alive(boolField(json, "is_alive", "the interpreter"));
  return std::move(*interpreter);
}

} // namespace

std::string serializeInterpreter(const Interpreter& interpreter) {
  // See NOTE: [Interpreter serialization format]; keys in sorted order.
  const std::string meta = metaJson(interpreter); // refuses the Torch type
  std::string saved = "null";
  if (auto keys = savedLocalDispatchKeySet(interpreter)) {
    saved = "{\"excluded\":" + std::to_string(keys->excluded_.raw_repr()) +
        ",\"included\":" + std::to_string(keys->included_.raw_repr()) + "}";
  }
  return std::string("{\"is_alive\":") + jsonBool(interpreter.is_alive()) +
      ",\"level\":" + std::to_string(interpreter.level()) + ",\"meta\":{\"" +
      metaKey(interpreter.key()) + "\":" + meta +
      "},\"savedLocalDispatchKeySet\":" + saved +
      ",\"type\":" + std::to_string(static_cast<int64_t>(interpreter.key())) +
      "}";
}

Interpreter deserializeInterpreter(const std::string& serialized) {
  // See NOTE: [Interpreter serialization format]
  auto json = JsonParser(serialized).parseDocument();
  TORCH_CHECK_VALUE(
      json->kind == JsonValue::Kind::Object,
      kWho, "expected a JSON object describing an interpreter");
  return interpreterFromJson(*json);
}

} // namespace at::functorch
