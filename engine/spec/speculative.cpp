#include "engine/spec/speculative.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include "engine/gguf/file.h"
#include "engine/spec/draft_pacer.h"

namespace baton {

std::vector<int> drafter_capture_layers(const GgufFile* f, int n_layer) {
  std::vector<int> out;
  const GgufValue* ids = nullptr;
  for (const char* key : {"dspark.target_layer_ids", "deepseek4.dspark.target_layer_ids"}) {
    if (f && !ids) ids = f->find(key);
  }
  if (ids) {
    if (ids->type != GgufType::ARRAY) throw std::runtime_error("dspark.target_layer_ids is not an array");
    for (const GgufValue& v : ids->items) {
      const int64_t l = v.as_int();
      if (l < 0 || l >= n_layer) {
        throw std::runtime_error(fmt::format("dspark.target_layer_ids names layer {}; the model has {}", l, n_layer));
      }
      out.push_back(int(l));
    }
    return out;
  }
  for (int l = std::max(0, n_layer - 3); l < n_layer; ++l) out.push_back(l);
  return out;
}

int32_t verify_sampled(std::span<const Sampler::Candidate> p, int32_t guess, double q_d, const float* q,
                       double u_accept, double u_draw, bool* kept) {
  if (p.empty()) throw std::invalid_argument("verify_sampled: an empty target distribution");
  double p_d = 0;
  for (const auto& c : p) {
    if (c.id == guess) p_d = c.p;
  }
  // u < p/q without the division (q_d may be 0 for a guess the draft's
  // logits call impossible: then any p > 0 keeps it).
  if (p_d > 0 && u_accept * q_d < p_d) {
    *kept = true;
    return guess;
  }
  *kept = false;
  auto q_of = [&](int32_t id) { return q ? double(q[id]) : (id == guess ? 1.0 : 0.0); };
  double total = 0;
  for (const auto& c : p) total += std::max(0.0, c.p - q_of(c.id));
  const bool residual = total > 0;  // p == q leaves nothing: draw from p
  if (!residual) total = 1;
  const double target = u_draw * total;
  double acc = 0;
  for (size_t i = 0; i + 1 < p.size(); ++i) {
    acc += residual ? std::max(0.0, p[i].p - q_of(p[i].id)) : p[i].p;
    if (target < acc) return p[i].id;
  }
  // The last candidate with mass takes the rounding's remainder.
  for (size_t i = p.size(); i-- > 0;) {
    if (!residual || p[i].p - q_of(p[i].id) > 0) return p[i].id;
  }
  return p.back().id;
}

namespace {

// The output side of the loop: takes tokens one at a time and says when
// generation ends.
class Output {
 public:
  Output(const SpecOptions& o, SpecResult& r) : o_(o), r_(r) {
    for (const std::string& s : o.stop_strings) longest_ = std::max(longest_, s.size());
  }
  bool wanted() const { return o_.n_predict < 0 || int64_t(r_.tokens.size()) < o_.n_predict; }
  // False when generation ends at `id` (a stop token: not kept; the last
  // wanted token or a stop string: kept).
  bool take(int32_t id) {
    if (std::find(o_.stop_tokens.begin(), o_.stop_tokens.end(), id) != o_.stop_tokens.end()) {
      r_.stop = "stop token";
      return false;
    }
    r_.tokens.push_back(id);
    if (o_.on_token) o_.on_token(id);
    if (o_.piece) {
      const size_t before = r_.text.size();
      r_.text += o_.piece(id);
      // A stop string may start in earlier text and end in this piece.
      const size_t from = before >= longest_ ? before - longest_ + 1 : 0;
      size_t cut = std::string::npos;
      for (const std::string& s : o_.stop_strings) {
        if (s.empty()) continue;
        cut = std::min(cut, r_.text.find(s, from));
      }
      if (cut != std::string::npos) {
        r_.text.resize(cut);
        r_.stop = "stop string";
        return false;
      }
    }
    return wanted();
  }

