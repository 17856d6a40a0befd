// Statements and expressions of the Jinja subset, with Jinja2's scoping: a
// for-loop iteration, a macro call and a block set each get their own scope
// (assignments inside do not leak out); if-blocks share the enclosing one.
#include "chat/jinja/render.h"

#include <cmath>

#include <fmt/format.h>

// Keeps a function's frame out of its caller's (see exec).
#define NOINLINE [[gnu::noinline]]

namespace baton::jinja {

[[noreturn]] void type_error(const std::string& what) { throw RenderError(what); }

size_t repeat_size(size_t each, int64_t n) {
  if (n <= 0 || each == 0) return 0;
  size_t total;
  if (__builtin_mul_overflow(each, size_t(n), &total)) total = SIZE_MAX;
  need_bytes(total);
  return total;
}

Renderer::Renderer(const Program& program, Dict globals, std::time_t now, const RenderLimits& limits)
    : meter_(limits), program_(program), globals_(std::move(globals)), now_(now) {}

std::string Renderer::run() {
  meter_.poll();  // a render asked for past its deadline, or already cancelled
  auto root = std::make_shared<Scope>();
  std::string out;
  exec(program_.body, root, out);
  return out;
}

void Renderer::emit(std::string& out, std::string_view text) {
  meter_.charge(text.size());
  meter_.work(text.size());
  out += text;
}

void Renderer::emit(std::string& out, const Value& v) {
  if (v.is_string()) return emit(out, std::string_view(v.s()));
  const size_t before = out.size();
  append_str(out, v);
  meter_.charge(out.size() - before);
}

Value Renderer::text_value(std::string&& out) {
  meter_.refund(out.size());
  return Value::string(std::move(out));
}

Value Renderer::lookup(const std::string& name, const ScopeP& scope) {
  // Scopes nest as deep as the statements: each one looked in is charged.
  for (const Scope* s = scope.get(); s; s = s->parent.get()) {
    meter_.work(kItemWork);
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  if (const Value* v = globals_.find(name)) return *v;
  return Value::undefined(name);
}

// The statements and expressions recurse into each other as deep as the
// template nests (up to kMaxDepth levels): exec and eval only dispatch, each
// kind of node has its own function (noinline), so that a level's frames
// stay small. Under the sanitizers every local gets its own stack slot, and
// one big switch made each level cost kilobytes.
Renderer::Flow Renderer::exec(const Body& body, const ScopeP& scope, std::string& out) {
  DepthGuard depth(meter_);
  for (const NodeP& np : body) {
    const Node& n = *np;
    meter_.step();
    Flow f = Flow::Normal;
    switch (n.k) {
      case Node::Text: emit(out, n.text); break;
      case Node::Output: exec_output(n, scope, out); break;
      case Node::If: f = exec_if(n, scope, out); break;
      case Node::For: f = exec_for(n, scope, out); break;
      case Node::Set: exec_set(n, scope); break;
      case Node::SetBlock:
      case Node::FilterBlock: exec_block(n, scope, out); break;
      case Node::Macro: exec_macro(n, scope); break;
      case Node::CallBlock: exec_call_block(n, scope, out); break;
      case Node::Break: return Flow::Break;
      case Node::Continue: return Flow::Continue;
    }
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

NOINLINE void Renderer::exec_output(const Node& n, const ScopeP& scope, std::string& out) {
  emit(out, eval(*n.expr, scope));
}

NOINLINE Renderer::Flow Renderer::exec_if(const Node& n, const ScopeP& scope, std::string& out) {
  for (const auto& [cond, b] : n.branches)
    if (!cond || eval(*cond, scope).truthy()) return exec(b, scope, out);
  return Flow::Normal;
}

NOINLINE void Renderer::exec_set(const Node& n, const ScopeP& scope) { assign(n, scope, eval(*n.expr, scope)); }

NOINLINE void Renderer::exec_block(const Node& n, const ScopeP& scope, std::string& out) {
  auto inner = std::make_shared<Scope>();
  inner->parent = scope;
  std::string text;
  exec(n.body, inner, text);
  Value v = text_value(std::move(text));
  for (const ExprP& f : n.filters) {
    CallArgs args = eval_args(*f, scope);
    v = filter(f->name, v, args, f->line);
  }
  if (n.k == Node::SetBlock) assign(n, scope, v);
  else emit(out, v);
}

NOINLINE void Renderer::exec_macro(const Node& n, const ScopeP& scope) { scope->vars[n.text] = make_macro(n, scope); }

NOINLINE void Renderer::exec_call_block(const Node& n, const ScopeP& scope, std::string& out) {
  Value caller = make_macro(n, scope);
  const Expr& call = *n.expr;
  Value fn = eval(*call.a, scope);
  CallArgs args = eval_args(call, scope);
  args.kw.emplace_back("caller", caller);
  if (fn.kind != Kind::Function) fail("line {}: call of a non-macro", n.line);
  emit(out, (*fn.fn)(args));
}

namespace {
void bind_targets(Scope& s, const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    s.vars[targets[0]] = v;
    return;
  }
  const size_t n = targets.size() - 1;  // targets[0] is the unpacking marker
  const Items items = iterate(v);
  if (items.size() != n)
    fail("line {}: cannot unpack {} values into {}", line, items.size(), n);
  for (size_t k = 0; k < n; ++k) s.vars[targets[k + 1]] = items[k];
}
}  // namespace

// What a for loop visits, after its `if` filter; `depth`: the items' depth + 1.
NOINLINE Items Renderer::for_items(const Node& n, const ScopeP& scope, uint16_t& depth) {
  const Value seq = eval(*n.expr, scope);
  if (seq.kind != Kind::List && seq.kind != Kind::Dict && seq.kind != Kind::String && !seq.is_undefined())
    fail("line {}: '{}' object is not iterable", n.line, kind_name(seq));
  depth = seq.is_list() ? seq.depth : 1;
  Items items = iterate(seq);
  if (!n.loop_filter) return items;
  List kept;
  for (const Value& it : items) {
    meter_.step();
    auto fs = std::make_shared<Scope>();
    fs->parent = scope;
    bind_targets(*fs, n.targets, it, n.line);
    if (eval(*n.loop_filter, fs).truthy()) kept.push_back(it);
  }
  return Items(Value::make_list(std::move(kept)).list);
}

namespace {

// One `loop` object per for loop, updated in place each iteration (cheaper
// than a new one; previtem / nextitem are undefined where there is none).
enum LoopSlot { Index, Index0, Revindex, Revindex0, First, Last, Previtem, Nextitem, Length, Depth, Depth0, Cycle };

NOINLINE Value make_loop(int64_t len, uint16_t depth, const std::shared_ptr<int64_t>& counter) {
  Dict d;
  for (const char* name : {"index", "index0", "revindex", "revindex0", "first", "last", "previtem", "nextitem"})
    d.items.emplace_back(name, Value());
  d.items.emplace_back("length", Value::integer(len));
  d.items.emplace_back("depth", Value::integer(1));
  d.items.emplace_back("depth0", Value::integer(0));
  d.items.emplace_back("cycle", Value::function([counter](CallArgs& a) -> Value {
    if (a.pos.empty()) throw RenderError("no items for cycling given");
    return a.pos[size_t(*counter) % a.pos.size()];
  }));
  Value loop = Value::make_dict(std::move(d));
  // previtem / nextitem hold the items: one level above the deepest.
  loop.depth = std::max(loop.depth, depth);
  return loop;
}

NOINLINE void set_loop(Dict& loop, const Items& items, int64_t k) {
  const int64_t len = int64_t(items.size());
  auto& slot = loop.items;
  slot[Index].second = Value::integer(k + 1);
  slot[Index0].second = Value::integer(k);
  slot[Revindex].second = Value::integer(len - k);
  slot[Revindex0].second = Value::integer(len - k - 1);
  slot[First].second = Value::boolean(k == 0);
  slot[Last].second = Value::boolean(k == len - 1);
  slot[Previtem].second = k > 0 ? items[size_t(k - 1)] : Value::undefined("previtem");
  slot[Nextitem].second = k + 1 < len ? items[size_t(k + 1)] : Value::undefined("nextitem");
}

NOINLINE ScopeP iteration_scope(const Node& n, const ScopeP& scope, const Value& item, const Value& loop) {
  auto s = std::make_shared<Scope>();
  s->parent = scope;
  bind_targets(*s, n.targets, item, n.line);
  s->vars["loop"] = loop;
  return s;
}

}  // namespace

NOINLINE Renderer::Flow Renderer::exec_for(const Node& n, const ScopeP& scope, std::string& out) {
  uint16_t depth = 1;
  const Items items = for_items(n, scope, depth);
  if (items.empty()) return exec(n.else_body, scope, out);
  auto counter = std::make_shared<int64_t>(0);
  const Value loop = make_loop(int64_t(items.size()), depth, counter);
  for (size_t k = 0; k < items.size(); ++k) {
    meter_.step();
    *counter = int64_t(k);
    set_loop(*loop.dict, items, int64_t(k));
    if (exec(n.body, iteration_scope(n, scope, items[k], loop), out) == Flow::Break) break;
  }
  return Flow::Normal;
}

void Renderer::assign(const Node& n, const ScopeP& scope, const Value& v) {
  if (n.attr_target) {
    Value ns = lookup(n.targets[0], scope);
    if (ns.kind != Kind::Namespace) fail("line {}: cannot assign attribute on non-namespace object", n.line);
    ns.dict->set(n.targets[1], v);
    return;
  }
  bind_targets(*scope, n.targets, v, n.line);
}

Value Renderer::make_macro(const Node& n, const ScopeP& scope) {
  const Node* node = &n;
  std::weak_ptr<Scope> weak = scope;
  return Value::function([this, node, weak](CallArgs& args) -> Value {
    ScopeP parent = weak.lock();
    if (!parent) throw RenderError("macro called after its scope ended");
    DepthGuard depth(meter_);
    auto s = std::make_shared<Scope>();
    s->parent = parent;
    const auto& params = node->params;
    meter_.work(kStepWork + kItemWork * params.size() * (args.kw.size() + 1));
    if (args.pos.size() > params.size())
      fail("macro '{}' takes not more than {} argument(s)", node->text, params.size());
    for (size_t k = 0; k < params.size(); ++k) {
      const std::string& name = params[k].first;
      if (k < args.pos.size()) {
        s->vars[name] = args.pos[k];
        continue;
      }
      bool found = false;
      for (auto& [kn, kv] : args.kw)
        if (kn == name) {
          s->vars[name] = kv;
          found = true;
        }
      if (!found) s->vars[name] = params[k].second ? eval(*params[k].second, s) : Value::undefined(name);
    }
    for (auto& [kn, kv] : args.kw) {
      bool known = kn == "caller";
      for (const auto& p : params) known = known || p.first == kn;
      if (!known) fail("macro '{}' takes no keyword argument '{}'", node->text, kn);
      if (kn == "caller") s->vars["caller"] = kv;
    }
    std::string out;
    exec(node->body, s, out);
    return text_value(std::move(out));
  });
}

CallArgs Renderer::eval_args(const Expr& e, const ScopeP& scope) {
  CallArgs a;
  for (const ExprP& x : e.args) a.pos.push_back(eval(*x, scope));
  for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x, scope));
  return a;
}

NOINLINE Value Renderer::eval_call(const Expr& e, const ScopeP& scope) {
  if (e.a->k == Expr::Attr) {
    Value obj = eval(*e.a->a, scope);
    if (obj.is_undefined()) fail("line {}: '{}' is undefined", e.line, obj.s());
    CallArgs args = eval_args(e, scope);
    Value result;
    if (call_method(obj, e.a->name, args, result)) return result;
    Value fn = get_attr(obj, e.a->name);
    if (fn.kind != Kind::Function)
      fail("line {}: '{}' is not callable", e.line, e.a->name);
    return (*fn.fn)(args);
  }
  Value fn = eval(*e.a, scope);
  if (fn.kind != Kind::Function) fail("line {}: '{}' object is not callable", e.line, kind_name(fn));
  CallArgs args = eval_args(e, scope);
  return (*fn.fn)(args);
}

Value Renderer::eval(const Expr& e, const ScopeP& scope) {
  DepthGuard depth(meter_);
  meter_.work(kNodeWork);
  switch (e.k) {
    case Expr::Const: return e.value;
    case Expr::Name: return lookup(e.name, scope);
    case Expr::Attr:
    case Expr::Item:
    case Expr::Slice: return eval_access(e, scope);
    case Expr::Call: return eval_call(e, scope);
    case Expr::Filter:
    case Expr::Test: return eval_filter(e, scope);
    case Expr::Neg:
    case Expr::Pos:
    case Expr::Not: return eval_unary(e, scope);
    case Expr::And:
    case Expr::Or:
    case Expr::Cond: return eval_logic(e, scope);
    case Expr::Binary: return eval_binary(e, scope);
    case Expr::Compare: return eval_compare(e, scope);
    case Expr::ListLit:
    case Expr::TupleLit:
    case Expr::DictLit: return eval_literal(e, scope);
  }
  return Value::undefined();
}

NOINLINE Value Renderer::eval_access(const Expr& e, const ScopeP& scope) {
  if (e.k == Expr::Attr) return get_attr(eval(*e.a, scope), e.name);
  if (e.k == Expr::Item) return get_item(eval(*e.a, scope), eval(*e.b, scope));
  Value obj = eval(*e.a, scope);
  CallArgs a;
  for (const ExprP& p : e.args) a.pos.push_back(p ? eval(*p, scope) : Value::none());
  Value r;
  if (!call_method(obj, "__slice__", a, r)) fail("line {}: cannot slice {}", e.line, kind_name(obj));
  return r;
}

NOINLINE Value Renderer::eval_filter(const Expr& e, const ScopeP& scope) {
  Value v = eval(*e.a, scope);
  CallArgs args = eval_args(e, scope);
  if (e.k == Expr::Filter) return filter(e.name, v, args, e.line);
  return Value::boolean(test(e.name, v, args, e.line) != e.negated);
}

NOINLINE Value Renderer::eval_unary(const Expr& e, const ScopeP& scope) {
  Value v = eval(*e.a, scope);
  if (e.k == Expr::Not) return Value::boolean(!v.truthy());
  if (!v.is_number()) fail("line {}: bad operand type for unary -: '{}'", e.line, kind_name(v));
  if (e.k == Expr::Pos) return v;
  if (v.kind == Kind::Float) return Value::number(-v.f);
  const int64_t i = v.kind == Kind::Bool ? int64_t(v.b) : v.i;
  if (i == INT64_MIN) throw RenderError("integer overflow");
  return Value::integer(-i);
}

NOINLINE Value Renderer::eval_logic(const Expr& e, const ScopeP& scope) {
  if (e.k == Expr::Cond) {
    if (eval(*e.b, scope).truthy()) return eval(*e.a, scope);
    return e.c ? eval(*e.c, scope) : Value::undefined();
  }
  Value a = eval(*e.a, scope);
  if (a.truthy() == (e.k == Expr::And)) return eval(*e.b, scope);
  return a;
}

NOINLINE Value Renderer::eval_binary(const Expr& e, const ScopeP& scope) {
  Value a = eval(*e.a, scope);
  Value b = eval(*e.b, scope);
  return binary(e.name, a, b, e.line);
}

NOINLINE Value Renderer::eval_compare(const Expr& e, const ScopeP& scope) {
  Value left = eval(*e.a, scope);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.args[k], scope);
    const std::string& op = e.ops[k];
    bool r;
    if (op == "==") r = equals(left, right);
    else if (op == "!=") r = !equals(left, right);
    else if (op == "in") r = contains(right, left);
    else if (op == "notin") r = !contains(right, left);
    else {
      if (left.is_undefined() || right.is_undefined()) fail("line {}: comparison with an undefined value", e.line);
      if (op == "<") r = less(left, right);
      else if (op == ">") r = less(right, left);
      else if (op == "<=") r = !less(right, left);
      else r = !less(left, right);
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

NOINLINE Value Renderer::eval_literal(const Expr& e, const ScopeP& scope) {
  if (e.k != Expr::DictLit) {
    List l;
    for (const ExprP& x : e.args) l.push_back(eval(*x, scope));
    return Value::make_list(std::move(l), e.k == Expr::TupleLit);
  }
  Dict d;
  for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
    std::string key;
    if (!dict_key(eval(*e.args[k], scope), key))
      fail("line {}: only string and integer keys are supported in dict literals", e.line);
    d.set(key, eval(*e.args[k + 1], scope));
  }
  return Value::make_dict(std::move(d));
}

namespace {
double num(const Value& v) { return v.kind == Kind::Float ? v.f : v.kind == Kind::Bool ? double(v.b) : double(v.i); }
int64_t inum(const Value& v) { return v.kind == Kind::Bool ? int64_t(v.b) : v.i; }
[[noreturn]] void overflow() { throw RenderError("integer overflow (Baton's integers are 64-bit)"); }
int64_t add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
int64_t sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}
int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
Value repeat(const Value& seq, int64_t n) {
  if (seq.is_string()) {
    const std::string& unit = seq.s();
    const size_t total = repeat_size(unit.size(), n);
    std::string out;
    out.reserve(total);
    if (total > 0) out = unit;
    while (out.size() < total) out.append(out, 0, std::min(out.size(), total - out.size()));  // doubling
    return Value::string(std::move(out));
  }
  List out;
  out.reserve(repeat_size(seq.list->size() * kItemBytes, n) / kItemBytes);
  for (int64_t k = 0; k < n && !seq.list->empty(); ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out), seq.tuple);
}
}  // namespace

