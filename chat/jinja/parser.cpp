// Recursive-descent parser of the Jinja subset, following Jinja2's grammar
// and precedence (parser.py): condexpr < or < and < not < compare < + - <
// ~ < * / // % < ** < unary, then postfix (. [] ()) and filters / tests.
#include <algorithm>

#include <fmt/format.h>

#include "chat/jinja/ast.h"

#define NOINLINE [[gnu::noinline]]

namespace baton::jinja {

Expr::~Expr() = default;
Node::~Node() = default;

namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& t) : t_(t) {}

  Program run() {
    Program p;
    std::string end = parse_body(p.body, {});
    if (!end.empty()) failf("unexpected '{}'", end);
    return p;
  }

 private:
  const Token& cur() const { return t_[pos_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(pos_ + n, t_.size() - 1)]; }
  // Out of line: the formatting stays out of the frames of the recursive
  // descent (see parse_body).
  [[noreturn]] NOINLINE void fail(std::string_view what) const {
    throw TemplateError(fmt::format("chat template: {} at line {}", what, cur().line));
  }
  template <class... A>
  [[noreturn]] NOINLINE void failf(fmt::format_string<A...> f, A&&... a) const {
    fail(fmt::format(f, std::forward<A>(a)...));
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++pos_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++pos_;
    return true;
  }
  NOINLINE void expect_op(const char* op) {
    if (!skip_op(op)) failf("expected '{}'", op);
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) fail("expected a name");
    return t_[pos_++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) fail("expected end of statement block");
    ++pos_;
  }
  NOINLINE ExprP make(Expr::K k) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = cur().line;
    return e;
  }

  // Parses nodes until a `{% name %}` with name in `ends` (consumed up to the
  // name; returned) or the end of input (returns ""). Statements nest as deep
  // as kMaxDepth: this, parse_statement and the function for each tag keep
  // their frames small (each is noinline, see render.cpp's exec).
  std::string parse_body(Body& body, std::initializer_list<const char*> ends) {
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tok::End) return "";
      if (tk.type == Tok::Text || tk.type == Tok::VarBegin) {
        parse_text_or_output(body);
      } else if (tk.type == Tok::BlockBegin) {
        ++pos_;
        if (cur().type == Tok::Name)
          for (const char* e : ends)
            if (cur().text == e) return t_[pos_++].text;
        parse_statement(body);
      } else {
        fail("unexpected token");
      }
    }
  }

  NOINLINE void parse_text_or_output(Body& body) {
    const Token& tk = cur();
    auto n = std::make_unique<Node>();
    n->line = tk.line;
    ++pos_;
    if (tk.type == Tok::Text) {
      n->k = Node::Text;
      n->text = tk.text;
    } else {
      n->k = Node::Output;
      n->expr = parse_tuple(true);
      if (cur().type != Tok::VarEnd) fail("expected '}}'");
      ++pos_;
    }
    body.push_back(std::move(n));
  }

  void close(const char* end) {
    skip_name(end);
    expect_block_end();
  }

  // Bounds the parser's recursion: a template from an untrusted file must
  // not overflow the stack.
  struct Nest {
    explicit Nest(Parser& p) : p(p) {
      if (++p.nest_ > kMaxDepth) p.failf("nesting too deep (more than {} levels)", kMaxDepth);
    }
    ~Nest() { --p.nest_; }
    Parser& p;
  };
  // Bounds each expression tree's depth, which loops build without
  // recursing (`a + b + c...`, `x.a.b...`, `x | f | g...`): evaluating the
  // tree and freeing it recurse that deep.
  NOINLINE ExprP seal(ExprP e) {
    int d = 0;
    for (const Expr* c : {e->a.get(), e->b.get(), e->c.get()})
      if (c) d = std::max(d, c->depth);
    for (const ExprP& c : e->args)
      if (c) d = std::max(d, c->depth);
    for (const auto& kv : e->kwargs) d = std::max(d, kv.second->depth);
    e->depth = d + 1;
    if (e->depth > kMaxDepth) failf("nesting too deep (more than {} levels)", kMaxDepth);
    return e;
  }

  NOINLINE void parse_statement(Body& body) {
    Nest guard(*this);
    const int line = cur().line;
    const std::string kw = expect_name();
    if (kw == "generation") return parse_generation(body);
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") parse_if(*n);
    else if (kw == "for") parse_for(*n);
    else if (kw == "set") parse_set(*n);
    else if (kw == "macro") parse_macro(*n);
    else if (kw == "call") parse_call_block(*n);
    else if (kw == "filter") parse_filter_block(*n);
    else if (kw == "break" || kw == "continue") {
      n->k = kw == "break" ? Node::Break : Node::Continue;
      expect_block_end();
    } else {
      pos_--;
      failf("unsupported tag '{}'", kw);
    }
    body.push_back(std::move(n));
  }

  NOINLINE void parse_if(Node& n) {
    n.k = Node::If;
    ++soft_;
    ExprP cond = parse_tuple(true);
    expect_block_end();
    while (true) {
      Body b;
      const std::string end = parse_body(b, {"elif", "else", "endif"});
      if (end.empty()) fail("missing endif");
      n.branches.emplace_back(std::move(cond), std::move(b));
      if (end == "endif") break;
      if (end == "else") {
        expect_block_end();
        Body eb;
        if (parse_body(eb, {"endif"}).empty()) fail("missing endif");
        n.branches.emplace_back(nullptr, std::move(eb));
        break;
      }
      cond = parse_tuple(true);
      expect_block_end();
    }
    --soft_;
    expect_block_end();
  }

  NOINLINE void parse_for(Node& n) {
    n.k = Node::For;
    parse_targets(n.targets, false);
    if (!skip_name("in")) fail("expected 'in'");
    n.expr = parse_tuple(false);
    const int saved = soft_;
    soft_ = 0;
    if (skip_name("if")) n.loop_filter = parse_expr(true);
    if (is_name("recursive")) fail("unsupported recursive loop");
    expect_block_end();
    const std::string end = parse_body(n.body, {"else", "endfor"});
    if (end.empty()) fail("missing endfor");
    if (end == "else") {
      expect_block_end();
      if (parse_body(n.else_body, {"endfor"}).empty()) fail("missing endfor");
    }
    soft_ = saved;
    expect_block_end();
  }

  NOINLINE void parse_set(Node& n) {
    parse_targets(n.targets, true);
    n.attr_target = attr_set_;
    if (skip_op("=")) {
      n.k = Node::Set;
      n.expr = parse_tuple(true);
      expect_block_end();
      return;
    }
    n.k = Node::SetBlock;
    while (skip_op("|")) n.filters.push_back(parse_filter(nullptr));
    expect_block_end();
    scoped_body(n.body, "endset");
    expect_block_end();
  }

  NOINLINE void parse_macro(Node& n) {
    n.k = Node::Macro;
    n.text = expect_name();
    parse_params(n.params);
    expect_block_end();
    scoped_body(n.body, "endmacro");
    if (cur().type == Tok::Name) ++pos_;
    expect_block_end();
  }

  NOINLINE void parse_call_block(Node& n) {
    n.k = Node::CallBlock;
    if (is_op("(")) parse_params(n.params);
    n.expr = parse_expr(true);
    if (n.expr->k != Expr::Call) fail("expected a call in the call block");
    expect_block_end();
    scoped_body(n.body, "endcall");
    expect_block_end();
  }

  NOINLINE void parse_filter_block(Node& n) {
    n.k = Node::FilterBlock;
    do n.filters.push_back(parse_filter(nullptr));
    while (skip_op("|"));
    expect_block_end();
    scoped_body(n.body, "endfilter");
    expect_block_end();
  }

  // Hugging Face's assistant-mask extension: renders its body unchanged.
  NOINLINE void parse_generation(Body& body) {
    expect_block_end();
    if (parse_body(body, {"endgeneration"}).empty()) fail("missing endgeneration");
    expect_block_end();
  }

  // A body up to `end`, where unknown filters and tests fail at load again
  // (outside the enclosing if's condition).
  void scoped_body(Body& body, const char* end) {
    const int saved = soft_;
    soft_ = 0;
    if (parse_body(body, {end}).empty()) failf("missing {}", end);
    soft_ = saved;
  }

  // `a`, `a, b` or (set only) `ns.attr`.
  void parse_targets(std::vector<std::string>& out, bool allow_attr) {
    attr_set_ = false;
    bool paren = skip_op("(");
    out.push_back(expect_name());
    if (allow_attr && skip_op(".")) {
      out.push_back(expect_name());
      attr_set_ = true;
      return;
    }
    while (skip_op(",")) {
      if (cur().type != Tok::Name || is_name("in")) break;
      out.push_back(expect_name());
    }
    if (paren) expect_op(")");
    if (out.size() > 1) out.insert(out.begin(), "");  // marks unpacking (targets[0] empty)
  }

  void parse_params(std::vector<std::pair<std::string, ExprP>>& params) {
    expect_op("(");
    while (!is_op(")")) {
      if (!params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string name = expect_name();
      ExprP def;
      if (skip_op("=")) def = parse_expr(true);
      params.emplace_back(std::move(name), std::move(def));
    }
    expect_op(")");
  }

  // A tuple without parentheses where Jinja allows one (output, set, for).
  ExprP parse_tuple(bool condexpr) {
    ExprP first = parse_expr(condexpr);
    if (!is_op(",")) return first;
    auto t = make(Expr::TupleLit);
    t->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::BlockEnd || cur().type == Tok::VarEnd || is_name("if") || is_op("=")) break;
      t->args.push_back(parse_expr(condexpr));
    }
    return seal(std::move(t));
  }

  ExprP parse_expr(bool condexpr) {
    Nest guard(*this);
    return condexpr ? parse_cond() : parse_or();
  }

  ExprP parse_cond() {
    ExprP e = parse_or();
    while (is_name("if")) {
      auto c = make(Expr::Cond);
      ++pos_;
      ++soft_;
      c->b = parse_or();  // test
      c->a = std::move(e);  // value when true
      if (skip_name("else")) {
        Nest guard(*this);
        c->c = parse_cond();
      }
      --soft_;
      e = seal(std::move(c));
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      auto o = make(Expr::Or);
      ++pos_;
      o->a = std::move(e);
      o->b = parse_and();
      e = seal(std::move(o));
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      auto o = make(Expr::And);
      ++pos_;
      o->a = std::move(e);
      o->b = parse_not();
      e = seal(std::move(o));
    }
    return e;
  }
  ExprP parse_not() {
    Nest guard(*this);
    if (is_name("not")) {
      auto n = make(Expr::Not);
      ++pos_;
      n->a = parse_not();
      return seal(std::move(n));
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::Op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        ++pos_;
      } else if (is_name("in")) {
        op = "in";
        ++pos_;
      } else if (is_name("not") && peek().type == Tok::Name && peek().text == "in") {
        op = "notin";
        pos_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Compare);
        cmp->a = std::move(e);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? seal(std::move(cmp)) : std::move(e);
  }
  ExprP binary(std::string op, ExprP a, ExprP b) {
    auto n = make(Expr::Binary);
    n->name = std::move(op);
    n->a = std::move(a);
    n->b = std::move(b);
    return seal(std::move(n));
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = t_[pos_++].text;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (skip_op("~")) e = binary("~", std::move(e), parse_math2());
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = t_[pos_++].text;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (skip_op("**")) e = binary("**", std::move(e), parse_unary(true));
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    Nest guard(*this);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::Neg : Expr::Pos);
      ++pos_;
      e->a = parse_unary(false);
      e = seal(std::move(e));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  // A name or a literal (the leaves of the tree).
  NOINLINE ExprP parse_atom() {
    const Token& tk = cur();
    auto e = make(Expr::Const);
    if (tk.type == Tok::Name) {
      ++pos_;
      if (tk.text == "true" || tk.text == "True") e->value = Value::boolean(true);
      else if (tk.text == "false" || tk.text == "False") e->value = Value::boolean(false);
      else if (tk.text == "none" || tk.text == "None") e->value = Value::none();
      else {
        e->k = Expr::Name;
        e->name = tk.text;
      }
    } else if (tk.type == Tok::String) {
      std::string s;
      while (cur().type == Tok::String) s += t_[pos_++].text;
      e->value = Value::string(std::move(s));
    } else {
      e->value = tk.type == Tok::Int ? Value::integer(tk.i) : Value::number(tk.f);
      ++pos_;
    }
    return e;
  }

  ExprP parse_primary() {
    const Token& tk = cur();
    if (tk.type == Tok::Name || tk.type == Tok::String || tk.type == Tok::Int || tk.type == Tok::Float)
      return parse_atom();
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::TupleLit);
      ExprP first = parse_expr(true);
      if (skip_op(")")) return first;
      auto t = make(Expr::TupleLit);
      t->args.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op(")")) break;
        t->args.push_back(parse_expr(true));
      }
      expect_op(")");
      return seal(std::move(t));
    }
    if (skip_op("[")) {
      auto l = make(Expr::ListLit);
      while (!skip_op("]")) {
        if (!l->args.empty()) expect_op(",");
        if (skip_op("]")) break;
        l->args.push_back(parse_expr(true));
      }
      return seal(std::move(l));
    }
    if (skip_op("{")) {
      auto d = make(Expr::DictLit);
      while (!skip_op("}")) {
        if (!d->args.empty()) expect_op(",");
        if (skip_op("}")) break;
        d->args.push_back(parse_expr(true));
        expect_op(":");
        d->args.push_back(parse_expr(true));
      }
      return seal(std::move(d));
    }
    fail("unexpected token in expression");
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        ++pos_;
        if (cur().type == Tok::Int) {
          auto it = make(Expr::Item);
          it->a = std::move(e);
          it->b = make(Expr::Const);
          it->b->value = Value::integer(cur().i);
          ++pos_;
          e = seal(std::move(it));
        } else {
          auto at = make(Expr::Attr);
          at->name = expect_name();
          at->a = std::move(e);
          e = seal(std::move(at));
        }
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprP parse_subscript(ExprP subject) {
    ExprP parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (is_op(":")) {
        slice = true;
        ++pos_;
        if (++n > 2) fail("bad slice");
        continue;
      }
      if (is_op("]")) break;
      if (parts[n]) fail("bad subscript");
      parts[n] = parse_expr(true);
      if (is_op(",")) fail("unsupported tuple subscript");
    }
    expect_op("]");
    if (!slice && !parts[0]) fail("empty subscript");  // x[]: a syntax error in Jinja2 too
    auto e = make(slice ? Expr::Slice : Expr::Item);
    e->a = std::move(subject);
    if (slice) {
      for (auto& p : parts) e->args.push_back(std::move(p));
    } else {
      e->b = std::move(parts[0]);
    }
    return seal(std::move(e));
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!skip_op(")")) {
      if (!e.args.empty() || !e.kwargs.empty()) expect_op(",");
      if (skip_op(")")) return;
      if (is_op("*") || is_op("**")) fail("unsupported *args in a call");
      if (cur().type == Tok::Name && peek().type == Tok::Op && peek().text == "=") {
        std::string k = t_[pos_].text;
        pos_ += 2;
        e.kwargs.emplace_back(std::move(k), parse_expr(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.args.push_back(parse_expr(true));
      }
    }
  }

  ExprP parse_call(ExprP callee) {
    auto c = make(Expr::Call);
    c->a = std::move(callee);
    parse_call_args(*c);
    return seal(std::move(c));
  }

  ExprP parse_filter(ExprP subject) {
    auto f = make(Expr::Filter);
    f->name = expect_name();
    while (skip_op(".")) f->name += "." + expect_name();
    f->a = std::move(subject);
    f->soft = soft_ > 0;
    if (!has_filter(f->name) && !f->soft) failf("unsupported filter '{}'", f->name);
    if (is_op("(")) parse_call_args(*f);
    return seal(std::move(f));
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (skip_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        ++pos_;
        auto t = make(Expr::Test);
        t->negated = skip_name("not");
        t->name = expect_name();
        while (skip_op(".")) t->name += "." + expect_name();
        t->a = std::move(e);
        t->soft = soft_ > 0;
        if (!has_test(t->name) && !t->soft) failf("unsupported test '{}'", t->name);
        const Token& nx = cur();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((nx.type == Tok::Name || nx.type == Tok::String || nx.type == Tok::Int ||
                    nx.type == Tok::Float || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("cannot chain tests with 'is'");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = seal(std::move(t));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int soft_ = 0;
  int nest_ = 0;
  bool attr_set_ = false;
};

}  // namespace

Program parse(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace baton::jinja
