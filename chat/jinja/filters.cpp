// Jinja2's built-in filters and tests that chat templates use, plus the
// Hugging Face environment's tojson (json.dumps with ensure_ascii=False and
// its indent / separators / sort_keys arguments) and globals.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "chat/jinja/render.h"

namespace baton::jinja {
namespace {

using FilterFn = Value (*)(Renderer&, const Value&, CallArgs&);
using TestFn = bool (*)(Renderer&, const Value&, CallArgs&);

const Value* arg(const CallArgs& a, size_t i, const char* name) { return a.get(i, name); }
bool flag(const CallArgs& a, size_t i, const char* name) {
  const Value* v = a.get(i, name);
  return v && v->truthy();
}

size_t py_len(const Value& v) {
  switch (v.kind) {
    case Kind::String: return utf8_length(v.s());
    case Kind::List:
      if (v.generator) type_error("object of type 'generator' has no len()");
      return v.list->size();
    case Kind::Dict: return v.dict->items.size();
    case Kind::Undefined: return 0;
    default: fail("object of type '{}' has no len()", kind_name(v));
  }
}

// Attribute lookup by a dotted path, as Jinja's make_attrgetter ("a.b", "0").
Value attr_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t p = 0;
  while (true) {
    const size_t q = path.find('.', p);
    const std::string part = path.substr(p, q == std::string::npos ? std::string::npos : q - p);
    Value key = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) ? Value::integer(std::stoll(part))
                                                                                  : Value::string(part);
    cur = get_item(cur, key);
    if (q == std::string::npos) return cur;
    p = q + 1;
  }
}

// Case-insensitive sort key, as Jinja's ignore_case.
Value fold(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(py_lower(v.s())) : v;
}

Value f_tojson(Renderer&, const Value& v, CallArgs& a) {
  const Value* ind = arg(a, 1, "indent");
  const int indent = ind && !ind->is_none() ? int(ind->i) : -1;
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  if (const Value* sep = arg(a, 2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->list->size() != 2) type_error("separators must be a pair");
    item_sep = to_str((*sep->list)[0]);
    key_sep = to_str((*sep->list)[1]);
  }
  return Value::string(to_json(v, indent, item_sep, key_sep, flag(a, 3, "sort_keys"), flag(a, 0, "ensure_ascii")));
}

