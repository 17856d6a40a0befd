#include "engine/sampling/grammar.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "engine/text/tokenizer.h"

namespace baton {

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add(lo, hi);
  return s;
}

ByteSet& ByteSet::add(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) bits[size_t(b >> 6)] |= uint64_t(1) << (b & 63);
  return *this;
}

ByteSet& ByteSet::remove(uint8_t b) {
  bits[b >> 6] &= ~(uint64_t(1) << (b & 63));
  return *this;
}

std::vector<Grammar::Item> Grammar::literal(std::string_view text) {
  std::vector<Item> items;
  for (char c : text) items.push_back(byte(uint8_t(c)));
  return items;
}

std::vector<std::vector<Grammar::Item>> Grammar::utf8_char(const ByteSet& single) {
  const Item c = Item::set(ByteSet::range(0x80, 0xBF));
  return {{Item::set(single)},
          {Item::set(ByteSet::range(0xC2, 0xDF)), c},
          {Item::byte(0xE0), Item::set(ByteSet::range(0xA0, 0xBF)), c},
          {Item::set(ByteSet::range(0xE1, 0xEC)), c, c},
          {Item::byte(0xED), Item::set(ByteSet::range(0x80, 0x9F)), c},
          {Item::set(ByteSet::range(0xEE, 0xEF)), c, c},
          {Item::byte(0xF0), Item::set(ByteSet::range(0x90, 0xBF)), c, c},
          {Item::set(ByteSet::range(0xF1, 0xF3)), c, c, c},
          {Item::byte(0xF4), Item::set(ByteSet::range(0x80, 0x8F)), c, c}};
}

Grammar::RuleId Grammar::add_rule() {
  rules_.emplace_back();
  return RuleId(rules_.size() - 1);
}

uint32_t Grammar::intern_set(const ByteSet& s) {
  std::string key(reinterpret_cast<const char*>(s.bits.data()), sizeof(s.bits));
  auto [it, fresh] = set_index_.emplace(std::move(key), uint32_t(sets_.size()));
  if (fresh) sets_.push_back(s);
  return it->second;
}

void Grammar::add_alternative(RuleId r, const std::vector<Item>& items) {
  rules_.at(r).push_back(uint32_t(elements_.size()));
  for (const Item& it : items) {
    if (it.is_rule) {
      if (it.rule >= rules_.size()) throw std::logic_error("grammar: reference to an unknown rule");
      elements_.push_back({Kind::rule, it.rule});
    } else {
      elements_.push_back({Kind::bytes, intern_set(it.bytes)});
    }
  }
  elements_.push_back({Kind::end, 0});
}

