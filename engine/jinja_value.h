// The values a Jinja chat template computes with, modelled on the Python
// objects Jinja2 works on: the rendering must match Jinja2's byte for byte, so
// str(), repr(), truthiness, comparison and json.dumps follow Python exactly
// (docs/CHAT_TEMPLATES.md lists the subset).
//
// Lists and dicts are shared and immutable once built, as in the sandbox
// Hugging Face renders templates in (list.append raises there); a namespace
// is the one mutable object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace baton::jinja {

// Any error while rendering: what Jinja2 raises (TemplateError, TypeError,
// UndefinedError...). Tests compare that an error happens, not its text.
class RenderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Value;
using List = std::vector<Value>;
struct Dict;
struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

struct Value {
  Kind kind = Kind::Undefined;
  bool tuple = false;      // a List that Python would hold as a tuple (repr uses parentheses)
  bool markup = false;     // a String marked safe (Markup): `+` HTML-escapes a plain str operand
  bool generator = false;  // a List that Jinja2 returns as a generator (map, select...): always
                           // true, no len(), not JSON serializable, not subscriptable
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // String; for Undefined, the missing name (for messages)
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
  static Value from_json(const nlohmann::ordered_json& j);

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
// What a for loop over the value visits (dict: keys; string: characters;
// Undefined: nothing). Throws for what Python cannot iterate.
List iterate(const Value& v);
const char* kind_name(const Value& v);

// UTF-8 helpers: code point counts and slices, as Python indexes str.
std::vector<std::string> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);
bool is_py_space(uint32_t cp);

}  // namespace baton::jinja