Value Renderer::binary(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    std::string out;
    if (a.is_string() && b.is_string()) {
      need_bytes(a.s().size() + b.s().size());
      out.reserve(a.s().size() + b.s().size());
    }
    append_str(out, a);
    need_bytes(out.size());
    append_str(out, b);
    need_bytes(out.size());
    return Value::string(std::move(out));
  }
  auto unsupported = [&]() -> Value {
    fail("line {}: unsupported operand type(s) for {}: '{}' and '{}'", line, op,
                                  kind_name(a), kind_name(b));
  };
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && a.kind != Kind::Float && b.kind != Kind::Float;
  if (op == "+") {
    if (ints) return Value::integer(add(inum(a), inum(b)));
    if (nums) return Value::number(num(a) + num(b));
    if (a.is_string() && b.is_string()) {
      std::string escaped;
      std::string_view x = a.s(), y = b.s();
      if (a.markup != b.markup) {
        escaped = html_escape(a.markup ? y : x);
        (a.markup ? y : x) = escaped;
      }
      need_bytes(x.size() + y.size());
      std::string out;
      out.reserve(x.size() + y.size());
      out += x;
      out += y;
      Value r = Value::string(std::move(out));
      r.markup = a.markup || b.markup;
      return r;
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple && !a.generator && !b.generator) {
      need_bytes((a.list->size() + b.list->size()) * kItemBytes);
      List l;
      l.reserve(a.list->size() + b.list->size());
      l.insert(l.end(), a.list->begin(), a.list->end());
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l), a.tuple);
    }
    return unsupported();
  }
  if (op == "*") {
    if (ints) return Value::integer(mul(inum(a), inum(b)));
    if (nums) return Value::number(num(a) * num(b));
    if ((a.is_string() || a.is_list()) && b.kind == Kind::Int) return repeat(a, b.i);
    if ((b.is_string() || b.is_list()) && a.kind == Kind::Int) return repeat(b, a.i);
    return unsupported();
  }
  if (!nums) return unsupported();
  if (op == "-")
    return ints ? Value::integer(sub(inum(a), inum(b))) : Value::number(num(a) - num(b));
  if (op == "/") {
    if (num(b) == 0) fail("line {}: division by zero", line);
    return Value::number(num(a) / num(b));
  }
  if (op == "//" || op == "%") {
    if (num(b) == 0) fail("line {}: integer division or modulo by zero", line);
    if (ints) {
      const int64_t q = floor_div(inum(a), inum(b));
      return Value::integer(op == "//" ? q : sub(inum(a), mul(q, inum(b))));
    }
    const double q = std::floor(num(a) / num(b));
    return Value::number(op == "//" ? q : num(a) - q * num(b));
  }
  if (op == "**") {
    if (ints && inum(b) >= 0) {
      int64_t base = inum(a), result = 1;
      for (int64_t e = inum(b); e > 0; e >>= 1) {
        if (e & 1) result = mul(result, base);
        if (e > 1) base = mul(base, base);
      }
      return Value::integer(result);
    }
    return Value::number(std::pow(num(a), num(b)));
  }
  return unsupported();
}

}  // namespace baton::jinja