void Grammar::check() const {
  // nullable: the rule can match the empty input (fixed point).
  std::vector<bool> nullable(rules_.size(), false);
  auto alt_nullable = [&](uint32_t pos) {
    for (;; ++pos) {
      const Element& e = elements_[pos];
      if (e.kind == Kind::end) return true;
      if (e.kind == Kind::bytes || !nullable[e.arg]) return false;
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (rules_[r].empty()) throw std::invalid_argument("grammar: a rule has no alternative");
      if (nullable[r]) continue;
      for (uint32_t a : rules_[r]) {
        if (alt_nullable(a)) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  // Left corners: the rules an alternative may expand before reading a byte.
  // A cycle among them is left recursion.
  std::vector<std::vector<uint32_t>> corners(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (uint32_t pos : rules_[r]) {
      for (;; ++pos) {
        const Element& e = elements_[pos];
        if (e.kind != Kind::rule) break;
        corners[r].push_back(e.arg);
        if (!nullable[e.arg]) break;
      }
    }
  }
  // Depth-first search with an explicit stack: a grammar's depth (a long
  // chain of rules) must not set the depth of this thread's stack.
  std::vector<uint8_t> mark(rules_.size(), 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;  // rule, next corner to look at
  for (uint32_t root = 0; root < rules_.size(); ++root) {
    if (mark[root] != 0) continue;
    mark[root] = 1;
    path.emplace_back(root, 0);
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == corners[r].size()) {
        mark[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t c = corners[r][next++];
      if (mark[c] == 1) throw std::invalid_argument("grammar: a rule refers to itself before reading any input");
      if (mark[c] == 0) {
        mark[c] = 1;
        path.emplace_back(c, 0);
      }
    }
  }
}

// ---- VocabTrie ----

VocabTrie::VocabTrie(const Tokenizer& tok) {
  std::vector<std::string> pieces(size_t(tok.n_vocab()));
  for (int32_t t = 0; t < tok.n_vocab(); ++t) pieces[size_t(t)] = tok.token_to_piece(t);
  build(pieces);
}

VocabTrie::VocabTrie(std::span<const std::string> pieces) { build(pieces); }

void VocabTrie::build(std::span<const std::string> pieces) {
  n_vocab_ = int32_t(pieces.size());
  std::vector<int32_t> order;
  for (int32_t t = 0; t < n_vocab_; ++t) {
    // Empty pieces (control tokens) never continue a grammar; pieces past
    // the depth counter's range are never real tokens.
    if (!pieces[size_t(t)].empty() && pieces[size_t(t)].size() <= 65535) order.push_back(t);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int c = pieces[size_t(a)].compare(pieces[size_t(b)]);
    return c != 0 ? c < 0 : a < b;
  });
  // Sorted pieces give the trie in preorder: each piece shares its longest
  // common prefix with the previous one, and adds nodes for the rest.
  std::vector<uint32_t> path;  // node index per depth - 1
  std::string_view prev;
  std::vector<std::pair<uint32_t, int32_t>> node_tokens;  // (node, token)
  for (int32_t t : order) {
    const std::string_view p = pieces[size_t(t)];
    size_t common = 0;
    while (common < p.size() && common < prev.size() && p[common] == prev[common]) ++common;
    while (path.size() > common) {
      next_[path.back()] = uint32_t(byte_.size());
      path.pop_back();
    }
    for (size_t d = common; d < p.size(); ++d) {
      path.push_back(uint32_t(byte_.size()));
      byte_.push_back(uint8_t(p[d]));
      depth_.push_back(uint16_t(d + 1));
      next_.push_back(0);
    }
    max_depth_ = std::max<uint16_t>(max_depth_, uint16_t(p.size()));
    node_tokens.emplace_back(path.back(), t);
    prev = p;
  }
  while (!path.empty()) {
    next_[path.back()] = uint32_t(byte_.size());
    path.pop_back();
  }
  tok_begin_.assign(byte_.size() + 1, 0);
  for (const auto& [n, t] : node_tokens) ++tok_begin_[n + 1];
  std::partial_sum(tok_begin_.begin(), tok_begin_.end(), tok_begin_.begin());
  tokens_.resize(node_tokens.size());
  std::vector<uint32_t> fill(tok_begin_.begin(), tok_begin_.end() - 1);
  for (const auto& [n, t] : node_tokens) tokens_[fill[n]++] = t;
}

// ---- GrammarAutomaton, GrammarMatcher ----

namespace {
constexpr int kMaxExpandDepth = 4096;  // nesting of rule references within one byte
// Past these an automaton is not grown further: matchers continue on a fresh
// one holding only their present state.
constexpr size_t kMaxNodes = size_t(1) << 20;
constexpr size_t kMaxStates = 4096;  // x 256 transitions of 4 bytes: 4 MiB
constexpr size_t kMaxCachedMasks = 256;
constexpr uint32_t kUnknown = 0xFFFFFFFFu;
}  // namespace

// Stacks are nodes (grammar position, parent node) interned so that equal
// stacks have equal ids; states are sorted sets of stack tops, interned too;
// trans holds each state's successor per byte once computed.
class GrammarAutomaton {
 public:
  using State = std::vector<uint32_t>;  // sorted node ids of stack tops; 0: the empty stack

  explicit GrammarAutomaton(const Grammar& g) : g_(g) {
    nodes_.push_back({0, 0});  // node 0: the empty stack
    intern({});                // state 0: dead
  }

  std::mutex mu;

  // The state whose stacks are `stacks` (positions, bottom first).
  uint32_t state_of(const std::vector<std::vector<uint32_t>>& stacks) {
    State s;
    for (const auto& st : stacks) {
      uint32_t id = 0;
      for (uint32_t pos : st) id = node(pos, id);
      s.push_back(id);
    }
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return intern(std::move(s));
  }

  uint32_t start() {
    State s;
    for (uint32_t a : g_.alternatives(g_.root())) expand(node(a, 0), s, 0);
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return intern(std::move(s));
  }

  std::vector<std::vector<uint32_t>> stacks(uint32_t state) const {
    std::vector<std::vector<uint32_t>> out;
    for (uint32_t id : states_[state]) {
      std::vector<uint32_t> st;
      for (uint32_t n = id; n != 0; n = nodes_[n].parent) st.push_back(nodes_[n].pos);
      std::reverse(st.begin(), st.end());
      out.push_back(std::move(st));
    }
    return out;
  }

  bool full() const { return nodes_.size() > kMaxNodes || states_.size() > kMaxStates; }
  const State& state(uint32_t id) const { return states_[id]; }

  // The state after byte b (0: dead), computed on first use.
  uint32_t next(uint32_t state, uint8_t b) {
    const size_t at = size_t(state) * 256 + b;
    if (trans_[at] != kUnknown) return trans_[at];
    State to;
    for (uint32_t id : states_[state]) {
      if (id == 0) continue;
      const Node n = nodes_[id];
      if (!g_.byte_set(g_.element(n.pos).arg).has(b)) continue;
      expand(node(n.pos + 1, n.parent), to, 0);
    }
    std::sort(to.begin(), to.end());
    to.erase(std::unique(to.begin(), to.end()), to.end());
    const uint32_t id = intern(std::move(to));
    trans_[at] = id;  // after intern, which may grow trans_
    return id;
  }

  const std::vector<uint64_t>* cached_mask(uint32_t state, const VocabTrie& trie) const {
    if (mask_trie_ != &trie) return nullptr;
    auto it = mask_cache_.find(state);
    return it == mask_cache_.end() ? nullptr : &it->second;
  }
  void cache_mask(uint32_t state, const VocabTrie& trie, const std::vector<uint64_t>& mask) {
    if (mask_trie_ != &trie || mask_cache_.size() >= kMaxCachedMasks) mask_cache_.clear();
    mask_trie_ = &trie;
    mask_cache_.emplace(state, mask);
  }

 private:
  struct Node {
    uint32_t pos;
    uint32_t parent;  // node id; 0 is the empty stack
  };

  uint32_t node(uint32_t pos, uint32_t parent) {
    const uint64_t key = (uint64_t(pos) << 32) | parent;
    auto [it, fresh] = index_.emplace(key, uint32_t(nodes_.size()));
    if (fresh) nodes_.push_back({pos, parent});
    return it->second;
  }

  uint32_t intern(State&& s) {
    std::string key(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(uint32_t));
    auto [it, fresh] = state_ids_.emplace(std::move(key), uint32_t(states_.size()));
    if (fresh) {
      states_.push_back(std::move(s));
      trans_.resize(states_.size() * 256, kUnknown);
    }
    return it->second;
  }

  // Appends the stack tops that `id` stands for once every rule reference on
  // top is replaced by its alternatives and every finished alternative
  // popped: each result waits for a byte, or is 0 (the input may end here).
  void expand(uint32_t id, State& out, int depth) {
    if (depth > kMaxExpandDepth) throw std::runtime_error("grammar: nesting too deep");
    for (;;) {
      if (id == 0) {
        out.push_back(0);
        return;
      }
      const Node n = nodes_[id];
      const Grammar::Element& e = g_.element(n.pos);
      if (e.kind == Grammar::Kind::bytes) {
        out.push_back(id);
        return;
      }
      if (e.kind == Grammar::Kind::end) {
        id = n.parent;
        continue;
      }
      // A reference in last position returns straight to the parent (a tail
      // call), so that repetitions written as right recursion do not grow the stack.
      const bool tail = g_.element(n.pos + 1).kind == Grammar::Kind::end;
      const uint32_t ret = tail ? n.parent : node(n.pos + 1, n.parent);
      const auto& alts = g_.alternatives(e.arg);
      for (size_t i = 0; i + 1 < alts.size(); ++i) expand(node(alts[i], ret), out, depth + 1);
      id = node(alts.back(), ret);
    }
  }

  const Grammar& g_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> index_;
  std::vector<State> states_;  // id -> sorted stack tops; 0: dead (no stack)
  std::unordered_map<std::string, uint32_t> state_ids_;
  std::vector<uint32_t> trans_;  // state * 256 + byte -> state
  std::unordered_map<uint32_t, std::vector<uint64_t>> mask_cache_;  // by state, for mask_trie_
  const VocabTrie* mask_trie_ = nullptr;
};

std::shared_ptr<GrammarAutomaton> Grammar::automaton() const {
  std::lock_guard lock(automaton_mu_);
  if (!automaton_) {
    automaton_ = std::make_shared<GrammarAutomaton>(*this);
  } else {
    std::lock_guard inner(automaton_->mu);
    // A full one is left to the matchers still on it; new ones start afresh.
    if (automaton_->full()) automaton_ = std::make_shared<GrammarAutomaton>(*this);
  }
  return automaton_;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> g) : g_(std::move(g)), a_(g_->automaton()) {
  std::lock_guard lock(a_->mu);
  cur_ = a_->start();
}

bool GrammarMatcher::advance(std::string_view bytes) {
  std::unique_lock lock(a_->mu);
  uint32_t s = cur_;
  for (char c : bytes) {
    s = a_->next(s, uint8_t(c));
    if (s == 0) return false;
  }
  cur_ = s;
  if (a_->full()) {
    // Continue on a private automaton holding only the present state.
    auto fresh = std::make_shared<GrammarAutomaton>(*g_);
    const auto stacks = a_->stacks(cur_);
    lock.unlock();
    std::lock_guard inner(fresh->mu);
    cur_ = fresh->state_of(stacks);
    a_ = std::move(fresh);
  }
  return true;
}

bool GrammarMatcher::accepts(std::string_view bytes) {
  std::lock_guard lock(a_->mu);
  uint32_t s = cur_;
  for (char c : bytes) {
    s = a_->next(s, uint8_t(c));
    if (s == 0) return false;
  }
  return true;
}

bool GrammarMatcher::accepting() const {
  std::lock_guard lock(a_->mu);
  const auto& s = a_->state(cur_);
  return !s.empty() && s.front() == 0;
}

bool GrammarMatcher::finished() const {
  std::lock_guard lock(a_->mu);
  const auto& s = a_->state(cur_);
  return s.size() == 1 && s.front() == 0;
}

void GrammarMatcher::fill_mask(const VocabTrie& trie, std::vector<uint64_t>& mask) {
  std::lock_guard lock(a_->mu);
  if (const auto* cached = a_->cached_mask(cur_, trie)) {
    mask = *cached;
    return;
  }
  mask.assign((size_t(trie.n_vocab()) + 63) / 64, 0);
  walk_.resize(size_t(trie.max_depth_) + 1);
  walk_[0] = cur_;
  const size_t n = trie.byte_.size();
  for (size_t i = 0; i < n;) {
    const size_t d = trie.depth_[i];
    const uint32_t s = a_->next(walk_[d - 1], trie.byte_[i]);
    if (s == 0) {
      i = trie.next_[i];
      continue;
    }
    walk_[d] = s;
    for (uint32_t k = trie.tok_begin_[i]; k < trie.tok_begin_[i + 1]; ++k) {
      const int32_t t = trie.tokens_[k];
      mask[size_t(t) >> 6] |= uint64_t(1) << (t & 63);
    }
    ++i;
  }
  a_->cache_mask(cur_, trie, mask);
}

void mask_logits(std::span<const uint64_t> bits, std::span<float> logits) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (size_t t = 0; t < logits.size(); ++t) {
    if (!((bits[t >> 6] >> (t & 63)) & 1)) logits[t] = ninf;
  }
}

}  // namespace baton