Value f_length(Renderer&, const Value& v, CallArgs&) { return Value::integer(int64_t(py_len(v))); }
Value f_string(Renderer&, const Value& v, CallArgs&) { return Value::string(to_str(v)); }
Value f_safe(Renderer&, const Value& v, CallArgs&) {
  Value m = Value::string(to_str(v));
  m.markup = true;
  return m;
}
Value f_trim(Renderer&, const Value& v, CallArgs& a) {
  const Value* chars = arg(a, 0, "chars");
  return Value::string(py_strip(to_str(v), chars && !chars->is_none() ? chars : nullptr, true, true));
}
Value f_upper(Renderer&, const Value& v, CallArgs&) { return Value::string(py_upper(to_str(v))); }
Value f_lower(Renderer&, const Value& v, CallArgs&) { return Value::string(py_lower(to_str(v))); }
Value f_capitalize(Renderer&, const Value& v, CallArgs&) {
  CallArgs none;
  Value r;
  call_method(Value::string(to_str(v)), "capitalize", none, r);
  return r;
}
Value f_title(Renderer&, const Value& v, CallArgs&) {
  // Jinja's do_title: words start after - whitespace ( { [ <.
  std::string s = to_str(v), out;
  work(s.size());
  bool start = true;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || std::isspace(u);
    out += char(start ? std::toupper(u) : std::tolower(u));
    start = sep;
  }
  return Value::string(out);
}
Value f_default(Renderer&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default_value");
  if (v.is_undefined() || (flag(a, 1, "boolean") && !v.truthy())) return d ? *d : Value::string("");
  return v;
}
// The output grows item by item, each checked against the memory limit
// before it is appended (a separator repeated between a million items is
// as big as the items).
Value f_join(Renderer&, const Value& v, CallArgs& a) {
  const Value* sep = arg(a, 0, "d");
  const Value* attr = arg(a, 1, "attribute");
  const std::string sep_text = sep ? to_str(*sep) : "";
  const std::string path = attr && !attr->is_none() ? to_str(*attr) : "";
  std::string out;
  bool first = true;
  for (const Value& e : iterate(v)) {
    const Value x = attr && !attr->is_none() ? attr_path(e, path) : e;
    need_bytes(out.size() + sep_text.size() + x.s().size());
    if (!first) {
      work(sep_text.size());
      out += sep_text;
    }
    append_str(out, x);
    first = false;
  }
  return Value::string(std::move(out));
}
Value f_first(Renderer&, const Value& v, CallArgs&) {
  if (v.is_string()) return v.s().empty() ? Value::undefined() : Value::string(v.s().substr(0, utf8_next(v.s(), 0)));
  const Items l = iterate(v);
  return l.empty() ? Value::undefined() : l.front();
}
Value f_last(Renderer&, const Value& v, CallArgs&) {
  if (v.is_list() && v.generator) type_error("'generator' object is not reversible");
  const Items l = iterate(v);
  return l.empty() ? Value::undefined() : l.back();
}
Value f_list(Renderer&, const Value& v, CallArgs&) { return Value::make_list(iterate(v).copy()); }
Value f_reverse(Renderer&, const Value& v, CallArgs&) {
  if (v.is_string()) {
    const std::string& s = v.s();
    work(s.size() * kCharWork);
    std::string out(s.size(), '\0');
    for (size_t i = 0; i < s.size();) {
      const size_t n = utf8_next(s, i);
      s.copy(out.data() + (s.size() - i - n), n, i);
      i += n;
    }
    return Value::string(std::move(out));
  }
  List l = iterate(v).copy();
  std::reverse(l.begin(), l.end());
  return Value::make_generator(std::move(l));  // reversed(): an iterator
}
// One (key, value) tuple per entry: three list items' worth each.
void need_pairs(const Dict& d) { need_bytes(d.items.size() * (3 * kItemBytes + kStringBytes)); }
Value f_items(Renderer&, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::make_list({});
  if (!v.is_dict()) type_error("Can only get item pairs from a mapping.");
  need_pairs(*v.dict);
  List out;
  for (const auto& [k, e] : v.dict->items) out.push_back(Value::make_list({dict_key_value(k), e}, true));
  return Value::make_generator(std::move(out));
}
Value f_dictsort(Renderer&, const Value& v, CallArgs& a) {
  if (!v.is_dict()) type_error("dictsort: a mapping is required");
  const bool cs = flag(a, 0, "case_sensitive");
  const Value* by = arg(a, 1, "by");
  const bool by_value = by && to_str(*by) == "value";
  need_pairs(*v.dict);
  List out;
  for (const auto& [k, e] : v.dict->items) out.push_back(Value::make_list({dict_key_value(k), e}, true));
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    const size_t i = by_value ? 1 : 0;
    return less(fold((*x.list)[i], cs), fold((*y.list)[i], cs));
  });
  if (flag(a, 2, "reverse")) std::reverse(out.begin(), out.end());
  return Value::make_list(std::move(out));
}
Value f_replace(Renderer&, const Value& v, CallArgs& a) {
  CallArgs m;
  for (size_t k = 0; k < 3; ++k)
    if (const Value* x = arg(a, k, k == 0 ? "old" : k == 1 ? "new" : "count")) m.pos.push_back(x->is_none() ? Value::integer(-1) : *x);
  Value r;
  if (m.pos.size() >= 2) {
    m.pos[0] = Value::string(to_str(m.pos[0]));
    m.pos[1] = Value::string(to_str(m.pos[1]));
  }
  call_method(Value::string(to_str(v)), "replace", m, r);
  return r;
}
bool fits_int(double f) { return std::isfinite(f) && std::fabs(f) < 9.2e18; }
Value f_int(Renderer&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  const Value def = d ? *d : Value::integer(0);
  switch (v.kind) {
    case Kind::Int: return v;
    case Kind::Bool: return Value::integer(v.b);
    case Kind::Float: return fits_int(v.f) ? Value::integer(int64_t(v.f)) : def;
    case Kind::String: {
      std::string s = py_strip(v.s(), nullptr, true, true);
      try {
        size_t used = 0;
        const long long i = std::stoll(s, &used, 10);
        if (used == s.size()) return Value::integer(i);
        const double f = std::stod(s, &used);
        if (used == s.size() && fits_int(f)) return Value::integer(int64_t(f));
      } catch (const std::exception&) {
      }
      return def;
    }
    default: return def;
  }
}
Value f_float(Renderer&, const Value& v, CallArgs& a) {
  const Value* d = arg(a, 0, "default");
  if (v.is_number()) return Value::number(v.kind == Kind::Float ? v.f : double(v.kind == Kind::Bool ? v.b : v.i));
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string s = py_strip(v.s(), nullptr, true, true);
      const double f = std::stod(s, &used);
      if (used == s.size()) return Value::number(f);
    } catch (const std::exception&) {
    }
  }
  return d ? *d : Value::number(0);
}
Value f_abs(Renderer&, const Value& v, CallArgs&) {
  if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
  if (v.kind == Kind::Int) return Value::integer(v.i < 0 ? -v.i : v.i);
  type_error("bad operand type for abs()");
}
// Jinja's do_indent: the text plus "\n", split as str.splitlines() splits,
// rejoined with "\n" and the indent before every line but the first
// (before blank lines too with `blank`; before the first with `first`).
Value f_indent(Renderer&, const Value& v, CallArgs& a) {
  const Value* w = arg(a, 0, "width");
  const int64_t width = w && !w->is_string() ? w->i : 4;
  need_bytes(size_t(std::max<int64_t>(width, 0)));
  const std::string ind = w && w->is_string() ? w->s() : std::string(size_t(std::max<int64_t>(width, 0)), ' ');
  const bool first = flag(a, 1, "first"), blank = flag(a, 2, "blank");
  const std::string s = to_str(v) + "\n";
  std::string out;
  if (first) out += ind;
  size_t p = 0;
  bool first_line = true;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] != '\n' && s[k] != '\r' && s[k] != '\v' && s[k] != '\f') continue;
    const std::string_view line = std::string_view(s).substr(p, k - p);
    const bool indented = !first_line && (blank || !line.empty());
    need_bytes(out.size() + 1 + (indented ? ind.size() : 0) + line.size());
    work(1 + (indented ? ind.size() : 0) + line.size());
    if (!first_line) out += '\n';
    if (indented) out += ind;
    out += line;
    first_line = false;
    if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
    p = k + 1;
  }
  return Value::string(std::move(out));
}

