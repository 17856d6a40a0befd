// Python semantics of the Jinja values (see value.h).
#include "chat/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "engine/base/json_escape.h"

namespace baton::jinja {

namespace {

// Frees a charged heap object and refunds its bytes to the meter that
// charged it (the counter outlives the meter if need be).
template <class T>
struct Refund {
  std::shared_ptr<size_t> live;
  size_t bytes;
  void operator()(T* p) const noexcept {
    *live -= bytes;
    delete p;
  }
};

// `p` shared, charged `bytes` to the active meter (none: not counted).
template <class T>
std::shared_ptr<T> owned(T* p, size_t bytes) {
  std::unique_ptr<T> guard(p);
  Meter* m = Meter::active();
  if (!m) return std::shared_ptr<T>(guard.release());
  m->charge(bytes);
  return std::shared_ptr<T>(guard.release(), Refund<T>{m->live(), bytes});
}

std::atomic<size_t> g_namespaces{0};

uint16_t depth_of(const Value& v) { return v.depth; }
// 1 + the deepest item's depth; throws past kMaxDepth.
uint16_t nest(size_t deepest) {
  if (deepest + 1 > size_t(kMaxDepth))
    fail("the template builds a value nested too deep (more than {} levels)", kMaxDepth);
  return uint16_t(deepest + 1);
}

}  // namespace

size_t live_namespaces() { return g_namespaces.load(); }

Value Value::undefined(std::string name) {
  Value v;
  // Only error messages read the name: a long one is cut.
  if (name.size() > 64) name.resize(64);
  if (!name.empty()) v.text = std::make_shared<const std::string>(std::move(name));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  Value v;
  v.kind = Kind::String;
  const size_t n = x.size();
  work(n);
  v.text = owned(new std::string(std::move(x)), n + kStringBytes);
  return v;
}
Value Value::make_list(List items, bool is_tuple) {
  Value v;
  v.kind = Kind::List;
  v.tuple = is_tuple;
  size_t deepest = 0;
  for (const Value& e : items) deepest = std::max<size_t>(deepest, depth_of(e));
  v.depth = nest(deepest);
  const size_t n = items.size();
  work(n * kItemWork);
  v.list = owned(new List(std::move(items)), n * kItemBytes + kStringBytes);
  return v;
}
Value Value::make_generator(List items) {
  Value v = make_list(std::move(items));
  v.generator = true;
  return v;
}

bool dict_key(const Value& key, std::string& out) {
  if (key.is_string()) out = key.s();
  else if (key.kind == Kind::Int) out = "\x01" + std::to_string(key.i);
  else if (key.kind == Kind::Bool) out = "\x01" + std::to_string(int(key.b));
  else return false;
  return true;
}

Value dict_key_value(const std::string& stored) {
  if (!stored.empty() && stored[0] == '\x01') return Value::integer(std::stoll(stored.substr(1)));
  return Value::string(stored);
}

namespace {
size_t dict_bytes(const Dict& d) {
  size_t n = kStringBytes;
  for (const auto& [k, e] : d.items) n += kEntryBytes + k.size();
  return n;
}
}  // namespace

Value Value::make_dict(Dict d) {
  Value v;
  v.kind = Kind::Dict;
  size_t deepest = 0;
  for (const auto& kv : d.items) deepest = std::max<size_t>(deepest, depth_of(kv.second));
  v.depth = nest(deepest);
  work(d.items.size() * kEntryWork);
  const size_t bytes = dict_bytes(d);
  v.dict = owned(new Dict(std::move(d)), bytes);
  return v;
}
// A namespace can hold itself: what walks the values (repr, tojson, ==)
// never looks inside one, and the meter empties each at the end of the
// render, so it counts as one level whatever it holds.
Value Value::make_namespace(Dict d) {
  Value v;
  v.kind = Kind::Namespace;
  v.depth = 1;
  const size_t bytes = dict_bytes(d);
  v.dict = owned(new Dict(std::move(d)), bytes);
  std::shared_ptr<Dict> inner = v.dict;
  // Counted while alive, for the tests: wraps the charged pointer.
  ++g_namespaces;
  v.dict = std::shared_ptr<Dict>(inner.get(), [inner](Dict*) mutable {
    --g_namespaces;
    inner.reset();
  });
  if (Meter* m = Meter::active()) m->adopt_namespace(v.dict);
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.kind = Kind::Function;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}
Value Value::function(Function f, const Value& owner) {
  Value v = function(std::move(f));
  v.depth = nest(owner.depth);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxDepth)
    fail("the template input nests too deep (more than {} levels)", kMaxDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > uint64_t(INT64_MAX) ? number(double(u)) : integer(int64_t(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      l.reserve(j.size());
      for (const auto& e : j) l.push_back(from_json(e, depth + 1));
      return make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;  // JSON object keys are unique already
      d.items.reserve(j.size());
      for (const auto& [k, e] : j.items()) d.items.emplace_back(k, from_json(e, depth + 1));
      return make_dict(std::move(d));
    }
    default: throw RenderError("unsupported JSON value in the template input");
  }
}

const std::string& Value::s() const {
  static const std::string empty;
  return text ? *text : empty;
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return b;
    case Kind::Int: return i != 0;
    case Kind::Float: return f != 0;
    case Kind::String: return !s().empty();
    case Kind::List: return generator || !list->empty();
    case Kind::Dict: return !dict->items.empty();
    default: return true;
  }
}

