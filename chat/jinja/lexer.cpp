// Jinja lexer with the Hugging Face environment's whitespace rules: a block or
// comment tag drops the newline after it (trim_blocks) and the spaces before
// it on its line (lstrip_blocks); `-` strips all whitespace on that side, `+`
// keeps it; a single trailing newline of the source is dropped.
#include <cctype>

#include <fmt/format.h>

#include "chat/jinja/ast.h"
#include "engine/text/unicode.h"

namespace baton::jinja {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string normalize(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(std::string_view s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    auto hex = [&](size_t n) {
      const std::string h(i + n < s.size() ? s.substr(i + 1, n) : std::string_view());
      if (h.empty() || h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        throw TemplateError(fmt::format("chat template: bad escape in a string at line {}", line));
      const uint32_t cp = uint32_t(std::stoul(h, nullptr, 16));
      if (cp > 0x10FFFF) throw TemplateError(fmt::format("chat template: bad escape in a string at line {}", line));
      i += n;
      utf8_append(out, char32_t(cp));
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;
      case 'x': hex(2); break;
      case 'u': hex(4); break;
      case 'U': hex(8); break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = 0;
          size_t n = 0;
          while (n < 3 && i < s.size() && s[i] >= '0' && s[i] <= '7') cp = cp * 8 + uint32_t(s[i++] - '0'), ++n;
          --i;
          utf8_append(out, char32_t(cp));
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : s_(normalize(src)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < s_.size()) {
      size_t start = find_tag(pos_);
      std::string text = s_.substr(pos_, start - pos_);
      if (start == s_.size()) {
        emit_text(text);
        break;
      }
      const char kind = s_[start + 1];  // '{', '%' or '#'
      const char mod = start + 2 < s_.size() ? s_[start + 2] : 0;
      if (mod == '-') {
        size_t e = text.size();
        while (e > 0 && is_ws(text[e - 1])) --e;
        text.resize(e);
      } else if (mod != '+' && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (l_pos > 0 || line_starting) {
          bool all_ws = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k) all_ws = all_ws && is_ws(text[k]);
          if (all_ws) text.resize(l_pos);
        }
      }
      count_lines(pos_, start);
      emit_text(text);
      pos_ = start + 2 + (mod == '-' || mod == '+' ? 1 : 0);
      if (kind == '#') {
        const size_t e = s_.find("#}", pos_);
        if (e == std::string::npos) throw error("unclosed comment");
        count_lines(pos_, e);
        const bool strip = e > pos_ && s_[e - 1] == '-';
        const bool keep = e > pos_ && s_[e - 1] == '+';
        pos_ = e + 2;
        line_starting = finish_tag(strip, !keep);
        continue;
      }
      if (kind == '%' && try_raw()) {
        line_starting = last_newline_;
        continue;
      }
      toks_.push_back({kind == '%' ? Tok::BlockBegin : Tok::VarBegin, "", line_});
      line_starting = lex_expr(kind == '%' ? '%' : '}');
    }
    toks_.push_back({Tok::End, "", line_});
    return std::move(toks_);
  }

 private:
  TemplateError error(const std::string& what) const {
    return TemplateError(fmt::format("chat template: {} at line {}", what, line_));
  }
  size_t find_tag(size_t from) const {
    for (size_t p = from; p + 1 < s_.size(); ++p) {
      if (s_[p] == '{' && (s_[p + 1] == '{' || s_[p + 1] == '%' || s_[p + 1] == '#')) return p;
    }
    return s_.size();
  }
  void count_lines(size_t a, size_t b) {
    for (size_t k = a; k < b && k < s_.size(); ++k) line_ += s_[k] == '\n';
  }
  void emit_text(const std::string& t) {
    if (!t.empty()) toks_.push_back({Tok::Text, t, line_});
  }
  // After a tag's closing marker: `-` strips following whitespace; a block or
  // comment (trim) drops one newline. Returns whether a newline ended it.
  bool finish_tag(bool strip, bool trim) {
    bool nl = false;
    if (strip) {
      while (pos_ < s_.size() && is_ws(s_[pos_])) {
        nl = s_[pos_] == '\n';
        line_ += nl;
        ++pos_;
      }
    } else if (trim && pos_ < s_.size() && s_[pos_] == '\n') {
      ++pos_;
      ++line_;
      nl = true;
    }
    return nl;
  }

  // `{% raw %}...{% endraw %}`: the body is text.
  bool try_raw() {
    size_t p = pos_;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    if (s_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < s_.size() && is_ws(s_[p])) ++p;
    const bool strip_after = p < s_.size() && s_[p] == '-';
    if (strip_after) ++p;
    if (s_.compare(p, 2, "%}") != 0) return false;
    pos_ = p + 2;
    finish_tag(strip_after, true);
    for (size_t q = pos_; (q = s_.find("{%", q)) != std::string::npos; q += 2) {
      size_t r = q + 2;
      const bool strip_before = r < s_.size() && s_[r] == '-';
      if (strip_before || (r < s_.size() && s_[r] == '+')) ++r;
      while (r < s_.size() && is_ws(s_[r])) ++r;
      if (s_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < s_.size() && is_ws(s_[r])) ++r;
      const bool strip_end = r < s_.size() && s_[r] == '-';
      if (strip_end) ++r;
      if (s_.compare(r, 2, "%}") != 0) continue;
      std::string body = s_.substr(pos_, q - pos_);
      if (strip_before) {
        while (!body.empty() && is_ws(body.back())) body.pop_back();
      }
      count_lines(pos_, r);
      emit_text(body);
      pos_ = r + 2;
      last_newline_ = finish_tag(strip_end, true);
      return true;
    }
    throw error("unclosed raw block");
  }

  // Expression tokens up to the closing `%}` or `}}`; returns whether the tag
  // ended with a newline (for lstrip_blocks on the next tag).
  bool lex_expr(char close) {
    int depth = 0;
    while (true) {
      while (pos_ < s_.size() && is_ws(s_[pos_])) line_ += s_[pos_++] == '\n';
      if (pos_ >= s_.size()) throw error("unclosed tag");
      const char c = s_[pos_];
      // Closing marker (optionally with - or +), unless inside braces.
      if (depth == 0) {
        size_t p = pos_;
        const bool strip = s_[p] == '-', keep = s_[p] == '+';
        if (strip || keep) ++p;
        if (p + 1 < s_.size() && s_[p] == close && s_[p + 1] == '}') {
          toks_.push_back({close == '%' ? Tok::BlockEnd : Tok::VarEnd, "", line_});
          pos_ = p + 2;
          return finish_tag(strip, close == '%' && !keep);
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
        toks_.push_back({Tok::Name, s_.substr(pos_, e - pos_), line_});
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        size_t e = pos_ + 1;
        while (e < s_.size() && s_[e] != c) e += s_[e] == '\\' ? 2 : 1;
        if (e >= s_.size()) throw error("unclosed string");
        const int l = line_;
        count_lines(pos_, e);
        toks_.push_back({Tok::String, unescape(std::string_view(s_).substr(pos_ + 1, e - pos_ - 1), l), l});
        pos_ = e + 1;
      } else {
        static const char* ops2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* o : ops2)
          if (s_.compare(pos_, 2, o) == 0) op = o;
        if (op.size() == 1 && std::string_view("+-*/%~[](){}<>=.:|,").find(c) == std::string_view::npos)
          throw error(fmt::format("unexpected character '{}'", c));
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        toks_.push_back({Tok::Op, op, line_});
        pos_ += op.size();
      }
    }
  }

  void lex_number() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[e])) || s_[e] == '_')) ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < s_.size() && s_[e] == '.' && std::isdigit(static_cast<unsigned char>(s_[e + 1]))) {
      ++e;
      digits();
      is_float = true;
    }
    if (e < s_.size() && (s_[e] == 'e' || s_[e] == 'E')) {
      size_t q = e + 1;
      if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
      if (q < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q]))) {
        e = q;
        digits();
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = pos_; k < e; ++k)
      if (s_[k] != '_') text += s_[k];
    Token t{is_float ? Tok::Float : Tok::Int, text, line_};
    try {
      if (is_float) t.f = std::stod(text);
      else t.i = std::stoll(text);
    } catch (const std::exception&) {
      throw error("number literal out of range");
    }
    toks_.push_back(t);
    pos_ = e;
  }

  std::string s_;
  size_t pos_ = 0;
  int line_ = 1;
  bool last_newline_ = false;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(source).run(); }

}  // namespace baton::jinja
