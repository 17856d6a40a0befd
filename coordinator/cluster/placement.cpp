#include "coordinator/cluster/placement.h"
#include "engine/model/layer_range_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>

namespace baton {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// The context step over which a stage's per-token cost is measured: a
// multiple of every compression ratio, so the rounding of compressed rows
// does not distort the slope.
constexpr int64_t kSlopeStep = 1 << 17;
// Stage capacities are searched up to this context.
constexpr int64_t kMaxCtx = int64_t(1) << 30;

// Evaluates stages "node i holds layers [a, b)" at one context, with memos
// per node kind (backend, unified).
class Placer {
 public:
  Placer(const ModelPlanner& m, const std::vector<NodeSpec>& nodes, const PlacementRequest& r, int64_t n_ctx)
      : m_(m), nodes_(nodes), r_(r), ctx_(n_ctx), L_(m.n_layer()), N_(int(nodes.size())) {}

  int layers() const { return L_; }
  int nodes() const { return N_; }

  StageRequest request(int i, int a, int b, int64_t ctx) const {
    StageRequest s = r_.stage({a, b - 1}, a == 0, b == L_, nodes_[size_t(i)].backend, ctx);
    s.unified = nodes_[size_t(i)].unified;
    return s;
  }

  // The plan depends on the node only through its backend and kind.
  static int kind(const NodeSpec& n) { return int(n.backend) * 2 + (n.unified ? 1 : 0); }

  uint64_t total(int i, int a, int b) {
    const auto key = std::make_tuple(kind(nodes_[size_t(i)]), a, b);
    auto it = total_.find(key);
    if (it == total_.end()) it = total_.emplace(key, m_.bytes(request(i, a, b, ctx_)).total()).first;
    return it->second;
  }
  bool fits(int i, int a, int b) { return total(i, a, b) <= nodes_[size_t(i)].usable_bytes(); }
  // A decode step reads every weight of the stage once, except the embedding
  // table, of which it reads one row per token.
  double seconds(int i, int a, int b) {
    return double(m_.weight_bytes({a, b - 1}, false, b == L_)) / nodes_[size_t(i)].effective_bandwidth();
  }
  // Spare bytes over the bytes one more token costs: how many more tokens of
  // context this stage could take.
  double spare_tokens(int i, int a, int b) {
    const auto key = std::make_tuple(kind(nodes_[size_t(i)]), a, b);
    auto it = slope_.find(key);
    if (it == slope_.end()) {
      const uint64_t more = m_.bytes(request(i, a, b, ctx_ + kSlopeStep)).total();
      it = slope_.emplace(key, double(more - total(i, a, b)) / double(kSlopeStep)).first;
    }
    const double spare = double(nodes_[size_t(i)].usable_bytes()) - double(total(i, a, b));
    return it->second > 0 ? spare / it->second : kInf;
  }
  double deficit(int i, int a, int b) {
    return double(total(i, a, b)) - double(nodes_[size_t(i)].usable_bytes());
  }

  // A DP over (node, first layer not yet placed): cost(i, a, b) of node i
  // holding [a, b) (a == b: empty, never called), combined along a pipeline
  // by `join` and compared by `better`. Returns the cut points (N + 1 of
  // them) of the best complete placement, or nothing.
  template <class Cost, class Join, class Better>
  std::optional<std::vector<int>> solve(double start, double none, Cost cost, Join join, Better better) {
    const int L = L_, N = N_;
    std::vector<std::vector<double>> best(size_t(N + 1), std::vector<double>(size_t(L + 1), none));
    std::vector<std::vector<int>> from(size_t(N + 1), std::vector<int>(size_t(L + 1), -1));
    best[0][0] = start;
    for (int i = 0; i < N; ++i) {
      for (int b = 0; b <= L; ++b) {
        for (int a = 0; a <= b; ++a) {
          if (from[size_t(i)][size_t(a)] < 0 && !(i == 0 && a == 0)) continue;  // prefix unreachable
          double c = 0;
          if (a < b) {
            std::optional<double> v = cost(i, a, b);
            if (!v) continue;
            c = *v;
          }
          const double value = a < b ? join(best[size_t(i)][size_t(a)], c) : best[size_t(i)][size_t(a)];
          if (from[size_t(i + 1)][size_t(b)] < 0 || better(value, best[size_t(i + 1)][size_t(b)])) {
            best[size_t(i + 1)][size_t(b)] = value;
            from[size_t(i + 1)][size_t(b)] = a;
          }
        }
      }
    }
    if (from[size_t(N)][size_t(L)] < 0) return std::nullopt;
    std::vector<int> cuts(size_t(N + 1));
    cuts[size_t(N)] = L;
    for (int i = N; i > 0; --i) cuts[size_t(i - 1)] = from[size_t(i)][size_t(cuts[size_t(i)])];
    return cuts;
  }

