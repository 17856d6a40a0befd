// The evaluator's internals shared by render.cpp (statements and
// expressions), filters.cpp (filters and tests) and methods.cpp
// (attribute lookup and the str / dict / list methods).
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>

#include "chat/jinja/ast.h"

namespace baton::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};
using ScopeP = std::shared_ptr<Scope>;

class Renderer {
 public:
  // Installs the render's meter on this thread until the Renderer is gone.
  Renderer(const Program& program, Dict globals, std::time_t now, const RenderLimits& limits);
  std::string run();

  Value eval(const Expr& e, const ScopeP& scope);
  Value filter(const std::string& name, const Value& v, CallArgs& args, int line);
  bool test(const std::string& name, const Value& v, CallArgs& args, int line);
  std::time_t now() const { return now_; }

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body, const ScopeP& scope, std::string& out);
  // One function per kind of node (see exec in render.cpp).
  void exec_output(const Node& n, const ScopeP& scope, std::string& out);
  Flow exec_if(const Node& n, const ScopeP& scope, std::string& out);
  Flow exec_for(const Node& n, const ScopeP& scope, std::string& out);
  Items for_items(const Node& n, const ScopeP& scope, uint16_t& depth);
  void exec_set(const Node& n, const ScopeP& scope);
  void exec_block(const Node& n, const ScopeP& scope, std::string& out);
  void exec_macro(const Node& n, const ScopeP& scope);
  void exec_call_block(const Node& n, const ScopeP& scope, std::string& out);
  void assign(const Node& n, const ScopeP& scope, const Value& v);
  Value make_macro(const Node& n, const ScopeP& scope);
  Value eval_access(const Expr& e, const ScopeP& scope);
  Value eval_call(const Expr& e, const ScopeP& scope);
  Value eval_filter(const Expr& e, const ScopeP& scope);
  Value eval_unary(const Expr& e, const ScopeP& scope);
  Value eval_logic(const Expr& e, const ScopeP& scope);
  Value eval_binary(const Expr& e, const ScopeP& scope);
  Value eval_compare(const Expr& e, const ScopeP& scope);
  Value eval_literal(const Expr& e, const ScopeP& scope);
  CallArgs eval_args(const Expr& e, const ScopeP& scope);
  Value lookup(const std::string& name, const ScopeP& scope);
  Value binary(const std::string& op, const Value& a, const Value& b, int line);
  // Output text: appended to `out` and charged to the meter; a block's
  // text becomes a string value (charged as that instead).
  void emit(std::string& out, std::string_view text);
  void emit(std::string& out, const Value& v);
  Value text_value(std::string&& out);

  // First: destroyed last, after every value the render made (it empties
  // the namespaces and takes the refunds).
  Meter meter_;
  const Program& program_;
  Dict globals_;
  std::time_t now_;
};

// Jinja2's environment.getattr / getitem (sandboxed): a missing key or index
// gives Undefined; any access on Undefined raises.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// obj.name(args) for the str / dict / list methods; nullptr-equivalent
// (returns false) when obj has no such method.
bool call_method(const Value& obj, const std::string& name, CallArgs& args, Value& result);
// `n` copies of a size-`each` value, refused before anything is allocated
// when they would not fit in the render's memory limit.
size_t repeat_size(size_t each, int64_t n);
// Python's str.strip / lstrip / rstrip (chars: none means whitespace).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
// Python int(v) for the int filter and arithmetic helpers.
[[noreturn]] void type_error(const std::string& what);
// Global functions: range, namespace, dict, raise_exception, strftime_now.
Dict builtin_globals(std::time_t now);

}  // namespace baton::jinja
