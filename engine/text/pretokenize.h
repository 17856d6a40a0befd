// Pre-tokenization for byte-level BPE: text is cut into words before merges
// run, by the sequence of split regexes that belongs to the vocabulary's
// `tokenizer.ggml.pre` value (the same regexes HF tokenizers and llama.cpp
// use). Each regex splits every piece the previous one left; matches and the
// text between matches both become pieces, so the words always cover the
// input exactly, byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

// A small backtracking regex engine over code points, enough for tokenizer
// split patterns: literals, `.`, classes with ranges and negation, \p{..} /
// \P{..} (general categories and major classes), \s \S \d \D \w \W, escapes
// (\r \n \t \f \v \xHH \x{H..} \uHHHH \UHHHHHHHH), groups (?:..) and (..),
// alternation, greedy ? * + {n} {n,} {n,m} (on single-character atoms; groups
// take only ?), lookahead (?=..) (?!..), anchors ^ $ (start/end of the piece),
// and (?i:..) for ASCII letters. Anything else is refused when compiling.
// Matching is leftmost-first with greedy backtracking, as in PCRE.
class SplitRegex {
 public:
  static constexpr size_t kNoMatch = SIZE_MAX;

  // Throws std::invalid_argument naming the unsupported construct or error.
  explicit SplitRegex(std::string_view pattern);

  // Matches at text[pos] (the piece being split is all of `text`: lookahead
  // and $ see its end). Returns the end index of the match or kNoMatch.
  size_t match_at(std::span<const char32_t> text, size_t pos) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct CharClass {
    std::vector<std::pair<char32_t, char32_t>> ranges;  // sorted, disjoint
    uint32_t cats = 0;      // category mask: member if the category is in it
    uint32_t not_cats = 0;  // member if the category is NOT in it (\P{..})
    bool space = false, not_space = false;
    bool negated = false;
    bool test(char32_t c) const;
  };
  enum class Kind : uint8_t { Set, Alt, Look, Bol, Eol, Accept, AcceptLook };
  struct Node {
    Kind kind = Kind::Accept;
    bool negative = false;  // Look: (?!..)
    int cls = -1;           // Set
    uint32_t min = 1, max = 1;
    int next = -1;
    int sub = -1;               // Look: start of the sub-pattern
    std::vector<int> branches;  // Alt
  };
  struct Ast;
  class Parser;
  struct Ctx;

  int compile(const Ast& a, int next);
  int add(Node n);
  bool run(int node, size_t pos, Ctx& c) const;

  std::string pattern_;
  std::vector<CharClass> classes_;
  std::vector<Node> nodes_;
  int start_ = -1;
};

// The split rules of one `tokenizer.ggml.pre` value.
class PreTokenizer {
 public:
  // Throws std::runtime_error naming `pre` when it is not supported.
  explicit PreTokenizer(std::string_view pre);

  const std::string& name() const { return name_; }
  // llama3-style vocabularies look a whole word up before merging it.
  bool ignore_merges() const { return ignore_merges_; }
  // Default for `tokenizer.ggml.add_bos_token` when the key is absent.
  bool default_add_bos() const { return default_add_bos_; }

  // Splits UTF-8 `text` into words (views into `text`) that cover it in order.
  // Malformed UTF-8 bytes count as U+FFFD for matching but stay in the words.
  std::vector<std::string_view> split(std::string_view text) const;

  static bool is_supported(std::string_view pre);
  static std::vector<std::string> supported_names();

 private:
  std::string name_;
  std::vector<SplitRegex> regexes_;
  bool ignore_merges_ = false;
  bool default_add_bos_ = false;
};

}  // namespace baton