  // Fastest placement (smallest slowest stage) of fitting stages.
  std::optional<std::vector<int>> fastest(double* slowest = nullptr) {
    auto cuts = solve(
        0.0, kInf,
        [&](int i, int a, int b) -> std::optional<double> {
          if (!fits(i, a, b)) return std::nullopt;
          return seconds(i, a, b);
        },
        [](double x, double y) { return std::max(x, y); }, [](double x, double y) { return x < y; });
    if (cuts && slowest) {
      *slowest = 0;
      for (int i = 0; i < N_; ++i) {
        if (cuts->at(size_t(i)) < cuts->at(size_t(i + 1))) {
          *slowest = std::max(*slowest, seconds(i, cuts->at(size_t(i)), cuts->at(size_t(i + 1))));
        }
      }
    }
    return cuts;
  }

  // Within the time limit, the placement whose tightest stage has the most
  // spare context.
  std::optional<std::vector<int>> balanced(double time_limit) {
    return solve(
        kInf, -kInf,
        [&](int i, int a, int b) -> std::optional<double> {
          if (!fits(i, a, b) || seconds(i, a, b) > time_limit) return std::nullopt;
          return spare_tokens(i, a, b);
        },
        [](double x, double y) { return std::min(x, y); }, [](double x, double y) { return x > y; });
  }

  // The placement whose largest shortfall is smallest (nothing need fit).
  std::vector<int> closest() {
    return *solve(
        -kInf, kInf, [&](int i, int a, int b) -> std::optional<double> { return deficit(i, a, b); },
        [](double x, double y) { return std::max(x, y); }, [](double x, double y) { return x < y; });
  }

