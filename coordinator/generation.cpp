#include "coordinator/generation.h"

#include <algorithm>
#include <cmath>

namespace baton {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "error";
}

namespace {

// Length of the UTF-8 sequence a lead byte starts; 0 for a byte that cannot
// start one (continuation bytes, 0xC0/0xC1, 0xF5..0xFF).
size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Bytes at the end of s that begin a character still missing its last bytes
// (0 when s ends on a character boundary or with bytes that are invalid anyway).
size_t incomplete_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if (is_continuation(c)) continue;
    size_t len = utf8_length(c);
    return len > back ? back : 0;
  }
  return 0;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = utf8_length(c);
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = is_continuation(static_cast<unsigned char>(s[i + k]));
    if (ok && len >= 3) {
      // Overlong forms, UTF-16 surrogates and code points past U+10FFFF.
      const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
      if (c == 0xE0 && c1 < 0xA0) ok = false;
      if (c == 0xED && c1 >= 0xA0) ok = false;
      if (c == 0xF0 && c1 < 0x90) ok = false;
      if (c == 0xF4 && c1 >= 0x90) ok = false;
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  return out;
}

TextAssembler::TextAssembler(std::vector<std::string> stop) {
  for (auto& s : stop) {
    if (!s.empty()) stop_.push_back(std::move(s));
  }
}

std::string TextAssembler::push(std::string_view piece) {
  if (stopped_) return {};
  held_.append(piece);
  size_t first = std::string::npos;
  for (const auto& s : stop_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    std::string out = sanitize_utf8(std::string_view(held_).substr(0, first));
    held_.clear();
    stopped_ = true;
    return out;
  }
  // Hold back the longest tail that is a proper prefix of a stop string: a
  // match starting before it would already have been found complete.
  size_t safe = held_.size();
  for (const auto& s : stop_) {
    for (size_t k = std::min(s.size() - 1, held_.size()); k > 0; --k) {
      if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
        safe = std::min(safe, held_.size() - k);
        break;
      }
    }
  }
  safe -= incomplete_tail(std::string_view(held_).substr(0, safe));
  std::string out = sanitize_utf8(std::string_view(held_).substr(0, safe));
  held_.erase(0, safe);
  return out;
}

std::string TextAssembler::flush() {
  std::string out = sanitize_utf8(held_);
  held_.clear();
  return out;
}

void compute_logprobs(const float* logits, int64_t n_vocab, int32_t chosen, int top_n, GeneratedToken& out) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n_vocab; ++i) max = std::max(max, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - double(max));
  const double log_z = double(max) + std::log(sum);
  out.logprob = float(double(logits[chosen]) - log_z);
  out.top.clear();
  top_n = int(std::min<int64_t>(top_n, n_vocab));
  if (top_n <= 0) return;
  // Insertion into a short sorted list: n_vocab x top_n at worst, usually one
  // comparison per logit, and no allocation of n_vocab entries.
  std::vector<int32_t> best;
  best.reserve(size_t(top_n) + 1);
  for (int64_t i = 0; i < n_vocab; ++i) {
    if (int(best.size()) == top_n && logits[i] <= logits[best.back()]) continue;
    auto pos = std::find_if(best.begin(), best.end(), [&](int32_t b) { return logits[i] > logits[b]; });
    best.insert(pos, int32_t(i));
    if (int(best.size()) > top_n) best.pop_back();
  }
  for (int32_t id : best) out.top.push_back({id, float(double(logits[id]) - log_z), {}});
}

}  // namespace baton