 private:
  const SpecOptions& o_;
  SpecResult& r_;
  size_t longest_ = 0;
};

}  // namespace

SpecResult speculative_generate(StageRunner& stage, int seq, std::span<const int32_t> prompt, Sampler& sampler,
                                DraftSource& source, const SpecOptions& o) {
  const StageConfig& c = stage.config();
  if (!c.embedding || !c.head) throw std::invalid_argument("speculative decoding needs a stage with embedding and head");
  if (o.max_draft < 0) throw std::invalid_argument("max_draft must be >= 0");
  if (o.max_draft > 0 && c.verify_rows < o.max_draft + 1) {
    throw std::invalid_argument(fmt::format("drafts of {} tokens need verify forwards of {} rows; the stage has {}",
                                            o.max_draft, o.max_draft + 1, c.verify_rows));
  }
  if (prompt.empty()) throw std::invalid_argument("speculative decoding: an empty prompt");
  if (stage.position(seq) != 0) throw std::invalid_argument(fmt::format("sequence {} is not empty", seq));
  if (!o.stop_strings.empty() && !o.piece) throw std::invalid_argument("stop strings need the tokens' text (piece)");
  const int64_t n_vocab = stage.n_vocab(), n_ctx = stage.n_ctx();
  const float temperature = sampler.params().temperature;
  SpecResult r;
  Output out(o, r);
  ForwardOptions prefill;
  prefill.capture = o.capture;
  std::span<const float> logits;
  for (size_t at = 0; at < prompt.size(); at += size_t(c.max_batch)) {
    const auto chunk = prompt.subspan(at, std::min(prompt.size() - at, size_t(c.max_batch)));
    const ForwardRows rows = stage.forward_rows(seq, chunk, prefill);
    logits = rows.out;
    source.committed(chunk, int64_t(at), rows.hidden);
  }
  if (o.n_predict == 0) return r;
  int32_t bonus = sampler.sample(logits);
  if (!out.take(bonus)) return r;

  std::vector<int32_t> rows;
  std::vector<float> q;  // the draft's distribution of one guess
  ForwardOptions verify;
  verify.capture = o.capture;
  for (;;) {
    const int64_t n = stage.position(seq);
    if (n >= n_ctx) {
      r.stop = "context full";
      return r;
    }
    // A verify of L guesses decides up to L + 1 tokens: no more than wanted.
    int64_t limit = std::min<int64_t>(o.max_draft, n_ctx - n - 1);
    if (o.n_predict >= 0) limit = std::min<int64_t>(limit, o.n_predict - int64_t(r.tokens.size()) - 1);
    Draft d;
    const auto t0 = std::chrono::steady_clock::now();  // the round and the verify: the pacer's step
    if (limit > 0 && (!o.pacer || o.pacer->draft_now())) d = source.propose(bonus, n, int(limit));
    if (d.end) {
      r.stop = "source";
      return r;
    }
    if (int64_t(d.tokens.size()) > limit) d.tokens.resize(size_t(std::max<int64_t>(limit, 0)));
    const size_t L = d.tokens.size();
    if (!d.logits.empty() && d.logits.size() < L * size_t(n_vocab)) {
      throw std::invalid_argument(fmt::format("a draft of {} tokens came with {} logits (n_vocab {})", L,
                                              d.logits.size(), n_vocab));
    }
    rows.assign(1, bonus);
    rows.insert(rows.end(), d.tokens.begin(), d.tokens.end());
    // Without guesses the step is a plain decode step: one row, nothing to cut.
    verify.all_logits = verify.checkpoint = L > 0;
    const ForwardRows res = stage.forward_rows(seq, rows, verify);
    ++r.stats.verifies;
    r.stats.drafted += int64_t(L);
    // Decide the block's tokens: accepted guesses, then the target's own.
    size_t a = 0;
    int32_t next = -1;
    for (; a <= L; ++a) {
      const std::span<const float> row = res.out.subspan(a * size_t(n_vocab), size_t(n_vocab));
      if (a == L) {
        next = sampler.sample(row);
        break;
      }
      const int32_t guess = d.tokens[a];
      if (temperature <= 0) {
        next = sampler.sample(row);  // the pick, with the penalties of the tokens kept so far
        if (next != guess) break;
        continue;
      }
      const std::span<const Sampler::Candidate> p = sampler.distribution(row);
      double q_d = 1;
      const float* qp = nullptr;
      if (!d.logits.empty()) {
        const float* dl = d.logits.data() + a * size_t(n_vocab);
        q.resize(size_t(n_vocab));
        const float mx = *std::max_element(dl, dl + n_vocab);
        double sum = 0;
        for (int64_t i = 0; i < n_vocab; ++i) sum += (q[size_t(i)] = std::exp((dl[i] - mx) / temperature));
        for (float& v : q) v = float(v / sum);
        qp = q.data();
        q_d = q[size_t(guess)];
      }
      bool kept = false;
      const double u_accept = sampler.uniform(), u_draw = sampler.uniform();
      next = verify_sampled(p, guess, q_d, qp, u_accept, u_draw, &kept);
      sampler.accept(next);
      if (!kept) break;
    }
    r.stats.accepted += int64_t(a);
    if (o.pacer) {
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (L > 0) {
        o.pacer->drafted(int64_t(a) + 1, dt);
      } else {
        o.pacer->plain(dt);
      }
    }
    // Hand the tokens out; generation may end inside the block. The KV keeps
    // the rows before the block's last decided token, as plain decoding does.
    size_t j = 0;
    bool more = true;
    for (; j <= a && more; ++j) more = out.take(j < a ? d.tokens[j] : next);
    const size_t keep = j;  // rows [bonus, d_0 .. d_{j-2}] fed the tokens handed out
    stage.truncate_seq(seq, n + int64_t(keep));
    const size_t width = res.hidden.size() / rows.size();
    source.committed(std::span<const int32_t>(rows.data(), keep), n, res.hidden.subspan(0, keep * width));
    if (!more) return r;
    bonus = next;
  }
}

}  // namespace baton
