// Attribute and item access, and the Python str / dict / list methods chat
// templates call, under Hugging Face's immutable sandbox: methods that would
// change a list or dict (append, pop, update...) raise, as they do there.
#include <clocale>
#include <cwctype>
#include <locale.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "chat/jinja/render.h"
#include "engine/text/unicode.h"

namespace baton::jinja {
namespace {

const std::set<std::string> kStrMethods = {
    "strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "replace", "upper", "lower",
    "title", "capitalize", "format", "find", "rfind", "count", "join", "isdigit", "isalpha", "isalnum",
    "isspace", "islower", "isupper", "splitlines"};
const std::set<std::string> kDictMethods = {"get", "items", "keys", "values", "copy", "pop", "update",
                                            "setdefault", "clear", "popitem"};
const std::set<std::string> kListMethods = {"index", "count", "append", "pop", "extend", "insert", "remove",
                                            "clear", "sort", "reverse"};
const std::set<std::string> kUnsafe = {"pop", "update", "setdefault", "clear", "popitem", "append",
                                       "extend", "insert", "remove", "sort", "reverse"};

bool has_method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return kStrMethods.count(name) > 0;
  if (obj.is_dict()) return kDictMethods.count(name) > 0;
  if (obj.is_list()) return kListMethods.count(name) > 0;
  return false;
}

Value bound(const Value& obj, const std::string& name) {
  return Value::function(
      [obj, name](CallArgs& a) {
        Value r;
        call_method(obj, name, a, r);
        return r;
      },
      obj);
}

int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

const std::string& str_arg(const CallArgs& a, size_t i, const char* name, const char* method) {
  const Value* v = a.get(i, name);
  if (!v || !v->is_string()) fail("{}() argument must be str", method);
  return v->s();
}

// Appends one piece of a split: each is charged as it is made, and the list
// that will hold them is checked first.
void push_part(List& parts, std::string_view part) {
  need_bytes((parts.size() + 1) * kItemBytes + part.size() + kStringBytes);
  work(kItemWork);
  parts.push_back(Value::string(std::string(part)));
}

List split_ws(const std::string& s, int64_t maxsplit) {
  work(s.size() * kCharWork);
  List out;
  size_t k = 0;
  auto space_at = [&](size_t i) { return is_py_space(utf8_decode(s, i, utf8_next(s, i))); };
  while (k < s.size()) {
    while (k < s.size() && space_at(k)) k += utf8_next(s, k);
    if (k == s.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {  // the rest, trailing whitespace kept
      push_part(out, std::string_view(s).substr(k));
      break;
    }
    const size_t start = k;
    while (k < s.size() && !space_at(k)) k += utf8_next(s, k);
    push_part(out, std::string_view(s).substr(start, k - start));
  }
  return out;
}

// str.format with `{}`, `{0}` and `{name}` fields; the output is checked
// against the memory limit before each piece is appended.
std::string py_format(const std::string& fmtstr, const CallArgs& a) {
  work(fmtstr.size());
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < fmtstr.size(); ++i) {
    const char c = fmtstr[i];
    if (c == '{' && i + 1 < fmtstr.size() && fmtstr[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < fmtstr.size() && fmtstr[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      const size_t e = fmtstr.find('}', i);
      if (e == std::string::npos) throw RenderError("Single '{' encountered in format string");
      const std::string field = fmtstr.substr(i + 1, e - i - 1);
      if (field.find_first_of(":!.[") != std::string::npos) throw RenderError("unsupported format field");
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_idx < a.pos.size() ? &a.pos[auto_idx] : nullptr;
        ++auto_idx;
      } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
        const size_t k = field.size() < 10 ? std::stoul(field) : SIZE_MAX;
        v = k < a.pos.size() ? &a.pos[k] : nullptr;
      } else {
        for (const auto& [kn, kv] : a.kw)
          if (kn == field) v = &kv;
      }
      if (!v) throw RenderError("format: missing argument");
      need_bytes(out.size() + v->s().size());
      append_str(out, *v);
      need_bytes(out.size());
      i = e;
    } else if (c == '}') {
      throw RenderError("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

// str.replace: the result's size is known before it is built.
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  work(s.size());
  size_t hits = 0;
  if (from.empty()) {
    hits = utf8_length(s) + 1;
  } else {
    for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + from.size())) ++hits;
  }
  work(hits * kItemWork);  // a search and an append per hit
  if (count >= 0) hits = std::min(hits, size_t(count));
  size_t total;
  if (__builtin_mul_overflow(hits, to.size(), &total) || __builtin_add_overflow(total, s.size(), &total))
    total = SIZE_MAX;
  need_bytes(total);
  work(total);
  std::string out;
  out.reserve(total - std::min(total, hits * from.size()));
  if (from.empty()) {
    for (size_t i = 0;; i += utf8_next(s, i)) {
      if (hits > 0) {
        out += to;
        --hits;
      }
      if (i >= s.size()) break;
      out.append(s, i, utf8_next(s, i));
    }
    return out;
  }
  size_t p = 0;
  for (; hits > 0; --hits) {
    const size_t q = s.find(from, p);
    out.append(s, p, q - p);
    out += to;
    p = q + from.size();
  }
  out.append(s, p);
  return out;
}

bool str_method(const std::string& s, const std::string& name, CallArgs& a, Value& r) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = a.get(0, "chars");
    if (chars && chars->is_none()) chars = nullptr;
    r = Value::string(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  } else if (name == "split" || name == "rsplit") {
    const Value* sep = a.get(0, "sep");
    const Value* mx = a.get(1, "maxsplit");
    const int64_t maxsplit = mx ? mx->i : -1;
    if (!sep || sep->is_none()) {
      if (name == "rsplit" && maxsplit >= 0) throw RenderError("unsupported rsplit with maxsplit");
      r = Value::make_list(split_ws(s, maxsplit));
      return true;
    }
    if (!sep->is_string() || sep->s().empty()) throw RenderError("empty separator");
    const std::string& sp = sep->s();
    work(s.size());
    List parts;
    if (name == "split") {
      size_t p = 0;
      while (true) {
        const size_t q = s.find(sp, p);
        if (q == std::string::npos || (maxsplit >= 0 && int64_t(parts.size()) == maxsplit)) break;
        push_part(parts, std::string_view(s).substr(p, q - p));
        p = q + sp.size();
      }
      push_part(parts, std::string_view(s).substr(p));
    } else {
      size_t end = s.size();
      while (true) {  // from the right, reversed at the end
        if (maxsplit >= 0 && int64_t(parts.size()) == maxsplit) break;
        if (end < sp.size()) break;
        const size_t q = s.rfind(sp, end - sp.size());
        if (q == std::string::npos) break;
        push_part(parts, std::string_view(s).substr(q + sp.size(), end - q - sp.size()));
        end = q;
      }
      push_part(parts, std::string_view(s).substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    r = Value::make_list(std::move(parts));
  } else if (name == "startswith" || name == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) throw RenderError(name + "() takes at least 1 argument");
    const Items options = p->is_list() ? iterate(*p) : Items(std::make_shared<const List>(List{*p}));
    bool hit = false;
    for (const Value& o : options) {
      if (!o.is_string()) throw RenderError(name + " first arg must be str or a tuple of str");
      const std::string& x = o.s();
      work(kItemWork + x.size());
      hit = hit || (name == "startswith" ? s.compare(0, x.size(), x) == 0 && s.size() >= x.size()
                                         : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0);
    }
    r = Value::boolean(hit);
  } else if (name == "replace") {
    const std::string& from = str_arg(a, 0, "old", "replace");
    const std::string& to = str_arg(a, 1, "new", "replace");
    const Value* cnt = a.get(2, "count");
    r = Value::string(py_replace(s, from, to, cnt ? cnt->i : -1));
  } else if (name == "upper") {
    r = Value::string(py_upper(s));
  } else if (name == "lower") {
    r = Value::string(py_lower(s));
  } else if (name == "title" || name == "capitalize") {
    work(s.size());
    std::string out = s;
    bool prev_cased = false;
    for (size_t k = 0; k < out.size(); ++k) {
      const char c = out[k];
      const bool alpha = std::isalpha(static_cast<unsigned char>(c));
      const bool first = name == "title" ? !prev_cased : k == 0;
      out[k] = char(first ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
      prev_cased = alpha;
    }
    r = Value::string(std::move(out));
  } else if (name == "format") {
    r = Value::string(py_format(s, a));
  } else if (name == "find" || name == "rfind" || name == "count") {
    const std::string& sub = str_arg(a, 0, "sub", name.c_str());
    work(s.size() + sub.size());
    if (name == "count") {
      int64_t n = 0;
      if (sub.empty()) n = int64_t(utf8_length(s)) + 1;
      else
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      work(size_t(n) * kItemWork);
      r = Value::integer(n);
    } else {
      const size_t p = name == "find" ? s.find(sub) : s.rfind(sub);
      r = Value::integer(p == std::string::npos ? -1 : int64_t(utf8_length(std::string_view(s).substr(0, p))));
    }
  } else if (name == "join") {
    const Value* it = a.get(0, "iterable");
    if (!it) throw RenderError("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(*it)) {
      if (!v.is_string()) throw RenderError("sequence item: expected str instance");
      need_bytes(out.size() + s.size() + v.s().size());
      work(kItemWork + s.size() + v.s().size());
      if (!first) out += s;
      out += v.s();
      first = false;
    }
    r = Value::string(std::move(out));
  } else if (name == "splitlines") {
    work(s.size());
    List parts;
    size_t p = 0;
    for (size_t k = 0; k < s.size(); ++k) {
      if (s[k] == '\n' || s[k] == '\r') {
        push_part(parts, std::string_view(s).substr(p, k - p));
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        p = k + 1;
      }
    }
    if (p < s.size()) push_part(parts, std::string_view(s).substr(p));
    r = Value::make_list(std::move(parts));
  } else {
    // True when s is not empty and every character passes.
    auto all = [&](auto pred) {
      work(s.size() * kCharWork);
      if (s.empty()) return false;
      for (size_t i = 0; i < s.size(); i += utf8_next(s, i))
        if (!pred(std::string_view(s).substr(i, utf8_next(s, i)))) return false;
      return true;
    };
    auto ascii = [](auto f) { return [f](std::string_view ch) { return ch.size() == 1 && f(static_cast<unsigned char>(ch[0])); }; };
    if (name == "isdigit") r = Value::boolean(all(ascii(::isdigit)));
    else if (name == "isalpha") r = Value::boolean(all(ascii(::isalpha)));
    else if (name == "isalnum") r = Value::boolean(all(ascii(::isalnum)));
    else if (name == "isspace") r = Value::boolean(all([](std::string_view ch) { return is_py_space(utf8_decode(ch, 0, ch.size())); }));
    else if (name == "islower") r = Value::boolean(py_lower(s) == s && py_upper(s) != s);
    else if (name == "isupper") r = Value::boolean(py_upper(s) == s && py_lower(s) != s);
    else return false;
  }
  return true;
}

Value slice(const Value& obj, const CallArgs& a) {
  const bool is_str = obj.is_string();
  if (!is_str && !obj.is_list()) fail("'{}' object is not subscriptable", kind_name(obj));
  const std::string& src = obj.s();
  const int64_t n = is_str ? int64_t(utf8_length(src)) : int64_t(obj.list->size());
  auto arg = [&](size_t k) -> const Value* { return a.pos[k].is_none() ? nullptr : &a.pos[k]; };
  const int64_t step = arg(2) ? arg(2)->i : 1;
  if (step == 0) throw RenderError("slice step cannot be zero");
  auto clamp = [&](const Value* v, int64_t def) {
    if (!v) return def;
    int64_t i = v->i;
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = clamp(arg(0), step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(arg(1), step > 0 ? n : -1);
  if (is_str && step == 1) {
    if (start >= stop) return Value::string("");
    const size_t b = utf8_offset(src, size_t(start));
    return Value::string(src.substr(b, utf8_offset(std::string_view(src).substr(b), size_t(stop - start))));
  }
  // A string's code point offsets (one more for the end).
  std::vector<size_t> at;
  if (is_str) {
    need_bytes(size_t(n + 1) * sizeof(size_t));
    work(src.size() * kCharWork);
    for (size_t i = 0; i < src.size(); i += utf8_next(src, i)) at.push_back(i);
    at.push_back(src.size());
  }
  std::string s;
  List l;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (is_str) {
      need_bytes(s.size() + 4);
      s.append(src, at[size_t(i)], at[size_t(i) + 1] - at[size_t(i)]);
    } else {
      if (l.size() % 4096 == 0) need_bytes((l.size() + 4096) * kItemBytes);
      l.push_back((*obj.list)[size_t(i)]);
    }
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return is_str ? Value::string(std::move(s)) : Value::make_list(std::move(l), obj.tuple);
}

}  // namespace

bool call_method(const Value& obj, const std::string& name, CallArgs& a, Value& r) {
  if (name == "__slice__") {
    r = slice(obj, a);
    return true;
  }
  if (!has_method(obj, name)) return false;
  if (!obj.is_string() && kUnsafe.count(name))
    fail("access to attribute '{}' of '{}' object is unsafe.", name, kind_name(obj));
  if (obj.is_string()) return str_method(obj.s(), name, a, r);
  if (obj.is_dict()) {
    if (name == "get") {
      const Value* k = a.get(0, "key");
      const Value* d = a.get(1, "default");
      std::string key;
      const Value* v = k && dict_key(*k, key) ? obj.dict->find(key) : nullptr;
      r = v ? *v : d ? *d : Value::none();
    } else if (name == "copy") {
      need_bytes(obj.dict->items.size() * kEntryBytes);
      r = Value::make_dict(*obj.dict);
    } else {
      need_bytes(obj.dict->items.size() * (name == "items" ? 3 * kItemBytes + kStringBytes : kItemBytes + kStringBytes));
      List out;
      for (const auto& [k, v] : obj.dict->items) {
        if (name == "items") out.push_back(Value::make_list({dict_key_value(k), v}, true));
        else if (name == "keys") out.push_back(dict_key_value(k));
        else out.push_back(v);
      }
      r = Value::make_list(std::move(out));
    }
    return true;
  }
  const Value* x = a.get(0, "value");
  if (!x) throw RenderError(name + "() takes exactly one argument");
  int64_t n = 0, first = -1;
  for (size_t k = 0; k < obj.list->size(); ++k)
    if (equals((*obj.list)[k], *x)) {
      ++n;
      if (first < 0) first = int64_t(k);
    }
  if (name == "index" && first < 0) throw RenderError("value is not in list");
  r = Value::integer(name == "index" ? first : n);
  return true;
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined())
    fail("'{}' is undefined (attribute '{}')", obj.s().empty() ? "value" : obj.s(), name);
  if (has_method(obj, name)) {
    if (!obj.is_string() && kUnsafe.count(name))
      return Value::function([name, kind = std::string(kind_name(obj))](CallArgs&) -> Value {
        fail("access to attribute '{}' of '{}' object is unsafe.", name, kind);
      });
    return bound(obj, name);
  }
  if (obj.is_dict() || obj.kind == Kind::Namespace) {
    if (const Value* v = obj.dict->find(name)) return *v;
  }
  return Value::undefined(name);
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail("'{}' is undefined (item access)", obj.s().empty() ? "value" : obj.s());
  std::string k;
  if (obj.is_dict() && dict_key(key, k)) {
    if (const Value* v = obj.dict->find(k)) return *v;
  }
  if (obj.is_list() && obj.generator) return Value::undefined();
  if ((obj.is_list() || obj.is_string()) && (key.kind == Kind::Int || key.kind == Kind::Bool)) {
    const int64_t k0 = key.kind == Kind::Bool ? int64_t(key.b) : key.i;
    if (obj.is_list()) {
      const int64_t k = norm_index(k0, int64_t(obj.list->size()));
      if (k >= 0 && k < int64_t(obj.list->size())) return (*obj.list)[size_t(k)];
    } else {
      const std::string& str = obj.s();
      const int64_t k = k0 < 0 ? norm_index(k0, int64_t(utf8_length(str))) : k0;
      if (k >= 0) {
        const size_t at = utf8_offset(str, size_t(k));
        if (at < str.size()) return Value::string(str.substr(at, utf8_next(str, at)));
      }
    }
    return Value::undefined();
  }
  if (key.is_string()) return get_attr(obj, key.s());
  return Value::undefined();
}

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  if (chars && !chars->is_string()) type_error("strip arg must be None or str");
  const std::string_view set = chars ? std::string_view(chars->s()) : std::string_view();
  // Whether the set holds the character (whole code points compared).
  auto in_set = [&](std::string_view ch) {
    work(set.size());
    for (size_t i = 0; i < set.size(); i += utf8_next(set, i))
      if (set.substr(i, utf8_next(set, i)) == ch) return true;
    return false;
  };
  auto strippable = [&](std::string_view ch) {
    work(kCharWork);
    return chars ? in_set(ch) : is_py_space(utf8_decode(ch, 0, ch.size()));
  };
  const std::string_view sv = s;
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && strippable(sv.substr(b, utf8_next(sv, b)))) b += utf8_next(sv, b);
  if (right) {
    // The last character's start: step back over continuation bytes.
    while (e > b) {
      size_t c = e - 1;
      while (c > b && (static_cast<unsigned char>(s[c]) & 0xC0) == 0x80) --c;
      if (utf8_next(sv, c) != e - c) c = e - 1;  // not a whole character: a byte alone
      if (!strippable(sv.substr(c, e - c))) break;
      e = c;
    }
  }
  return s.substr(b, e - b);
}

namespace {
// Unicode simple case mapping from the C library (the C.UTF-8 locale's
// tables); ASCII only if that locale is missing. Python's special cases
// (German sharp s to "SS"...) are not applied.
uint32_t map_case(uint32_t cp, bool upper) {
  static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", locale_t(0));
  if (cp < 0x80 || !loc) {
    if (cp >= 0x80) return cp;
    return uint32_t(upper ? std::toupper(int(cp)) : std::tolower(int(cp)));
  }
  return uint32_t(upper ? towupper_l(wint_t(cp), loc) : towlower_l(wint_t(cp), loc));
}

// A mapped character takes at most 3 bytes for 2 (U+0250 -> U+2C6F).
std::string map_string(const std::string& s, bool upper) {
  need_bytes(s.size() + s.size() / 2);
  work(s.size() * kCharWork);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {  // ASCII, most of any prompt
      out += char(upper ? (c >= 'a' && c <= 'z' ? c - 32 : c) : (c >= 'A' && c <= 'Z' ? c + 32 : c));
      ++i;
      continue;
    }
    const size_t n = utf8_next(s, i);
    if (n == 1) out += char(map_case(uint8_t(s[i]), upper));
    else utf8_append(out, char32_t(map_case(utf8_decode(s, i, n), upper)));
    i += n;
  }
  return out;
}
}  // namespace

std::string py_lower(const std::string& s) { return map_string(s, false); }
std::string py_upper(const std::string& s) { return map_string(s, true); }

}  // namespace baton::jinja
