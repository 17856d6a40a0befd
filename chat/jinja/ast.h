// Tokens and syntax tree of a Jinja template (the lexer and parser build
// them; render.cpp walks them).
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/jinja/value.h"

namespace baton::jinja {

// A template the engine cannot load: bad syntax or a construct outside the
// supported subset. The message names the construct and its line.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Tok { Text, BlockBegin, BlockEnd, VarBegin, VarEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;  // Text: the literal; String: the unescaped value; Name/Op: the spelling
  int line = 1;
  int64_t i = 0;
  double f = 0;
};

// Splits the source with Hugging Face's settings: trim_blocks, lstrip_blocks,
// no trailing newline kept; comments are dropped, whitespace control applied.
std::vector<Token> lex(const std::string& source);

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum K {
    Const, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, Binary, Compare, And, Or,
    Cond, ListLit, TupleLit, DictLit
  };
  K k;
  int line = 0;
  Value value;                // Const
  std::string name;           // Name, Attr, Filter, Test; Binary's operator
  ExprP a, b, c;              // operands: Attr/Item/Call/Filter/Test subject in a; Item key in b
  std::vector<ExprP> args;    // Call/Filter/Test positional; list/tuple items; dict keys & values interleaved
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;  // Compare: one per extra operand (in args)
  bool negated = false;       // Test: `is not`
  bool soft = false;          // Filter/Test inside a conditional: unknown names fail at run time only
  int depth = 1;              // of the tree below, this node included (at most kMaxDepth)
  ~Expr();  // out of line: keeps the parser's recursive frames small
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum K { Text, Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, Break, Continue };
  K k;
  int line = 0;
  std::string text;                  // Text; Macro name
  ExprP expr;                        // Output, Set value, For iterable, CallBlock call
  std::vector<std::string> targets;  // For / Set names; Set on a namespace: {ns, attr} with attr_target
  bool attr_target = false;
  ExprP loop_filter;                 // For ... if cond
  std::vector<std::pair<ExprP, Body>> branches;  // If: (cond, body), else has a null cond
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // Macro / CallBlock caller parameters, defaults may be null
  std::vector<ExprP> filters;        // SetBlock / FilterBlock: Filter exprs with a null subject
  ~Node();
};

struct Program {
  Body body;
};

// Parses the tokens; throws TemplateError naming unsupported constructs, and
// for nesting deeper than kMaxDepth (limits.h).
Program parse(const std::vector<Token>& tokens);

// Whether the engine implements the filter / test (the parser refuses others).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);

}  // namespace baton::jinja