// map / select / reject / selectattr / rejectattr.
Value f_map(Renderer& r, const Value& v, CallArgs& a) {
  List out;
  if (!v.truthy()) return Value::make_generator({});
  const Value* attr = arg(a, SIZE_MAX, "attribute");
  if (attr) {
    const Value* def = arg(a, SIZE_MAX, "default");
    for (const Value& e : iterate(v)) {
      Value x = attr_path(e, to_str(*attr));
      out.push_back(x.is_undefined() && def ? *def : x);
    }
  } else {
    if (a.pos.empty()) type_error("map requires a filter argument");
    const std::string name = to_str(a.pos[0]);
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& e : iterate(v)) {
      CallArgs c = rest;
      work(kItemWork * (c.pos.size() + c.kw.size() + 1));
      out.push_back(r.filter(name, e, c, 0));
    }
  }
  return Value::make_generator(std::move(out));
}
List select_impl(Renderer& r, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  List out;
  if (!v.truthy()) return out;
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) type_error("selectattr requires an attribute");
    attr = to_str(a.pos[i++]);
  }
  std::string test;
  if (i < a.pos.size()) test = to_str(a.pos[i++]);
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + std::min(i, a.pos.size()), a.pos.end());
  for (const Value& e : iterate(v)) {
    Value x = by_attr ? attr_path(e, attr) : e;
    CallArgs c = rest;
    work(kItemWork * (c.pos.size() + 1));
    const bool ok = test.empty() ? x.truthy() : r.test(test, x, c, 0);
    if (ok == keep) out.push_back(e);
  }
  return out;
}
Value f_select(Renderer& r, const Value& v, CallArgs& a) { return Value::make_generator(select_impl(r, v, a, false, true)); }
Value f_reject(Renderer& r, const Value& v, CallArgs& a) { return Value::make_generator(select_impl(r, v, a, false, false)); }
Value f_selectattr(Renderer& r, const Value& v, CallArgs& a) { return Value::make_generator(select_impl(r, v, a, true, true)); }
Value f_rejectattr(Renderer& r, const Value& v, CallArgs& a) { return Value::make_generator(select_impl(r, v, a, true, false)); }