 private:
  const ModelPlanner& m_;
  const std::vector<NodeSpec>& nodes_;
  const PlacementRequest& r_;
  int64_t ctx_;
  int L_, N_;
  std::map<std::tuple<int, int, int>, uint64_t> total_;
  std::map<std::tuple<int, int, int>, double> slope_;
};

bool feasible(const ModelPlanner& m, const std::vector<NodeSpec>& nodes, const PlacementRequest& r, int64_t ctx) {
  return Placer(m, nodes, r, ctx).fastest().has_value();
}

// The largest context in [lo, hi] for which ok(ctx) holds, given ok is
// monotone (true up to some point); 0 when ok(lo) is false.
template <class Ok>
int64_t largest(int64_t lo, int64_t hi, Ok ok) {
  if (hi < lo || !ok(lo)) return 0;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (ok(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

std::string node_text(const NodeSpec& n) {
  return fmt::format("{} ({} {}, {} usable)", n.name, format_size(n.memory_bytes), n.kind(),
                     format_size(n.usable_bytes()));
}

std::string plan_summary(const MemoryPlan& p) {
  std::string out;
  for (const auto& l : p.lines()) {
    if (l.bytes == 0) continue;
    out += (out.empty() ? "" : ", ") + std::string(l.name()) + " " + format_size(l.bytes);
  }
  return out;
}

std::string layers_text(const StagePlacement& s) {
  return fmt::format("layers {}{}{}", layer_range_text(s.layers), s.embedding ? " + embedding" : "",
                     s.head ? " + head" : "");
}

}  // namespace

StageRequest PlacementRequest::stage(LayerRange layers, bool embedding, bool head, Backend backend,
                                     int64_t ctx) const {
  StageRequest s;
  s.layers = layers;
  s.embedding = embedding;
  s.head = head;
  s.n_ctx = ctx;
  s.micro_batch = micro_batch;
  s.prefill_chunk = prefill_chunk;
  s.n_seq = n_seq;
  s.backend = backend;
  s.n_threads = n_threads;
  s.optional_caches = optional_caches;
  s.ds4_kv = ds4_kv;
  s.staging_slot_bytes = staging_slot_bytes;
  s.drafter_bytes = drafter_bytes;
  s.drafter_detail = drafter_detail;
  return s;
}

Placement place_layers(const ModelPlanner& m, const std::vector<NodeSpec>& nodes, const PlacementRequest& r) {
  if (nodes.empty()) throw std::invalid_argument("placement: no nodes");
  if (r.n_ctx < 1 || r.n_ctx > kMaxCtx) {
    throw std::invalid_argument(fmt::format("placement: context {} is outside 1..{}", r.n_ctx, kMaxCtx));
  }
  // Checks the request's other numbers once, with a clear message.
  m.bytes(r.stage({0, 0}, true, m.n_layer() == 1, Backend::Cpu, r.n_ctx));

  Placer placer(m, nodes, r, r.n_ctx);
  Placement out;
  double slowest = 0;
  std::optional<std::vector<int>> cuts = placer.fastest(&slowest);
  out.fits = cuts.has_value();
  if (out.fits) {
    // The fastest placement is within the limit, so this finds one.
    if (auto balanced = placer.balanced(slowest * (1 + kTimeSlack) * (1 + 1e-12))) cuts = std::move(balanced);
  } else {
    cuts = placer.closest();
  }
  out.ctx_capacity = out.fits ? kMaxCtx : 0;
  for (int i = 0; i < placer.nodes(); ++i) {
    const int a = cuts->at(size_t(i)), b = cuts->at(size_t(i + 1));
    StagePlacement s;
    s.node = size_t(i);
    s.usable = nodes[size_t(i)].usable_bytes();
    s.layers = {a, b - 1};
    if (a < b) {
      const StageRequest req = placer.request(i, a, b, r.n_ctx);
      s.embedding = req.embedding;
      s.head = req.head;
      s.plan = m.plan(req);
      s.margin = int64_t(s.usable) - int64_t(s.plan.total());
      s.seconds = placer.seconds(i, a, b);
      s.ctx_capacity = largest(1, kMaxCtx, [&](int64_t ctx) {
        return m.bytes(placer.request(i, a, b, ctx)).total() <= s.usable;
      });
      out.ctx_capacity = std::min(out.ctx_capacity, s.ctx_capacity);
    } else {
      s.margin = int64_t(s.usable);
    }
    out.stages.push_back(std::move(s));
  }
  if (out.fits) return out;

  // Why: every stage of the closest placement that is short.
  for (const StagePlacement& s : out.stages) {
    if (!s.used() || s.margin >= 0) continue;
    out.reason += fmt::format("{}node {}: {} need {} ({}), short by {}", out.reason.empty() ? "" : "; ",
                              node_text(nodes[s.node]), layers_text(s), format_size(s.plan.total()),
                              plan_summary(s.plan), format_size(uint64_t(-s.margin)));
  }
  // What would fit: a smaller context on these nodes...
  out.max_ctx = largest(1, r.n_ctx - 1, [&](int64_t ctx) { return feasible(m, nodes, r, ctx); });
  // ...or more nodes like the largest one.
  const NodeSpec& big = *std::max_element(nodes.begin(), nodes.end(), [](const NodeSpec& x, const NodeSpec& y) {
    return x.usable_bytes() < y.usable_bytes();
  });
  auto with = [&](int n) {
    std::vector<NodeSpec> more = nodes;
    for (int k = int(nodes.size()); k < n; ++k) {
      more.push_back(big);
      more.back().name = fmt::format("{}-{}", big.name, k + 1);
    }
    return more;
  };
  const int have = int(nodes.size());
  if (have < kMaxNodesSearched && feasible(m, with(kMaxNodesSearched), r, r.n_ctx)) {
    int lo = have + 1, hi = kMaxNodesSearched;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (feasible(m, with(mid), r, r.n_ctx)) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    out.nodes_needed = lo;
  }
  if (out.max_ctx > 0) {
    out.suggestion = fmt::format("the largest context that fits these nodes is {} tokens (--ctx {})", out.max_ctx,
                                 out.max_ctx);
  } else {
    uint64_t usable = 0;
    for (const NodeSpec& n : nodes) usable += n.usable_bytes();
    out.suggestion = fmt::format("no context fits these nodes: the weights alone are {}, the nodes have {} usable",
                                 format_size(m.weight_bytes({0, m.n_layer() - 1}, true, true)), format_size(usable));
  }
  if (out.nodes_needed > 0) {
    out.suggestion += fmt::format("; context {} needs {} nodes like {}", r.n_ctx, out.nodes_needed, node_text(big));
  } else {
    out.suggestion += fmt::format("; context {} does not fit even {} nodes like {}", r.n_ctx, kMaxNodesSearched,
                                  node_text(big));
  }
  return out;
}

std::vector<NodeSpec> parse_nodes(std::string_view text) {
  std::vector<NodeSpec> out;
  std::set<std::string> names;
  auto split = [](std::string_view s, char sep) {
    std::vector<std::string_view> parts;
    for (size_t start = 0;;) {
      const size_t p = s.find(sep, start);
      parts.push_back(s.substr(start, p == std::string_view::npos ? std::string_view::npos : p - start));
      if (p == std::string_view::npos) return parts;
      start = p + 1;
    }
  };
  for (std::string_view item : split(text, ',')) {
    auto fail = [&](const std::string& why) {
      throw std::invalid_argument(fmt::format("bad node '{}': {} ([NAME=]SIZE[:unified|:discrete][:cpu|:cuda]"
                                              "[:reserve=SIZE][:bw=SIZE])",
                                              item, why));
    };
    // A bare SIZE[:...] (no '=' before the first ':') names the node by its
    // place in the pipeline: node0, node1, ...
    const size_t eq = item.find('=');
    const bool named = eq != std::string_view::npos && eq < item.find(':');
    if (named && eq == 0) fail("empty NAME");
    NodeSpec n;
    n.name = named ? std::string(item.substr(0, eq)) : "node" + std::to_string(out.size());
    n.named = named;
    if (!names.insert(n.name).second) fail("the name is used twice");
    std::vector<std::string_view> fields = split(named ? item.substr(eq + 1) : item, ':');
    n.memory_bytes = parse_size(fields[0]);
    if (n.memory_bytes == 0) fail("no memory");
    for (size_t k = 1; k < fields.size(); ++k) {
      const std::string_view f = fields[k];
      if (f == "unified") {
        n.unified = true;
      } else if (f == "discrete") {
        n.unified = false;
      } else if (f == "cpu") {
        n.backend = Backend::Cpu;
      } else if (f == "cuda") {
        n.backend = Backend::Cuda;
      } else if (f.rfind("reserve=", 0) == 0) {
        n.reserve_bytes = parse_size(f.substr(8));
      } else if (f.rfind("bw=", 0) == 0) {
        n.bandwidth = double(parse_size(f.substr(3)));
        if (n.bandwidth <= 0) fail("bandwidth must be positive");
      } else {
        fail(fmt::format("unknown field '{}'", f));
      }
    }
    out.push_back(std::move(n));
  }
  return out;
}

}  // namespace baton
