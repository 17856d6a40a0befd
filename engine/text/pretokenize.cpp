// Pre-tokenizers: the split regexes of HF tokenizers, run by a small regex engine of our own
// (the patterns need Unicode classes, and its backtracking depth is bounded by the pattern).
// The file is long because the engine (parser, compiler to continuation nodes, bounded
// backtracking matcher) and the table of per-model patterns it must accept belong together:
// the table is what the engine's features are for, and a pattern change is checked against
// both at once.
#include "engine/text/pretokenize.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "engine/text/unicode.h"

namespace baton {

// ---------------------------------------------------------------------------
// Regex: parse to a small tree, then compile to nodes linked by `next` (the
// continuation), so that backtracking is a recursive walk whose depth is
// bounded by the pattern, not by the text: a quantified single-character atom
// scans its run in a loop and only recurses once per length it tries.

struct SplitRegex::Ast {
  enum class Kind { Set, Seq, Alt, Look, Bol, Eol } kind = Kind::Seq;
  int cls = -1;                // Set
  uint32_t min = 1, max = 1;   // Set
  bool optional = false;       // Seq/Alt followed by '?'
  bool negative = false;       // Look
  std::vector<Ast> kids;       // Seq items, Alt branches, Look body
};

namespace {

constexpr uint32_t kUnbounded = UINT32_MAX;

[[noreturn]] void fail(const std::string& pattern, size_t at, const std::string& what) {
  throw std::invalid_argument("split regex: " + what + " at code point " + std::to_string(at) +
                              " of pattern '" + pattern + "'");
}

bool is_ascii_alnum(char32_t c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

}  // namespace

class SplitRegex::Parser {
 public:
  Parser(SplitRegex& re, const std::string& pattern) : re_(re), pattern_(pattern) {
    const DecodedText d = utf8_decode_all(pattern);
    p_ = d.cps;
  }

  Ast parse() {
    Ast a = parse_alt();
    if (i_ != p_.size()) fail(pattern_, i_, "unbalanced ')'");
    return a;
  }

 private:
  // One escape's meaning: a single character, or a class fragment.
  struct Escape {
    bool is_char = true;
    char32_t ch = 0;
    CharClass frag;  // when !is_char: ranges/cats/space flags to merge
  };

