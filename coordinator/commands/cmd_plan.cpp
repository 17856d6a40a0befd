// `baton plan [-m] MODEL --nodes [NAME=]SIZE[:unified|:discrete],... --ctx N [--tp N] [--json]`:
// the memory plan of every node of a pipeline, from the file's header alone,
// and whether it fits. Exit 0 when it fits, 2 when it does not (with what
// would fit), 1 for bad input. With --tp N each stage runs on N ranks: every
// rank is planned from the header its rank file would have (the cuts of
// engine/tp/slice.h, written by gguf_split's own writer with the data left a
// hole), so its weights, KV and workspace are the loader's own numbers.
#include <boost/program_options.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "engine/dspark/dspark_weights.h"
#include "coordinator/commands/commands.h"
#include "coordinator/cluster/placement.h"
#include "coordinator/commands/plan_deploy.h"
#include "engine/base/command_error.h"
#include "engine/base/command_line.h"
#include "engine/model/files.h"
#include "engine/plan/node_plan.h"
#include "engine/model/layer_range_text.h"
#include "gguf_split/split.h"

namespace baton {
namespace {

namespace po = boost::program_options;
using Json = nlohmann::ordered_json;

constexpr const char* kHelpTail = R"(
Nodes: [NAME=]SIZE[:unified|:discrete][:cpu|:cuda][:reserve=SIZE][:bw=SIZE],
comma separated, in pipeline order (the first holds the embedding, the last used
one the output head; a node may be left empty). A node without NAME= is named by
its place: node0, node1, ...
  SIZE      bytes with a unit: B, KB, MB, GB, TB (powers of 1000) or KiB, MiB,
            GiB, TiB (powers of 1024), e.g. 96GB, 97887MiB, 128GiB.
  unified   memory shared with the OS (GB10 / DGX Spark): the plan keeps back a
            reserve (default 8 GiB, or --reserve, or :reserve=SIZE).
  discrete  a GPU's own memory (the default); no reserve unless :reserve=SIZE.
  cuda|cpu  the backend (default cuda): cuda adds the CUDA context (600 MiB,
            measured) to the plan.
  bw=SIZE   memory bandwidth per second, for balancing stages (default 273GB
            unified, 1792GB discrete, 100GB cpu).

Plan lines per node: weights (exact tensor bytes, aligned), kv cache (the
requested context), workspace (the forward's scratch at max(micro-batch,
chunk) rows), link buffers (boundary activations in/out, double-buffered),
backend (fixed overhead), optional caches; then the margin left and the
largest context that node's stage could hold.

Placement keeps every stage inside its node, makes the slowest stage (weight
bytes over bandwidth) as fast as possible, then balances context headroom.
When nothing fits it shows the closest placement, what each node lacks, the
largest context that fits and how many nodes the requested context needs.
Only the header is read: planning a 150 GiB file takes well under a second.

When it fits, the output ends with the `baton split` command that cuts the
model at these stages (into --split-dir) and a config (configs/*.toml, see
docs/CONFIG.md) that runs a local worker per part with each node's memory as
its cap; --json has both as "split_command" and "config".

Tensor parallelism (--tp N): each node of --nodes is the device of one rank,
and every stage runs on N such devices. Each rank is planned from the header
of the rank file `baton split --tp N` would write (its slices of the weights,
the KV of its heads, its workspace); placement uses rank 0 (the largest
vocabulary slice), and every rank's lines are printed under its stage.

Exit status: 0 fits, 2 does not fit, 1 bad input.

Examples:
  baton plan flash-q2.gguf --nodes rtx=97887MiB --ctx 393216
  baton plan -m flash-q2.gguf --nodes 97887MiB --ctx 393216
  baton plan flash-q4.gguf --nodes spark1=128GB:unified,spark2=128GB:unified --ctx 131072
)";

Json plan_json(const MemoryPlan& p) {
  Json lines = Json::array();
  for (const auto& l : p.lines()) lines.push_back({{"name", l.name()}, {"bytes", l.bytes}, {"detail", l.detail}});
  return lines;
}

// The context to quote for a capacity: at most the trained length unless the
// request asks for more (a model degrades past it; the memory figure is
// shown beside it).
int64_t quoted_ctx(int64_t capacity, int64_t trained, int64_t requested) {
  return trained > 0 && requested <= trained ? std::min(capacity, trained) : capacity;
}

std::string capacity_text(int64_t capacity, int64_t trained, int64_t requested) {
  const int64_t q = quoted_ctx(capacity, trained, requested);
  if (q == capacity) return fmt::format("{} tokens", capacity);
  return fmt::format("{} tokens (the model's trained length; the memory would hold {})", q, capacity);
}

void print_stage(const StagePlacement& s, const NodeSpec& n, int64_t trained, int64_t requested) {
  std::printf("node %s: %s %s, %s, %.0f GB/s: ", n.name.c_str(), format_size(n.memory_bytes).c_str(), n.kind().c_str(),
              backend_name(n.backend), n.effective_bandwidth() / 1e9);
  if (!s.used()) {
    std::printf("unused\n\n");
    return;
  }
  std::printf("layers %s%s%s\n", layer_range_text(s.layers).c_str(), s.embedding ? " + embedding" : "",
              s.head ? " + head" : "");
  auto row = [](const char* name, uint64_t b, const std::string& detail) {
    std::printf("  %-16s %16llu B %12s", name, static_cast<unsigned long long>(b), format_size(b).c_str());
    if (!detail.empty()) std::printf("  (%s)", detail.c_str());
    std::printf("\n");
  };
  for (const auto& l : s.plan.lines()) row(l.name(), l.bytes, l.detail);
  row("total", s.plan.total(), "");
  row("usable", s.usable,
      n.reserve() ? fmt::format("{} less {} reserve", format_size(n.memory_bytes), format_size(n.reserve())) : "");
  if (s.margin >= 0) {
    row("margin", uint64_t(s.margin), "");
  } else {
    std::printf("  %-16s %16lld B %12s  (does not fit)\n", "margin", static_cast<long long>(s.margin),
                ("-" + format_size(uint64_t(-s.margin))).c_str());
  }
  std::printf("  %-16s %s%s\n\n", "context capacity", capacity_text(s.ctx_capacity, trained, requested).c_str(),
              s.ctx_capacity == 0 ? " (not even one)" : "");
}

// `baton split --tp N` of the placed stages (--layers only for several).
std::string tp_split_command(const std::string& model, const Placement& p, const std::string& out_dir, int tp) {
  std::string ranges;
  int used = 0;
  for (const StagePlacement& s : p.stages) {
    if (!s.used()) continue;
    ranges += (ranges.empty() ? "" : ",") + layer_range_text(s.layers);
    ++used;
  }
  return fmt::format("baton split {} --tp {}{} -o {}", shell_word(model), tp, used > 1 ? " --layers " + ranges : "",
                     shell_word(out_dir));
}

// The N rank files' headers (`baton split --tp N` of the whole model, tensor
// data a sparse hole) in a temporary folder, removed when done.
class RankHeaders {
 public:
  RankHeaders(const ModelFiles& model, int n) {
    std::string templ = (std::filesystem::temp_directory_path() / "baton-plan-tp-XXXXXX").string();
    if (!mkdtemp(templ.data())) throw std::system_error(errno, std::generic_category(), "mkdtemp " + templ);
    dir_ = templ;
    const int n_layer = model_layer_count(model.meta());
    const TpSplitPlan plan = plan_tp_split(model, parse_layer_ranges("0:output", n_layer), n, dir_, "rank");
    write_tp_rank_headers(model, plan);
    for (const TpRankFile& f : plan.files) files_.push_back(std::make_unique<GgufFile>(GgufFile::open(f.path)));
    for (const auto& f : files_) planners_.push_back(std::make_unique<ModelPlanner>(*f));
  }
  ~RankHeaders() {
    planners_.clear();
    files_.clear();
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  RankHeaders(const RankHeaders&) = delete;
  RankHeaders& operator=(const RankHeaders&) = delete;

  int size() const { return int(planners_.size()); }
  const ModelPlanner& rank(int r) const { return *planners_[size_t(r)]; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<GgufFile>> files_;
  std::vector<std::unique_ptr<ModelPlanner>> planners_;
};

// Each rank's plan of a placed stage (rank 0's is the stage's own plan).
std::vector<MemoryPlan> rank_plans(const RankHeaders& ranks, const PlacementRequest& req, const StagePlacement& s,
                                   const NodeSpec& n) {
  std::vector<MemoryPlan> out;
  const StageRequest r = req.stage(s.layers, s.embedding, s.head, n.backend, req.n_ctx);
  for (int k = 0; k < ranks.size(); ++k) out.push_back(ranks.rank(k).plan(r));
  return out;
}

void print_ranks(const std::vector<MemoryPlan>& plans, uint64_t usable) {
  for (size_t k = 0; k < plans.size(); ++k) {
    std::printf("  tp rank %zu of %zu:\n", k, plans.size());
    for (const auto& l : plans[k].lines()) {
      std::printf("    %-14s %16llu B %12s\n", l.name(), static_cast<unsigned long long>(l.bytes),
                  format_size(l.bytes).c_str());
    }
    const int64_t margin = int64_t(usable) - int64_t(plans[k].total());
    std::printf("    %-14s %16llu B %12s  (margin %s%s)\n", "total", static_cast<unsigned long long>(plans[k].total()),
                format_size(plans[k].total()).c_str(), margin < 0 ? "-" : "",
                format_size(uint64_t(margin < 0 ? -margin : margin)).c_str());
  }
  std::printf("\n");
}

}  // namespace

int cmd_plan(int argc, char** argv) {
  std::string model, nodes_text, reserve_text, caches_text = "0", kv = "f32", split_dir = "parts", draft;
  PlacementRequest req;
  uint64_t staging_mb = req.staging_slot_bytes >> 20;
  int tp = 1;
  po::options_description opts(
      "usage: baton plan [-m] MODEL --nodes [NAME=]SIZE[:unified|:discrete],... --ctx N [options]\n\n"
      "Computes the exact memory plan of every node of a pipeline before anything is\n"
      "loaded, places contiguous layer ranges on the nodes, and says whether it fits.\n\n"
      "options");
  opts.add_options()
      ("help,h", "show this help")
      ("model,m", po::value(&model), "the GGUF file (or the first shard of a set); also taken positionally")
      ("nodes", po::value(&nodes_text), "the nodes, in pipeline order (see below)")
      ("ctx", po::value(&req.n_ctx), "context length to plan for, in tokens per sequence")
      ("micro-batch", po::value(&req.micro_batch)->default_value(req.micro_batch), "tokens per decode step")
      ("chunk", po::value(&req.prefill_chunk)->default_value(req.prefill_chunk),
       "tokens per prefill forward (the workspace holds max(micro-batch, chunk) rows)")
      ("seqs", po::value(&req.n_seq)->default_value(req.n_seq), "sequences with their own KV cache")
      ("threads", po::value(&req.n_threads)->default_value(req.n_threads), "CPU threads (per-thread scratch)")
      ("reserve", po::value(&reserve_text), "reserve of unified nodes that name none (default 8GiB)")
      ("optional-caches", po::value(&caches_text), "bytes of optional caches per stage (repacked weights...)")
      ("staging-mb", po::value(&staging_mb)->default_value(staging_mb),
       "MiB of each of the loader's 4 staging buffers, as the workers' --staging-mb (the ring counts on "
       "unified cuda nodes)")
      ("kv", po::value(&kv)->default_value(kv),
       "deepseek4 KV storage: f32 (rows as float, the published engine's) or packed (FP8 + bf16 rope dims, FP4 "
       "indexer)")
      ("split-dir", po::value(&split_dir)->default_value(split_dir),
       "the folder the printed split command writes the parts to, and the config names them in")
      ("tp", po::value(&tp)->default_value(tp),
       "tensor-parallel ranks per stage: each node is one rank's device; plans every rank (see below)")
      ("draft", po::value(&draft),
       "deepseek4: the DSpark drafter's sidecar GGUF, planned as the head stage's \"drafter\" line (default: "
       "the model file's own mtp.* drafter, if any)")
      ("json", "print one JSON object instead of tables");
  po::positional_options_description positional;
  positional.add("model", 1);
  const auto parsed =
      parse_command_line(argc, argv, {.options = opts, .help_tail = kHelpTail, .positional = &positional});
  if (!parsed) return 0;
  const po::variables_map& vm = *parsed;
  if (model.empty() || nodes_text.empty() || !vm.count("ctx")) {
    std::fprintf(stderr, "baton plan: MODEL, --nodes and --ctx are required (see baton plan --help)\n");
    return 1;
  }
  const bool json = vm.count("json") > 0;
  std::vector<NodeSpec> nodes;
  Placement p;
  if (kv == "f32") {
    req.ds4_kv = Ds4KvStorage::F32;
  } else if (kv == "packed") {
    req.ds4_kv = Ds4KvStorage::Packed;
  } else {
    throw std::invalid_argument("--kv must be f32 or packed, not '" + kv + "'");
  }
  nodes = parse_nodes(nodes_text);
  if (!reserve_text.empty()) {
    const uint64_t reserve = parse_size(reserve_text);
    for (NodeSpec& n : nodes) {
      if (n.unified && !n.reserve_bytes) n.reserve_bytes = reserve;
    }
  }
  req.optional_caches = parse_size(caches_text);
  if (staging_mb < 1 || staging_mb > 4096) throw std::invalid_argument("--staging-mb must be in 1..4096");
  req.staging_slot_bytes = staging_mb << 20;
  if (tp < 1 || tp > 64) throw std::invalid_argument("--tp must be in 1..64");
  if (parse_only()) return 0;
  // One file or a llama.cpp shard set.
  const ModelFiles files = about_file(model, [&] { return ModelFiles::open(model); });
  if (auto d = about_file(model, [&] { return dspark_plan(files.meta(), draft); })) {
    req.drafter_bytes = d->total();
    req.drafter_detail = d->detail;
  }
  std::unique_ptr<RankHeaders> ranks;
  if (tp > 1) ranks = std::make_unique<RankHeaders>(files, tp);
  std::unique_ptr<ModelPlanner> whole;
  if (!ranks) whole = std::make_unique<ModelPlanner>(files);
  const ModelPlanner& planner = ranks ? ranks->rank(0) : *whole;
  p = place_layers(planner, nodes, req);

  if (json) {
    Json stages = Json::array();
    for (const StagePlacement& s : p.stages) {
      const NodeSpec& n = nodes[s.node];
      Json j = {{"node", n.name},          {"memory_bytes", n.memory_bytes}, {"unified", n.unified},
                {"reserve_bytes", n.reserve()}, {"usable_bytes", s.usable},  {"backend", backend_name(n.backend)},
                {"bandwidth", n.effective_bandwidth()}, {"used", s.used()}};
      if (s.used()) {
        j["layers"] = layer_range_text(s.layers);
        j["first_layer"] = s.layers.first;
        j["last_layer"] = s.layers.last;
        j["embedding"] = s.embedding;
        j["head"] = s.head;
        j["lines"] = plan_json(s.plan);
        j["total_bytes"] = s.plan.total();
        j["margin_bytes"] = s.margin;
        j["ctx_capacity"] = s.ctx_capacity;
        j["seconds_per_pass"] = s.seconds;
        if (ranks) {
          Json rj = Json::array();
          const std::vector<MemoryPlan> plans = rank_plans(*ranks, req, s, n);
          for (size_t k = 0; k < plans.size(); ++k) {
            rj.push_back({{"rank", k},
                          {"lines", plan_json(plans[k])},
                          {"total_bytes", plans[k].total()},
                          {"margin_bytes", int64_t(s.usable) - int64_t(plans[k].total())}});
          }
          j["ranks"] = std::move(rj);
        }
      }
      stages.push_back(std::move(j));
    }
    Json out = {{"model", model},
                {"arch", planner.arch_name()},
                {"n_layer", planner.n_layer()},
                {"n_ctx_train", planner.n_ctx_train()},
                {"tensor_bytes", planner.tensor_bytes()},
                {"ctx", req.n_ctx},
                {"micro_batch", req.micro_batch},
                {"prefill_chunk", req.prefill_chunk},
                {"n_seq", req.n_seq},
                {"tp", tp},
                {"fits", p.fits},
                {"stages", std::move(stages)}};
    if (p.fits) {
      out["ctx_capacity"] = p.ctx_capacity;  // what the memory holds
      out["ctx_usable"] = quoted_ctx(p.ctx_capacity, planner.n_ctx_train(), req.n_ctx);
      out["split_command"] = ranks ? tp_split_command(model, p, split_dir, tp) : split_command(model, p, split_dir);
      if (!ranks) out["config"] = config_stanza(model, p, nodes, req, split_dir);
    } else {
      out["reason"] = p.reason;
      out["max_ctx"] = p.max_ctx;
      out["nodes_needed"] = p.nodes_needed;
      out["suggestion"] = p.suggestion;
    }
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("model: %s\n  %s\n  %s of tensors\n", model.c_str(), planner.describe().c_str(),
                format_size(planner.tensor_bytes()).c_str());
    std::printf("request: ctx %lld, micro-batch %lld, prefill chunk %lld, %d sequence%s, %d thread%s\n",
                static_cast<long long>(req.n_ctx), static_cast<long long>(req.micro_batch),
                static_cast<long long>(req.prefill_chunk), req.n_seq, req.n_seq > 1 ? "s" : "", req.n_threads,
                req.n_threads > 1 ? "s" : "");
    if (req.n_ctx > planner.n_ctx_train()) {
      std::printf("note: ctx %lld is beyond the model's trained context of %lld\n", static_cast<long long>(req.n_ctx),
                  static_cast<long long>(planner.n_ctx_train()));
    }
    std::printf("\n");
    if (ranks) std::printf("tensor parallel: %d ranks a stage; each node is one rank's device (rank 0 shown)\n\n", tp);
    for (const StagePlacement& s : p.stages) {
      print_stage(s, nodes[s.node], planner.n_ctx_train(), req.n_ctx);
      if (ranks && s.used()) print_ranks(rank_plans(*ranks, req, s, nodes[s.node]), s.usable);
    }
    if (p.fits && ranks) {
      std::printf("fits: context capacity %s, set by the tightest stage\n",
                  capacity_text(p.ctx_capacity, planner.n_ctx_train(), req.n_ctx).c_str());
      std::printf("\nthe rank files of these stages:\n%s\n", tp_split_command(model, p, split_dir, tp).c_str());
    } else if (p.fits) {
      std::printf("fits: context capacity %s, set by the tightest stage\n",
                  capacity_text(p.ctx_capacity, planner.n_ctx_train(), req.n_ctx).c_str());
      const std::string split = split_command(model, p, split_dir);
      if (!split.empty()) std::printf("\nsplit it at these stages:\n%s\n", split.c_str());
      std::printf("\nconfig for %s, then baton serve --config FILE):\n%s",
                  split.empty() ? "this stage (save it" : ("these stages (save it beside " + split_dir + "/").c_str(),
                  config_stanza(model, p, nodes, req, split_dir).c_str());
    } else {
      std::printf("does not fit: %s\nwhat would fit: %s\n", p.reason.c_str(), p.suggestion.c_str());
    }
  }
  return p.fits ? 0 : kExitRefused;
}

}  // namespace baton