const Value* Dict::find(std::string_view key) const {
  work(items.size());
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  work(kItemWork + items.size());
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

const Value* CallArgs::get(size_t i, std::string_view name) const {
  if (i < pos.size()) return &pos[i];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

// ---- UTF-8 -----------------------------------------------------------------

size_t utf8_next(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  return std::min(n, s.size() - i);
}

uint32_t utf8_decode(std::string_view s, size_t i, size_t n) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

size_t utf8_length(std::string_view s) {
  work(s.size());
  // Code points = bytes that are not continuation bytes (10xxxxxx), counted
  // eight at a time: templates take the length of long strings in loops.
  size_t continuation = 0, i = 0;
  constexpr uint64_t kHigh = 0x8080808080808080ull;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    continuation += size_t(__builtin_popcountll(w & ~(w << 1) & kHigh));
  }
  for (; i < s.size(); ++i) continuation += (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80;
  return s.size() - continuation;
}

size_t utf8_offset(std::string_view s, size_t k) {
  size_t i = 0;
  for (; i < s.size() && k > 0; --k) i += utf8_next(s, i);
  work(i);
  return i;
}

bool is_py_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// ---- str / repr --------------------------------------------------------------

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e + 1));
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      std::string ip = digits.substr(0, std::min<size_t>(digits.size(), exp + 1));
      while (ip.size() < size_t(exp) + 1) ip += '0';
      std::string fp = digits.size() > size_t(exp) + 1 ? digits.substr(exp + 1) : "0";
      out = ip + "." + fp;
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
  }
  return neg ? "-" + out : out;
}

