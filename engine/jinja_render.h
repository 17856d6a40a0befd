// The evaluator's internals shared by jinja_render.cpp (statements and
// expressions), jinja_filters.cpp (filters and tests) and jinja_methods.cpp
// (attribute lookup and the str / dict / list methods).
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>

#include "engine/jinja_ast.h"

namespace baton::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopeP = std::shared_ptr<Scope>;

class Renderer {
 public:
  Renderer(const Program& program, Dict globals, std::time_t now, uint64_t max_steps);
  std::string run();

  Value eval(const Expr& e, const ScopeP& scope);
  Value filter(const std::string& name, const Value& v, CallArgs& args, int line);
  bool test(const std::string& name, const Value& v, CallArgs& args, int line);
  std::time_t now() const { return now_; }

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body, const ScopeP& scope, std::string& out);
  Flow exec_for(const Node& n, const ScopeP& scope, std::string& out);
  void exec_set(const Node& n, const ScopeP& scope, const Value& v);
  Value make_macro(const Node& n, const ScopeP& scope);
  Value eval_call(const Expr& e, const ScopeP& scope);
  CallArgs eval_args(const Expr& e, const ScopeP& scope);
  Value lookup(const std::string& name, const ScopeP& scope) const;
  Value binary(const std::string& op, const Value& a, const Value& b, int line);

  // Limits for templates from untrusted files: Jinja2 has none, but a prompt
  // never needs this much.
  static constexpr int kMaxMacroDepth = 100;
  void step();

  const Program& program_;
  Dict globals_;
  std::time_t now_;
  int depth_ = 0;
  uint64_t steps_ = 0, max_steps_;
};

// Largest string or list a template may build (a guard against runaway
// repetition or concatenation).
inline constexpr size_t kMaxValueBytes = size_t(64) << 20;
// The value's size for that guard (string bytes or list items).
void check_size(size_t n);

// Jinja2's environment.getattr / getitem (sandboxed): a missing key or index
// gives Undefined; any access on Undefined raises.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// obj.name(args) for the str / dict / list methods; nullptr-equivalent
// (returns false) when obj has no such method.
bool call_method(const Value& obj, const std::string& name, CallArgs& args, Value& result);
// Python's str.strip / lstrip / rstrip (chars: none means whitespace).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_lower(std::string s);
std::string py_upper(std::string s);
// Python int(v) for the int filter and arithmetic helpers.
[[noreturn]] void type_error(const std::string& what);
// Global functions: range, namespace, dict, raise_exception, strftime_now.
Dict builtin_globals(std::time_t now);

}  // namespace baton::jinja
