// Constrained decoding: a context-free grammar over bytes, a matcher that
// follows it byte by byte, and the mask of the vocabulary's tokens that can
// continue it (docs/GRAMMAR.md).
//
// A Grammar is a set of rules; each rule has alternatives; an alternative is
// a sequence of items, each a set of bytes (one byte of input) or another
// rule. The matcher keeps every way the input read so far can continue as a
// set of stacks (a nondeterministic pushdown automaton), so alternatives that
// share a prefix (anyOf branches, optional properties) need no lookahead.
// Stacks are persistent lists of grammar positions, interned in an arena so
// that equal stacks have equal ids; sets of them are interned as states too,
// and the transitions between states are computed once and kept in a table
// (a deterministic automaton built lazily, as far as the input explores it).
//
// The mask of a state is found by walking a byte trie of the vocabulary
// (VocabTrie) with the matcher: a subtree is dropped at the first byte the
// grammar refuses, so the cost follows the tokens that survive their first
// bytes, not the vocabulary, and each trie node costs one table lookup
// once its transition is known. Masks are cached per state: JSON revisits the
// same states (inside a string, after a comma) all the time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace baton {

class Tokenizer;
class GrammarAutomaton;  // grammar.cpp

// 256 bits: which bytes an item accepts.
struct ByteSet {
  std::array<uint64_t, 4> bits{};
  static ByteSet of(uint8_t b) { return range(b, b); }
  static ByteSet range(uint8_t lo, uint8_t hi);
  ByteSet& add(uint8_t lo, uint8_t hi);
  ByteSet& remove(uint8_t b);
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool operator==(const ByteSet&) const = default;
};

class Grammar {
 public:
  using RuleId = uint32_t;
  // One item of an alternative: a byte set, or a reference to a rule.
  struct Item {
    bool is_rule = false;
    RuleId rule = 0;
    ByteSet bytes;
    static Item byte(uint8_t b) { return {false, 0, ByteSet::of(b)}; }
    static Item set(const ByteSet& s) { return {false, 0, s}; }
    static Item ref(RuleId r) { return {true, r, {}}; }
  };
  static Item byte(uint8_t b) { return Item::byte(b); }
  static Item ref(RuleId r) { return Item::ref(r); }
  // The items that spell `text` byte by byte.
  static std::vector<Item> literal(std::string_view text);
  // The alternatives of one character: a byte of `single` (the one-byte
  // characters allowed), or a well-formed UTF-8 sequence of two to four
  // bytes (no overlong forms, surrogates or code points past U+10FFFF).
  static std::vector<std::vector<Item>> utf8_char(const ByteSet& single);

  RuleId add_rule();
  // Appends an alternative to rule r (an empty one matches nothing: epsilon).
  void add_alternative(RuleId r, const std::vector<Item>& items);
  RuleId root() const { return root_; }
  void set_root(RuleId r) { root_ = r; }

  size_t rule_count() const { return rules_.size(); }
  size_t element_count() const { return elements_.size(); }
  // Throws std::invalid_argument when a rule can reach itself without
  // reading a byte (left recursion), which the matcher cannot follow, or a
  // rule has no alternative.
  void check() const;

  // The compiled layout the matcher walks: alternatives are runs of elements
  // ending with an `end` element; rules hold the start of each alternative.
  enum class Kind : uint8_t { bytes, rule, end };
  struct Element {
    Kind kind = Kind::end;
    uint32_t arg = 0;  // bytes: index into sets(); rule: the RuleId
  };
  const Element& element(uint32_t pos) const { return elements_[pos]; }
  const std::vector<uint32_t>& alternatives(RuleId r) const { return rules_[r]; }
  const ByteSet& byte_set(uint32_t i) const { return sets_[i]; }

 private:
  friend class GrammarMatcher;
  uint32_t intern_set(const ByteSet& s);
  // The automaton the matchers of this grammar share (made on first use).
  std::shared_ptr<GrammarAutomaton> automaton() const;

  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> rules_;
  std::vector<ByteSet> sets_;
  std::unordered_map<std::string, uint32_t> set_index_;
  RuleId root_ = 0;
  mutable std::mutex automaton_mu_;
  mutable std::shared_ptr<GrammarAutomaton> automaton_;
};

// The vocabulary as a byte trie in preorder: node i's subtree is
// [i, next[i]); depth[i] is its distance from the root (1 for the first
// byte). Tokens with an empty piece (control tokens) are left out: they can
// never continue a grammar.
class VocabTrie {
 public:
  explicit VocabTrie(const Tokenizer& tok);
  VocabTrie(std::span<const std::string> pieces);  // id = index (tests)

  int32_t n_vocab() const { return n_vocab_; }
  size_t node_count() const { return byte_.size(); }

 private:
  friend class GrammarMatcher;
  void build(std::span<const std::string> pieces);

  int32_t n_vocab_ = 0;
  std::vector<uint8_t> byte_;
  std::vector<uint16_t> depth_;
  std::vector<uint32_t> next_;
  std::vector<uint32_t> tok_begin_;  // tokens whose piece ends at node i: tokens_[tok_begin_[i], tok_begin_[i+1])
  std::vector<int32_t> tokens_;
  uint16_t max_depth_ = 0;
};

// One generation's position in a grammar; one per sequence. The automaton
// it walks (stacks, states, transitions, cached masks) belongs to the
// grammar and is shared by every matcher of it (under a lock), so that
// requests with the same grammar reuse each other's work; a matcher whose
// shared automaton grew past its limits continues on a private one built
// from its present state alone.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> g);

  // Reads bytes; false (and the state unchanged) when the grammar refuses them.
  bool advance(std::string_view bytes);
  // Whether advance(bytes) would succeed; the state stays as it is.
  bool accepts(std::string_view bytes);
  // The input so far is a complete sentence of the grammar.
  bool accepting() const;
  // Complete, and no byte can follow: generation is over.
  bool finished() const;
  // Sets bit t of `mask` (n_vocab bits, 64 per word; resized and cleared
  // here) for every token whose whole piece the grammar accepts from here.
  void fill_mask(const VocabTrie& trie, std::vector<uint64_t>& mask);

 private:
  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<GrammarAutomaton> a_;
  uint32_t cur_ = 0;  // state id in a_
  std::vector<uint32_t> walk_;  // the trie walk's state per depth
};

// Sets the logits of tokens outside `bits` (fill_mask's layout) to -infinity.
void mask_logits(std::span<const uint64_t> bits, std::span<float> logits);

}  // namespace baton