namespace {

// Characters Python's str.isprintable() rejects among those templates meet.
bool py_unprintable(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD || (cp >= 0x2000 && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF ||
         cp == 0x1680;
}

void str_repr(std::string& out, std::string_view s) {
  work(s.size() * kCharWork);
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  out += q;
  for (size_t i = 0; i < s.size();) {
    // Printable ASCII other than the quote and the backslash: as it is, a run at a time.
    size_t run = i;
    while (run < s.size() && s[run] >= 0x20 && s[run] < 0x7F && s[run] != q && s[run] != '\\') ++run;
    if (run > i) {
      out.append(s, i, run - i);
      i = run;
      continue;
    }
    const size_t n = utf8_next(s, i);
    const uint32_t cp = utf8_decode(s, i, n);
    if (cp == uint32_t(q) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (py_unprintable(cp)) {
      out += cp < 0x100 ? fmt::format("\\x{:02x}", cp) : fmt::format("\\u{:04x}", cp);
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  out += q;
}

// repr(v) appended to out; `base` is where the caller's text began (what
// it adds counts against the memory limit as it grows).
void repr_into(std::string& out, const Value& v, size_t base) {
  switch (v.kind) {
    case Kind::Undefined: out += "Undefined"; return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.b ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float: out += float_repr(v.f); return;
    case Kind::String:
      need_bytes(out.size() - base + v.s().size());
      str_repr(out, v.s());
      return;
    case Kind::List: {
      if (v.generator) {
        out += "<generator object>";
        return;
      }
      DepthGuard depth;
      out += v.tuple ? '(' : '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        work(kItemWork);
        repr_into(out, (*v.list)[k], base);
        need_bytes(out.size() - base);
      }
      if (v.tuple && v.list->size() == 1) out += ',';
      out += v.tuple ? ')' : ']';
      return;
    }
    case Kind::Dict: {
      DepthGuard depth;
      out += '{';
      bool first = true;
      for (const auto& [k, e] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        work(kItemWork);
        if (!k.empty() && k[0] == '\x01') out.append(k, 1);  // an integer key
        else str_repr(out, k);
        out += ": ";
        repr_into(out, e, base);
        need_bytes(out.size() - base);
      }
      out += '}';
      return;
    }
    case Kind::Namespace: out += "<Namespace>"; return;
    case Kind::Function: out += "<function>"; return;
  }
}

}  // namespace

void append_str(std::string& out, const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return;
    case Kind::String:
      work(v.s().size());
      out += v.s();
      return;
    default: repr_into(out, v, out.size());
  }
}

std::string to_str(const Value& v) {
  std::string out;
  append_str(out, v);
  return out;
}

std::string to_repr(const Value& v) {
  std::string out;
  repr_into(out, v, 0);
  return out;
}

std::string html_escape(std::string_view s) {
  work(s.size());
  size_t n = s.size();
  for (char c : s) n += c == '&' || c == '"' || c == '\'' ? 4 : c == '<' || c == '>' ? 3 : 0;
  need_bytes(n);
  std::string out;
  out.reserve(n);
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- JSON --------------------------------------------------------------------

namespace {

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  work(s.size() * (ensure_ascii ? kCharWork : 1));
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    // Bytes JSON keeps as they are: a run at a time.
    size_t run = i;
    while (run < s.size() && static_cast<unsigned char>(s[run]) >= 0x20 &&
           (!ensure_ascii || static_cast<unsigned char>(s[run]) < 0x80) && s[run] != '"' && s[run] != '\\')
      ++run;
    if (run > i) {
      out.append(s, i, run - i);
      i = run - 1;
      continue;
    }
    const char ch = s[i];
    const auto c = static_cast<unsigned char>(ch);
    if (ensure_ascii && c >= 0x80) {
      const size_t n = utf8_next(s, i);
      const uint32_t cp = utf8_decode(s, i, n);
      if (cp >= 0x10000) {
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
      i += n - 1;
      continue;
    }
    append_json_escaped(out, ch);
  }
  out += '"';
}

struct JsonStyle {
  int indent;
  std::string_view item_sep, key_sep;
  bool sort_keys, ensure_ascii;
};

void json_into(std::string& out, const Value& v, const JsonStyle& st, int level) {
  const int indent = st.indent;
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    const size_t n = size_t(indent) * size_t(lvl);
    need_bytes(out.size() + n);
    work(n);
    out += '\n';
    out.append(n, ' ');
  };
  switch (v.kind) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.b ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.i); return;
    case Kind::Float:
      out += std::isnan(v.f) ? "NaN" : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity") : float_repr(v.f);
      return;
    case Kind::String:
      // Escapes write at most six bytes for one.
      need_bytes(out.size() + v.s().size());
      json_string(out, v.s(), st.ensure_ascii);
      return;
    case Kind::List: {
      if (v.generator) break;
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      DepthGuard depth;
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        work(kItemWork + st.item_sep.size());
        newline(level + 1);
        json_into(out, (*v.list)[k], st, level + 1);
        need_bytes(out.size());
      }
      newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      DepthGuard depth;
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) {
          work(std::min(a->first.size(), b->first.size()) + kItemWork);
          return a->first < b->first;
        });
      }
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        work(kItemWork + st.item_sep.size() + st.key_sep.size());
        newline(level + 1);
        const std::string& key = items[k]->first;
        json_string(out, !key.empty() && key[0] == '\x01' ? std::string_view(key).substr(1) : std::string_view(key),
                    st.ensure_ascii);
        out += st.key_sep;
        json_into(out, items[k]->second, st, level + 1);
        need_bytes(out.size());
      }
      newline(level);
      out += '}';
      return;
    }
    default: break;
  }
  fail("Object of type {} is not JSON serializable", kind_name(v));
}

}  // namespace