  bool more() const { return i_ < p_.size(); }
  char32_t peek(size_t k = 0) const { return i_ + k < p_.size() ? p_[i_ + k] : 0; }
  bool eat(char32_t c) {
    if (more() && p_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  Ast parse_alt() {
    Ast first = parse_seq();
    if (!more() || peek() != '|') return first;
    Ast alt;
    alt.kind = Ast::Kind::Alt;
    alt.kids.push_back(std::move(first));
    while (eat('|')) alt.kids.push_back(parse_seq());
    return alt;
  }

  Ast parse_seq() {
    Ast seq;
    seq.kind = Ast::Kind::Seq;
    while (more() && peek() != '|' && peek() != ')') {
      Ast atom = parse_atom();
      parse_quantifier(atom);
      seq.kids.push_back(std::move(atom));
    }
    return seq;
  }

  void parse_quantifier(Ast& atom) {
    if (!more()) return;
    const size_t at = i_;
    uint32_t min = 1, max = 1;
    const char32_t c = peek();
    if (c == '?') {
      ++i_, min = 0, max = 1;
    } else if (c == '*') {
      ++i_, min = 0, max = kUnbounded;
    } else if (c == '+') {
      ++i_, min = 1, max = kUnbounded;
    } else if (c == '{' && peek(1) >= '0' && peek(1) <= '9') {
      ++i_;
      min = parse_number();
      max = min;
      if (eat(',')) max = (peek() == '}') ? kUnbounded : parse_number();
      if (!eat('}')) fail(pattern_, i_, "expected '}' in a counted repetition");
      if (max < min) fail(pattern_, at, "repetition {n,m} with m < n");
    } else {
      return;
    }
    if (more() && (peek() == '?' || peek() == '+')) {
      fail(pattern_, i_, "lazy and possessive quantifiers are not supported");
    }
    // A group holding one plain character atom repeats like that atom.
    if (atom.kind == Ast::Kind::Seq && atom.kids.size() == 1 && atom.kids[0].kind == Ast::Kind::Set &&
        atom.kids[0].min == 1 && atom.kids[0].max == 1 && !atom.optional) {
      Ast inner = std::move(atom.kids[0]);
      atom = std::move(inner);
    }
    switch (atom.kind) {
      case Ast::Kind::Set:
        if (atom.min != 1 || atom.max != 1) fail(pattern_, at, "nested quantifier");
        atom.min = min, atom.max = max;
        return;
      case Ast::Kind::Seq:
      case Ast::Kind::Alt:
        if (min == 0 && max == 1 && !atom.optional) {
          atom.optional = true;
          return;
        }
        fail(pattern_, at, "only '?' may follow a group");
      default:
        fail(pattern_, at, "quantifier after an assertion");
    }
  }

  uint32_t parse_number() {
    uint64_t v = 0;
    const size_t at = i_;
    while (more() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > 100000) fail(pattern_, at, "repetition count too large");
      ++i_;
    }
    if (i_ == at) fail(pattern_, at, "expected a number");
    return static_cast<uint32_t>(v);
  }

  Ast set_of(CharClass cls) {
    if (icase_) add_case_variants(cls);
    normalize(cls);
    Ast a;
    a.kind = Ast::Kind::Set;
    a.cls = static_cast<int>(re_.classes_.size());
    re_.classes_.push_back(std::move(cls));
    return a;
  }

  Ast parse_atom() {
    const size_t at = i_;
    const char32_t c = p_[i_++];
    switch (c) {
      case '(':
        return parse_group(at);
      case '[':
        return set_of(parse_class());
      case '.': {
        CharClass cls;
        cls.ranges = {{'\n', '\n'}};
        cls.negated = true;
        return set_of(std::move(cls));
      }
      case '^': {
        Ast a;
        a.kind = Ast::Kind::Bol;
        return a;
      }
      case '$': {
        Ast a;
        a.kind = Ast::Kind::Eol;
        return a;
      }
      case '\\': {
        Escape e = parse_escape();
        if (e.is_char) return set_of(single(e.ch));
        return set_of(std::move(e.frag));
      }
      case '*':
      case '+':
      case '?':
        fail(pattern_, at, "nothing to repeat");
      case ')':
        fail(pattern_, at, "unbalanced ')'");
      default:
        return set_of(single(c));
    }
  }

  Ast parse_group(size_t at) {
    const bool saved_icase = icase_;
    Ast look;
    bool is_look = false;
    if (eat('?')) {
      if (eat(':')) {
      } else if (eat('!')) {
        is_look = true, look.negative = true;
      } else if (eat('=')) {
        is_look = true;
      } else if (peek() == 'i' && peek(1) == ':') {
        i_ += 2;
        icase_ = true;
      } else {
        fail(pattern_, at, "unsupported group kind (only (?:, (?=, (?! and (?i: are)");
      }
    }
    Ast body = parse_alt();
    icase_ = saved_icase;
    if (!eat(')')) fail(pattern_, at, "missing ')'");
    if (!is_look) return body;
    look.kind = Ast::Kind::Look;
    look.kids.push_back(std::move(body));
    return look;
  }

  CharClass parse_class() {
    const size_t at = i_ - 1;
    CharClass cls;
    if (eat('^')) cls.negated = true;
    bool first = true;
    for (;;) {
      if (!more()) fail(pattern_, at, "missing ']'");
      char32_t c = p_[i_];
      if (c == ']' && !first) {
        ++i_;
        break;
      }
      first = false;
      ++i_;
      char32_t lo = c;
      if (c == '\\') {
        Escape e = parse_escape();
        if (!e.is_char) {
          merge(cls, e.frag);
          continue;
        }
        lo = e.ch;
      } else if (c == '[' && peek() == ':') {
        fail(pattern_, i_ - 1, "POSIX classes are not supported");
      }
      char32_t hi = lo;
      // A '-' between two characters makes a range; first or last it is literal.
      if (peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        const char32_t h = p_[i_++];
        if (h == '\\') {
          Escape e = parse_escape();
          if (!e.is_char) fail(pattern_, i_, "a class escape cannot end a range");
          hi = e.ch;
        } else {
          hi = h;
        }
        if (hi < lo) fail(pattern_, i_, "range out of order");
      }
      cls.ranges.emplace_back(lo, hi);
    }
    return cls;
  }

  uint32_t parse_hex(size_t digits_min, size_t digits_max) {
    uint32_t v = 0;
    size_t n = 0;
    while (n < digits_max && more()) {
      const char32_t c = peek();
      uint32_t d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else break;
      v = v * 16 + d;
      ++n, ++i_;
    }
    if (n < digits_min || v > 0x10FFFF) fail(pattern_, i_, "bad hex escape");
    return v;
  }

  // After a backslash.
  Escape parse_escape() {
    if (!more()) fail(pattern_, i_, "trailing backslash");
    const size_t at = i_;
    const char32_t c = p_[i_++];
    Escape e;
    auto frag = [&](auto&& fill) {
      e.is_char = false;
      fill(e.frag);
      return e;
    };
    const uint32_t word = category_mask("L") | category_mask("M") | category_mask("Nd") | category_mask("Pc");
    switch (c) {
      case 'n': e.ch = '\n'; return e;
      case 'r': e.ch = '\r'; return e;
      case 't': e.ch = '\t'; return e;
      case 'f': e.ch = '\f'; return e;
      case 'v': e.ch = '\v'; return e;
      case '0': e.ch = 0; return e;
      case 'x':
        if (eat('{')) {
          e.ch = parse_hex(1, 6);
          if (!eat('}')) fail(pattern_, at, "missing '}' in \\x{...}");
        } else {
          e.ch = parse_hex(2, 2);
        }
        return e;
      case 'u': e.ch = parse_hex(4, 4); return e;
      case 'U': e.ch = parse_hex(8, 8); return e;
      case 's': return frag([](CharClass& f) { f.space = true; });
      case 'S': return frag([](CharClass& f) { f.not_space = true; });
      case 'd': return frag([](CharClass& f) { f.cats = category_mask("Nd"); });
      case 'D': return frag([](CharClass& f) { f.not_cats = category_mask("Nd"); });
      case 'w': return frag([&](CharClass& f) { f.cats = word; });
      case 'W': return frag([&](CharClass& f) { f.not_cats = word; });
      case 'p':
      case 'P': {
        std::string name;
        if (eat('{')) {
          while (more() && peek() != '}') name.push_back(static_cast<char>(p_[i_++]));
          if (!eat('}')) fail(pattern_, at, "missing '}' in \\p{...}");
        } else if (more()) {
          name.push_back(static_cast<char>(p_[i_++]));
        }
        const uint32_t mask = category_mask(name);
        if (mask == 0) fail(pattern_, at, "unsupported Unicode property '" + name + "'");
        return frag([&](CharClass& f) { (c == 'p' ? f.cats : f.not_cats) = mask; });
      }
      default:
        if (is_ascii_alnum(c)) fail(pattern_, at, std::string("unsupported escape \\") + char(c));
        e.ch = c;  // an escaped punctuation character stands for itself
        return e;
    }
  }

  static CharClass single(char32_t c) {
    CharClass cls;
    cls.ranges = {{c, c}};
    return cls;
  }

  static void merge(CharClass& into, const CharClass& f) {
    into.ranges.insert(into.ranges.end(), f.ranges.begin(), f.ranges.end());
    into.cats |= f.cats;
    if (f.not_cats) {
      if (into.not_cats) fail("", 0, "two negated properties in one class");
      into.not_cats = f.not_cats;
    }
    into.space |= f.space;
    into.not_space |= f.not_space;
  }

  static void add_case_variants(CharClass& cls) {
    const size_t n = cls.ranges.size();
    for (size_t k = 0; k < n; ++k) {
      const auto [lo, hi] = cls.ranges[k];
      const char32_t ulo = std::max<char32_t>(lo, 'A'), uhi = std::min<char32_t>(hi, 'Z');
      if (ulo <= uhi) cls.ranges.emplace_back(ulo + 32, uhi + 32);
      const char32_t llo = std::max<char32_t>(lo, 'a'), lhi = std::min<char32_t>(hi, 'z');
      if (llo <= lhi) cls.ranges.emplace_back(llo - 32, lhi - 32);
    }
  }

  static void normalize(CharClass& cls) {
    auto& r = cls.ranges;
    std::sort(r.begin(), r.end());
    std::vector<std::pair<char32_t, char32_t>> merged;
    for (const auto& x : r) {
      if (!merged.empty() && x.first <= merged.back().second + 1) {
        merged.back().second = std::max(merged.back().second, x.second);
      } else {
        merged.push_back(x);
      }
    }
    r = std::move(merged);
  }

  SplitRegex& re_;
  const std::string& pattern_;
  std::vector<char32_t> p_;
  size_t i_ = 0;
  bool icase_ = false;
};

bool SplitRegex::CharClass::test(char32_t c) const {
  bool in = false;
  if (!ranges.empty()) {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                               [](char32_t v, const std::pair<char32_t, char32_t>& r) { return v < r.first; });
    in = it != ranges.begin() && c <= (it - 1)->second;
  }
  if (!in && (cats | not_cats)) {
    const uint32_t bit = category_bit(unicode_category(c));
    in = (cats & bit) || (not_cats && !(not_cats & bit));
  }
  if (!in && (space || not_space)) {
    const bool ws = unicode_is_whitespace(c);
    in = (space && ws) || (not_space && !ws);
  }
  return in != negated;
}

int SplitRegex::add(Node n) {
  nodes_.push_back(std::move(n));
  return static_cast<int>(nodes_.size()) - 1;
}

int SplitRegex::compile(const Ast& a, int next) {
  switch (a.kind) {
    case Ast::Kind::Set: {
      Node n;
      n.kind = Kind::Set;
      n.cls = a.cls;
      n.min = a.min;
      n.max = a.max;
      n.next = next;
      return add(std::move(n));
    }
    case Ast::Kind::Seq: {
      int entry = next;
      for (auto it = a.kids.rbegin(); it != a.kids.rend(); ++it) entry = compile(*it, entry);
      if (!a.optional) return entry;
      Node n;
      n.kind = Kind::Alt;
      n.branches = {entry, next};
      return add(std::move(n));
    }
    case Ast::Kind::Alt: {
      Node n;
      n.kind = Kind::Alt;
      for (const Ast& k : a.kids) n.branches.push_back(compile(k, next));
      if (a.optional) n.branches.push_back(next);
      return add(std::move(n));
    }
    case Ast::Kind::Look: {
      Node n;
      n.kind = Kind::Look;
      n.negative = a.negative;
      n.sub = compile(a.kids.at(0), 1);  // node 1 accepts a lookahead
      n.next = next;
      return add(std::move(n));
    }
    case Ast::Kind::Bol:
    case Ast::Kind::Eol: {
      Node n;
      n.kind = a.kind == Ast::Kind::Bol ? Kind::Bol : Kind::Eol;
      n.next = next;
      return add(std::move(n));
    }
  }
  return next;
}

SplitRegex::SplitRegex(std::string_view pattern) : pattern_(pattern) {
  Parser parser(*this, pattern_);
  const Ast root = parser.parse();
  Node accept;
  accept.kind = Kind::Accept;
  add(accept);  // node 0: the whole pattern matched
  Node accept_look;
  accept_look.kind = Kind::AcceptLook;
  add(accept_look);  // node 1: a lookahead body matched
  start_ = compile(root, 0);
}

struct SplitRegex::Ctx {
  const char32_t* s;
  size_t n;
  size_t end = 0;
};

bool SplitRegex::run(int node, size_t pos, Ctx& c) const {
  for (;;) {
    const Node& nd = nodes_[node];
    switch (nd.kind) {
      case Kind::Set: {
        const CharClass& cls = classes_[nd.cls];
        const size_t limit = std::min<size_t>(nd.max, c.n - pos);
        size_t k = 0;
        while (k < limit && cls.test(c.s[pos + k])) ++k;
        if (k < nd.min) return false;
        if (k == nd.min) {  // no choice to remember: continue in the loop
          pos += k;
          node = nd.next;
          continue;
        }
        for (size_t j = k + 1; j-- > nd.min;) {
          if (run(nd.next, pos + j, c)) return true;
        }
        return false;
      }
      case Kind::Alt:
        for (size_t b = 0; b + 1 < nd.branches.size(); ++b) {
          if (run(nd.branches[b], pos, c)) return true;
        }
        node = nd.branches.back();
        continue;
      case Kind::Look: {
        Ctx sub{c.s, c.n};
        const bool matched = run(nd.sub, pos, sub);
        if (matched == nd.negative) return false;
        node = nd.next;
        continue;
      }
      case Kind::Bol:
        if (pos != 0) return false;
        node = nd.next;
        continue;
      case Kind::Eol:
        if (pos != c.n) return false;
        node = nd.next;
        continue;
      case Kind::Accept:
        c.end = pos;
        return true;
      case Kind::AcceptLook:
        return true;
    }
  }
}

size_t SplitRegex::match_at(std::span<const char32_t> text, size_t pos) const {
  if (pos > text.size()) return kNoMatch;
  Ctx c{text.data(), text.size()};
  return run(start_, pos, c) ? c.end : kNoMatch;
}

// ---------------------------------------------------------------------------
// Pre-tokenizer table. The regexes are those HF tokenizers' tokenizer.json
// files use, in the form llama.cpp applies them (case-insensitive contractions
// spelt as classes; CJK blocks as explicit ranges).

namespace {

// Shared GPT-2 word pattern: contractions, letters, digits, other symbols,
// each optionally after one space; whitespace runs leave their last space to
// the next word.
constexpr const char* kGpt2 = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";

constexpr const char* kLlama3 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

constexpr const char* kQwen2 =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// Cased letters (DeepSeek LLM's tokenizer.json spells \p{LC}-like ranges out).
constexpr const char* kDeepseekLlmLetters =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})re"
    R"re(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})re"
    R"re(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5})re"
    R"re(\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A})re"
    R"re(\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B})re"
    R"re(\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC})re"
    R"re(\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})re"
    R"re(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134})re"
    R"re(\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})re"
    R"re(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787})re"
    R"re(\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A})re"
    R"re(\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})re"
    R"re(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)re";

// CJK unified ideographs, the blocks between U+0800 and them, and Hangul.
constexpr const char* kDeepseekCjk = R"re([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)re";

struct PreSpec {
  std::vector<std::string> names;
  std::vector<std::string> regexes;
  bool ignore_merges = false;
  bool default_add_bos = false;
};

const std::vector<PreSpec>& pre_specs() {
  static const std::vector<PreSpec> specs = {
      {{"default"},
       {R"re([\p{P}\$\+<=>\^~\|]+)re", kGpt2, R"re(\p{N}+)re", "[0-9][0-9][0-9]"}},
      {{"gpt-2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe", "jina-es", "jina-de", "jina-v1-en",
        "jina-v2-es", "jina-v2-de", "jina-v2-code", "gigachat", "exaone4", "trillion", "granite-docling",
        "mellum", "a.x-4.0"},
       {kGpt2}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"re(\p{N})re", kGpt2}},
      {{"falcon"}, {R"re([\p{P}\$\+<=>\^~\|`]+)re", kGpt2, "[0-9][0-9][0-9]"}},
      {{"deepseek-coder"},
       {R"re([\r\n])re", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", kDeepseekCjk, R"re(\p{N})re"}},
      {{"deepseek-llm"},
       {R"re([\r\n])re", kDeepseekLlmLetters,
        R"re(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)re",
        R"re(\s+$)re", kDeepseekCjk, R"re(\p{N}+)re"}},
      {{"deepseek-v3", "hunyuan-dense"},
       {R"re(\p{N}{1,3})re", R"re([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)re",
        R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
       {kLlama3},
       true,
       true},
      {{"dbrx", "smaug-bpe", "chatglm-bpe", "glm4"}, {kLlama3}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "megrez", "stablelm2", "hunyuan", "grok-2"}, {kQwen2}},
  };
  return specs;
}

const PreSpec* find_spec(std::string_view pre) {
  for (const PreSpec& s : pre_specs()) {
    for (const std::string& n : s.names) {
      if (n == pre) return &s;
    }
  }
  return nullptr;
}

}  // namespace

PreTokenizer::PreTokenizer(std::string_view pre) : name_(pre) {
  const PreSpec* spec = find_spec(pre);
  if (!spec) {
    std::string known;
    for (const std::string& n : supported_names()) known += (known.empty() ? "" : ", ") + n;
    throw std::runtime_error("unsupported pre-tokenizer '" + std::string(pre) +
                             "' (tokenizer.ggml.pre); supported: " + known);
  }
  for (const std::string& r : spec->regexes) regexes_.emplace_back(r);
  ignore_merges_ = spec->ignore_merges;
  default_add_bos_ = spec->default_add_bos;
}

bool PreTokenizer::is_supported(std::string_view pre) { return find_spec(pre) != nullptr; }

std::vector<std::string> PreTokenizer::supported_names() {
  std::vector<std::string> out;
  for (const PreSpec& s : pre_specs()) out.insert(out.end(), s.names.begin(), s.names.end());
  return out;
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  const DecodedText d = utf8_decode_all(text);
  const size_t n = d.cps.size();
  // Pieces as code point ranges [first, second).
  std::vector<std::pair<size_t, size_t>> pieces;
  if (n > 0) pieces.emplace_back(0, n);
  std::vector<std::pair<size_t, size_t>> next;
  for (const SplitRegex& re : regexes_) {
    next.clear();
    for (const auto& [b, e] : pieces) {
      const std::span<const char32_t> piece(d.cps.data() + b, e - b);
      size_t start = 0;  // end of the last emitted piece, relative to b
      for (size_t p = 0; p < piece.size();) {
        const size_t m = re.match_at(piece, p);
        if (m == SplitRegex::kNoMatch) {
          ++p;
          continue;
        }
        if (m == p) {  // an empty match only marks a boundary
          if (p > start) next.emplace_back(b + start, b + p);
          start = p;
          ++p;
          continue;
        }
        if (p > start) next.emplace_back(b + start, b + p);
        next.emplace_back(b + p, b + m);
        start = p = m;
      }
      if (start < piece.size()) next.emplace_back(b + start, e);
    }
    pieces.swap(next);
  }
  std::vector<std::string_view> words;
  words.reserve(pieces.size());
  for (const auto& [b, e] : pieces) {
    words.push_back(text.substr(d.offsets[b], d.offsets[e] - d.offsets[b]));
  }
  return words;
}

}  // namespace baton
