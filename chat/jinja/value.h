// The values a Jinja chat template computes with, modelled on the Python
// objects Jinja2 works on: the rendering must match Jinja2's byte for byte, so
// str(), repr(), truthiness, comparison and json.dumps follow Python exactly
// (docs/CHAT_TEMPLATES.md lists the subset).
//
// Lists and dicts are shared and immutable once built, as in the sandbox
// Hugging Face renders templates in (list.append raises there); a namespace
// is the one mutable object. Strings are immutable and shared too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "chat/jinja/limits.h"

namespace baton::jinja {

// Any error while rendering: what Jinja2 raises (TemplateError, TypeError,
// UndefinedError...) and a limit passed (limits.h). Tests compare that
// an error happens, not its text.
class RenderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Throws RenderError with the formatted message. Out of line, so that the
// formatting buffer stays out of the frames of the recursive evaluator.
template <class... A>
[[noreturn, gnu::noinline, gnu::cold]] void fail(fmt::format_string<A...> f, A&&... a) {
  throw RenderError(fmt::format(f, std::forward<A>(a)...));
}

struct Value;
using List = std::vector<Value>;
struct Dict;
struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

// Strings, lists and dicts are shared, never copied: a value is a few
// pointers, whatever it holds. Those a render builds are charged to its
// meter (limits.h) when made and refunded when freed.
struct Value {
  Kind kind = Kind::Undefined;
  bool tuple = false;      // a List that Python would hold as a tuple (repr uses parentheses)
  bool markup = false;     // a String marked safe (Markup): `+` HTML-escapes a plain str operand
  bool generator = false;  // a List that Jinja2 returns as a generator (map, select...): always
                           // true, no len(), not JSON serializable, not subscriptable
  bool b = false;
  uint16_t depth = 0;      // List, Dict, bound method: 1 + its deepest item's (at most kMaxDepth)
  int64_t i = 0;
  double f = 0;
  std::shared_ptr<const std::string> text;  // String; for Undefined, the missing name (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // Dict and Namespace
  std::shared_ptr<Function> fn;

  Value() = default;
  static Value undefined(std::string name = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value make_list(List items, bool is_tuple = false);
  static Value make_generator(List items);
  static Value make_dict(Dict d);
  static Value make_namespace(Dict d);
  static Value function(Function fn);
  // A function that holds `owner` (a bound method): nests one deeper.
  static Value function(Function fn, const Value& owner);
  // Throws RenderError for JSON nested deeper than kMaxDepth.
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);

  // String's characters (Undefined's name); "" for other kinds.
  const std::string& s() const;
  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_list() const { return kind == Kind::List; }
  bool is_dict() const { return kind == Kind::Dict; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool truthy() const;
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

// Dict keys are strings; an integer key (Python allows them in dict literals)
// is stored as "\x01" and its digits. These convert between the two forms;
// dict_key returns false for keys of other types.
bool dict_key(const Value& key, std::string& out);
Value dict_key_value(const std::string& stored);

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Positional i, else keyword `name`, else nullptr; marks keyword use.
  const Value* get(size_t i, std::string_view name) const;
};

// Python's str() and repr() of the value (Undefined's str is "").
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// str(v) appended to out (no copy of a string's characters on the way).
void append_str(std::string& out, const Value& v);
// Python's repr of a float (shortest round trip, "1e-05", "1.0", "inf").
std::string float_repr(double d);
// markupsafe's escape (& < > " ').
std::string html_escape(std::string_view s);
// json.dumps(v, ensure_ascii=False, indent=..., separators=..., sort_keys=...);
// indent < 0 means None. Throws RenderError for what JSON cannot hold.
std::string to_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep,
                    bool sort_keys, bool ensure_ascii = false);
// Python ==, and <  (throws RenderError for types Python cannot order).
bool equals(const Value& a, const Value& b);
bool less(const Value& a, const Value& b);
// Python's `a in b`.
bool contains(const Value& container, const Value& item);

// What a for loop visits, read only: a list's own items (shared, not
// copied), a dict's keys, a string's characters.
class Items {
 public:
  explicit Items(std::shared_ptr<const List> l) : list_(std::move(l)) {}
  List::const_iterator begin() const { return list_->begin(); }
  List::const_iterator end() const { return list_->end(); }
  size_t size() const { return list_->size(); }
  bool empty() const { return list_->empty(); }
  const Value& operator[](size_t k) const { return (*list_)[k]; }
  const Value& front() const { return list_->front(); }
  const Value& back() const { return list_->back(); }
  // A copy to change (the copy's items are charged to the meter).
  List copy() const;

 private:
  std::shared_ptr<const List> list_;
};
// Undefined: nothing. Throws for what Python cannot iterate.
Items iterate(const Value& v);
const char* kind_name(const Value& v);

// UTF-8 helpers: code point counts and slices, as Python indexes str.
// utf8_next: the length of the character at byte i.
size_t utf8_next(std::string_view s, size_t i);
uint32_t utf8_decode(std::string_view s, size_t i, size_t n);
size_t utf8_length(std::string_view s);
// Byte offset of code point k (s.size() when k is past the end).
size_t utf8_offset(std::string_view s, size_t k);
bool is_py_space(uint32_t cp);

}  // namespace baton::jinja