Value sort_key(const Value& e, const Value* attr, bool cs) {
  return fold(attr && !attr->is_none() ? attr_path(e, to_str(*attr)) : e, cs);
}
Value f_sort(Renderer&, const Value& v, CallArgs& a) {
  List l = iterate(v).copy();
  const bool cs = flag(a, 1, "case_sensitive");
  const Value* attr = arg(a, 2, "attribute");
  std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
    return less(sort_key(x, attr, cs), sort_key(y, attr, cs));
  });
  if (flag(a, 0, "reverse")) {
    // Python's sort(reverse=True) keeps equal items in their order.
    std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
      return less(sort_key(y, attr, cs), sort_key(x, attr, cs));
    });
  }
  return Value::make_list(std::move(l));
}
Value f_unique(Renderer&, const Value& v, CallArgs& a) {
  const bool cs = flag(a, 0, "case_sensitive");
  const Value* attr = arg(a, 1, "attribute");
  List out, seen;
  for (const Value& e : iterate(v)) {
    Value k = sort_key(e, attr, cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
      seen.push_back(k);
      out.push_back(e);
    }
  }
  return Value::make_generator(std::move(out));
}
Value minmax(const Value& v, CallArgs& a, bool want_max) {
  const bool cs = flag(a, 0, "case_sensitive");
  const Value* attr = arg(a, 1, "attribute");
  const Items l = iterate(v);
  if (l.empty()) return Value::undefined();
  size_t best = 0;
  for (size_t k = 1; k < l.size(); ++k) {
    const bool better = want_max ? less(sort_key(l[best], attr, cs), sort_key(l[k], attr, cs))
                                 : less(sort_key(l[k], attr, cs), sort_key(l[best], attr, cs));
    if (better) best = k;
  }
  return l[best];
}
Value f_min(Renderer&, const Value& v, CallArgs& a) { return minmax(v, a, false); }
Value f_max(Renderer&, const Value& v, CallArgs& a) { return minmax(v, a, true); }
Value f_sum(Renderer& r, const Value& v, CallArgs& a) {
  const Value* attr = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  Value total = start ? *start : Value::integer(0);
  CallArgs none;
  for (const Value& e : iterate(v)) {
    Value x = attr && !attr->is_none() ? attr_path(e, to_str(*attr)) : e;
    if (!x.is_number() || !total.is_number()) type_error("sum: unsupported operand");
    const int64_t ti = total.kind == Kind::Bool ? total.b : total.i, xi = x.kind == Kind::Bool ? x.b : x.i;
    int64_t r;
    if (total.kind == Kind::Float || x.kind == Kind::Float)
      total = Value::number((total.kind == Kind::Float ? total.f : double(ti)) + (x.kind == Kind::Float ? x.f : double(xi)));
    else if (__builtin_add_overflow(ti, xi, &r))
      throw RenderError("integer overflow (Baton's integers are 64-bit)");
    else
      total = Value::integer(r);
  }
  (void)r;
  return total;
}
Value f_escape(Renderer&, const Value& v, CallArgs&) {
  if (v.is_string() && v.markup) return v;
  Value m = Value::string(html_escape(to_str(v)));
  m.markup = true;
  return m;
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> m = {
      {"tojson", f_tojson}, {"length", f_length}, {"count", f_length}, {"string", f_string},
      {"safe", f_safe}, {"trim", f_trim}, {"upper", f_upper}, {"lower", f_lower},
      {"capitalize", f_capitalize}, {"title", f_title}, {"default", f_default}, {"d", f_default},
      {"join", f_join}, {"first", f_first}, {"last", f_last}, {"list", f_list}, {"reverse", f_reverse},
      {"items", f_items}, {"dictsort", f_dictsort}, {"replace", f_replace}, {"int", f_int},
      {"float", f_float}, {"abs", f_abs}, {"indent", f_indent}, {"map", f_map}, {"select", f_select},
      {"reject", f_reject}, {"selectattr", f_selectattr}, {"rejectattr", f_rejectattr}, {"sort", f_sort},
      {"unique", f_unique}, {"min", f_min}, {"max", f_max}, {"sum", f_sum}, {"escape", f_escape},
      {"e", f_escape}};
  return m;
}