std::string to_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                    bool sort_keys, bool ensure_ascii) {
  std::string out;
  json_into(out, v, JsonStyle{indent, item_sep, key_sep, sort_keys, ensure_ascii}, 0);
  return out;
}

// ---- comparison -----------------------------------------------------------------

namespace {
double as_double(const Value& v) {
  return v.kind == Kind::Float ? v.f : v.kind == Kind::Bool ? double(v.b) : double(v.i);
}
bool both_int(const Value& a, const Value& b) { return a.kind != Kind::Float && b.kind != Kind::Float; }
int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? int64_t(v.b) : v.i; }
}  // namespace

bool equals(const Value& a, const Value& b) {
  work(kItemWork);
  if (a.is_number() && b.is_number())
    return both_int(a, b) ? as_int(a) == as_int(b) : as_double(a) == as_double(b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String:
      work(std::min(a.s().size(), b.s().size()));
      return a.s() == b.s();
    case Kind::List: {
      if (a.generator || b.generator) return a.list == b.list;
      if (a.list->size() != b.list->size()) return false;
      if (a.list == b.list) return true;
      DepthGuard depth;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      if (a.dict == b.dict) return true;
      DepthGuard depth;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.fn == b.fn;
  }
}

bool less(const Value& a, const Value& b) {
  work(kItemWork);
  if (a.is_number() && b.is_number())
    return both_int(a, b) ? as_int(a) < as_int(b) : as_double(a) < as_double(b);
  if (a.is_string() && b.is_string()) {  // UTF-8 bytes order as code points
    work(std::min(a.s().size(), b.s().size()));
    return a.s() < b.s();
  }
  if (a.is_list() && b.is_list()) {
    DepthGuard depth;
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!equals((*a.list)[k], (*b.list)[k])) return less((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size();
  }
  fail("'<' not supported between instances of '{}' and '{}'", kind_name(a), kind_name(b));
}

bool contains(const Value& c, const Value& item) {
  switch (c.kind) {
    case Kind::String:
      if (!item.is_string()) throw RenderError("'in <string>' requires string as left operand");
      work(c.s().size() + item.s().size());
      return c.s().find(item.s()) != std::string::npos;
    case Kind::Dict: {
      std::string k;
      return dict_key(item, k) && c.dict->find(k) != nullptr;
    }
    case Kind::Undefined: return false;
    case Kind::List:
      for (const Value& e : *c.list)
        if (equals(e, item)) return true;
      return false;
    default: fail("argument of type '{}' is not iterable", kind_name(c));
  }
}

List Items::copy() const {
  need_bytes(list_->size() * kItemBytes);
  work(list_->size() * kItemWork);
  return List(list_->begin(), list_->end());
}

Items iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: {
      static const auto empty = std::make_shared<const List>();
      return Items(empty);
    }
    case Kind::List: return Items(v.list);
    case Kind::Dict: {
      need_bytes(v.dict->items.size() * (kItemBytes + kStringBytes));
      List keys;
      keys.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) keys.push_back(dict_key_value(kv.first));
      return Items(Value::make_list(std::move(keys)).list);
    }
    case Kind::String: {
      const std::string& s = v.s();
      need_bytes(utf8_length(s) * (kItemBytes + kStringBytes));
      List chars;
      for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_next(s, i);
        chars.push_back(Value::string(s.substr(i, n)));
        i += n;
      }
      return Items(Value::make_list(std::move(chars)).list);
    }
    default: fail("'{}' object is not iterable", kind_name(v));
  }
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List: return v.generator ? "generator" : v.tuple ? "tuple" : "list";
    case Kind::Dict: return "dict";
    case Kind::Namespace: return "Namespace";
    case Kind::Function: return "function";
  }
  return "?";
}

}  // namespace baton::jinja
