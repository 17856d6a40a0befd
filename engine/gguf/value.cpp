// GgufValue constructors and typed views.
#include <limits>
#include <stdexcept>
#include <string>

#include "engine/gguf/file.h"

namespace baton {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "u8";
    case GgufType::INT8: return "i8";
    case GgufType::UINT16: return "u16";
    case GgufType::INT16: return "i16";
    case GgufType::UINT32: return "u32";
    case GgufType::INT32: return "i32";
    case GgufType::FLOAT32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "str";
    case GgufType::ARRAY: return "arr";
    case GgufType::UINT64: return "u64";
    case GgufType::INT64: return "i64";
    case GgufType::FLOAT64: return "f64";
  }
  return "unknown";
}

namespace {

// Every unsigned type, BOOL included, keeps its value in num.u.
GgufValue unsigned_value(GgufType t, uint64_t v) {
  GgufValue r;
  r.type = t;
  r.num.u = v;
  return r;
}

}  // namespace

GgufValue GgufValue::of_u32(uint32_t v) { return unsigned_value(GgufType::UINT32, v); }
GgufValue GgufValue::of_u64(uint64_t v) { return unsigned_value(GgufType::UINT64, v); }
GgufValue GgufValue::of_bool(bool v) { return unsigned_value(GgufType::BOOL, v ? 1 : 0); }

GgufValue GgufValue::of_i32(int32_t v) {
  GgufValue r;
  r.type = GgufType::INT32;
  r.num.i = v;
  return r;
}

GgufValue GgufValue::of_f32(float v) {
  GgufValue r;
  r.type = GgufType::FLOAT32;
  r.num.f = v;
  return r;
}

GgufValue GgufValue::of_str(std::string v) {
  GgufValue r;
  r.type = GgufType::STRING;
  r.str = std::move(v);
  return r;
}

GgufValue GgufValue::of_array(GgufType elem, std::vector<GgufValue> items) {
  GgufValue r;
  r.type = GgufType::ARRAY;
  r.elem_type = elem;
  r.items = std::move(items);
  return r;
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_float() const {
  return type == GgufType::FLOAT32 || type == GgufType::FLOAT64;
}

int64_t GgufValue::as_int() const {
  if (type == GgufType::BOOL) return num.u != 0;
  if (!is_integer()) {
    throw std::runtime_error(std::string("expected an integer, got ") + gguf_type_name(type));
  }
  // Unsigned values live in num.u; only UINT64 can exceed the signed range.
  if (type == GgufType::UINT64 && num.u > uint64_t(std::numeric_limits<int64_t>::max())) {
    throw std::runtime_error("u64 value " + std::to_string(num.u) + " does not fit in int64");
  }
  return num.i;
}

double GgufValue::as_float() const {
  if (is_float()) return num.f;
  if (type == GgufType::UINT64) return double(num.u);
  if (is_integer()) return double(num.i);
  throw std::runtime_error(std::string("expected a number, got ") + gguf_type_name(type));
}

const std::string& GgufValue::as_str() const {
  if (type != GgufType::STRING) {
    throw std::runtime_error(std::string("expected a string, got ") + gguf_type_name(type));
  }
  return str;
}

}  // namespace baton