bool t_defined(Renderer&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Renderer&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Renderer&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_boolean(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::Bool; }
bool t_true(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::Bool && v.b; }
bool t_false(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::Bool && !v.b; }
bool t_integer(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::Int; }
bool t_float(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::Float; }
bool t_number(Renderer&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_string(Renderer&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_mapping(Renderer&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Renderer&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_sequence(Renderer&, const Value& v, CallArgs&) {
  return v.is_string() || (v.is_list() && !v.generator) || v.is_dict() || v.is_undefined();
}
bool t_callable(Renderer&, const Value& v, CallArgs&) { return v.kind == Kind::Function; }
const Value& other(const CallArgs& a) {
  if (a.pos.empty()) type_error("test needs an argument");
  return a.pos[0];
}
bool t_eq(Renderer&, const Value& v, CallArgs& a) { return equals(v, other(a)); }
bool t_ne(Renderer&, const Value& v, CallArgs& a) { return !equals(v, other(a)); }
bool t_lt(Renderer&, const Value& v, CallArgs& a) { return less(v, other(a)); }
bool t_gt(Renderer&, const Value& v, CallArgs& a) { return less(other(a), v); }
bool t_le(Renderer&, const Value& v, CallArgs& a) { return !less(other(a), v); }
bool t_ge(Renderer&, const Value& v, CallArgs& a) { return !less(v, other(a)); }
bool t_in(Renderer&, const Value& v, CallArgs& a) { return contains(other(a), v); }
bool t_sameas(Renderer&, const Value& v, CallArgs& a) {
  const Value& o = other(a);
  if (v.kind != o.kind) return false;
  if (v.kind == Kind::None || v.kind == Kind::Bool) return equals(v, o);
  return v.list == o.list && v.dict == o.dict && v.fn == o.fn && v.list && (v.is_list() || v.dict);
}
bool int_of(const Value& v, int64_t& out) {
  if (v.kind == Kind::Int) out = v.i;
  else if (v.kind == Kind::Bool) out = v.b;
  else return false;
  return true;
}
bool t_odd(Renderer&, const Value& v, CallArgs&) {
  int64_t i;
  if (!int_of(v, i)) type_error("odd: an integer is required");
  return i % 2 != 0;
}
bool t_even(Renderer&, const Value& v, CallArgs&) {
  int64_t i;
  if (!int_of(v, i)) type_error("even: an integer is required");
  return i % 2 == 0;
}
bool t_divisibleby(Renderer&, const Value& v, CallArgs& a) {
  int64_t i, d;
  if (!int_of(v, i) || !int_of(other(a), d) || d == 0) type_error("divisibleby: integers required");
  return i % d == 0;
}
bool t_lower(Renderer&, const Value& v, CallArgs&) { return py_lower(to_str(v)) == to_str(v); }
bool t_upper(Renderer&, const Value& v, CallArgs&) { return py_upper(to_str(v)) == to_str(v); }
bool t_filter(Renderer&, const Value& v, CallArgs&) { return v.is_string() && has_filter(v.s()); }
bool t_test(Renderer&, const Value& v, CallArgs&) { return v.is_string() && has_test(v.s()); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> m = {
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
      {"true", t_true}, {"false", t_false}, {"integer", t_integer}, {"float", t_float},
      {"number", t_number}, {"string", t_string}, {"mapping", t_mapping}, {"iterable", t_iterable},
      {"sequence", t_sequence}, {"callable", t_callable}, {"eq", t_eq}, {"equalto", t_eq}, {"==", t_eq},
      {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt}, {"gt", t_gt},
      {"greaterthan", t_gt}, {">", t_gt}, {"le", t_le}, {"<=", t_le}, {"ge", t_ge}, {">=", t_ge},
      {"in", t_in}, {"sameas", t_sameas}, {"odd", t_odd}, {"even", t_even},
      {"divisibleby", t_divisibleby}, {"lower", t_lower}, {"upper", t_upper}, {"filter", t_filter},
      {"test", t_test}};
  return m;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value Renderer::filter(const std::string& name, const Value& v, CallArgs& args, int line) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("line {}: no filter named '{}'", line, name);
  return it->second(*this, v, args);
}

bool Renderer::test(const std::string& name, const Value& v, CallArgs& args, int line) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("line {}: no test named '{}'", line, name);
  return it->second(*this, v, args);
}

Dict builtin_globals(std::time_t now) {
  Dict g;
  g.set("range", Value::function([](CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a.pos)
      if (v.kind != Kind::Int) type_error("range: integers required");
    if (a.pos.size() == 1) stop = a.pos[0].i;
    else if (a.pos.size() >= 2) start = a.pos[0].i, stop = a.pos[1].i;
    if (a.pos.size() == 3) step = a.pos[2].i;
    if (a.pos.empty() || a.pos.size() > 3 || step == 0) type_error("range: bad arguments");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
      if (out.size() >= 100000) type_error("range too big");
      out.push_back(Value::integer(i));
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    return Value::make_list(std::move(out));
  }));
  auto dict_of = [](CallArgs& a, bool ns) {
    Dict d;
    for (const Value& p : a.pos) {
      if (!p.is_dict()) type_error("namespace/dict: a mapping is required");
      if (d.items.empty()) {  // a dict's keys are unique already
        need_bytes(p.dict->items.size() * kEntryBytes);
        work(p.dict->items.size() * kItemWork);
        d.items = p.dict->items;
        continue;
      }
      for (const auto& [k, v] : p.dict->items) d.set(k, v);
    }
    for (const auto& [k, v] : a.kw) d.set(k, v);
    return ns ? Value::make_namespace(std::move(d)) : Value::make_dict(std::move(d));
  };
  g.set("namespace", Value::function([dict_of](CallArgs& a) { return dict_of(a, true); }));
  g.set("dict", Value::function([dict_of](CallArgs& a) { return dict_of(a, false); }));
  // The message goes back to the client: a template cannot make it huge.
  g.set("raise_exception", Value::function([](CallArgs& a) -> Value {
    if (a.pos.empty()) throw RenderError("raise_exception");
    std::string text = to_str(a.pos[0]);
    if (text.size() > kMaxRaiseBytes) {
      size_t cut = kMaxRaiseBytes;
      while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;  // whole characters
      text.resize(cut);
      text += "...";
    }
    throw RenderError(text);
  }));
  g.set("strftime_now", Value::function([now](CallArgs& a) {
    if (a.pos.empty() || !a.pos[0].is_string()) type_error("strftime_now needs a format string");
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, a.pos[0].s().c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
  return g;
}

}  // namespace baton::jinja
