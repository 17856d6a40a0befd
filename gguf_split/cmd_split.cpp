// `baton split` and `baton merge`: per-node GGUF files by layer range.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <boost/program_options.hpp>

#include "gguf_split/commands.h"
#include "gguf_split/split.h"
#include "gguf_split/stale_temps.h"
#include "engine/base/command_line.h"
#include "engine/base/progress_line.h"
#include "engine/model/layer_range_text.h"

namespace po = boost::program_options;

namespace baton {

std::string human_bytes(uint64_t b) {
  char buf[32];
  const double g = double(b) / (1ull << 30), m = double(b) / (1ull << 20);
  if (g >= 1) std::snprintf(buf, sizeof buf, "%.2f GiB", g);
  else std::snprintf(buf, sizeof buf, "%.2f MiB", m);
  return buf;
}

Progress progress_printer(const char* verb) {
  // The clock starts at the first report, so checks done before the copy
  // (merge verifies every part first) do not skew the rate.
  std::optional<std::chrono::steady_clock::time_point> start;
  std::chrono::steady_clock::time_point last;
  return [=](uint64_t done, uint64_t total) mutable {
    auto now = std::chrono::steady_clock::now();
    if (!start) {
      start = now;
      last = now - std::chrono::seconds(1);
    }
    if (done != total && now - last < std::chrono::milliseconds(500)) return;
    last = now;
    const double secs = std::chrono::duration<double>(now - *start).count();
    const double rate = secs > 0 ? double(done) / secs : 0;
    const double eta = rate > 0 ? double(total - done) / rate : 0;
    char line[160];
    std::snprintf(line, sizeof line, "%s %s of %s (%.2f GB/s, ETA %.0f s)", verb, human_bytes(done).c_str(),
                  human_bytes(total).c_str(), rate / 1e9, eta);
    print_progress_line(line, done == total);
  };
}

namespace {

// `baton split --tp N`: stages x ranks files.
// rank >= 0: only that rank's files (of every stage).
int split_tp(const ModelFiles& files, const std::string& model, const std::string& layers, int tp, int rank,
             const std::string& out_dir, bool dry) {
  const int n_layer = model_layer_count(files.meta());
  const std::string stem = std::filesystem::path(model).stem().string();
  TpSplitPlan plan = plan_tp_split(files, parse_layer_ranges(layers, n_layer), tp, out_dir.empty() ? "." : out_dir, stem);
  if (rank >= 0) std::erase_if(plan.files, [&](const TpRankFile& f) { return f.rank != rank; });
  std::printf("source %s: %d layers, %zu tensors, %s, tensor-table hash %016llx; %d tensor-parallel ranks\n",
              model.c_str(), n_layer, files.tensors().size(), human_bytes(files.tensor_bytes()).c_str(),
              (unsigned long long)plan.stages.source_hash, tp);
  for (const TpRankFile& f : plan.files) {
    const SplitPart& p = plan.stages.parts[size_t(f.part)];
    std::printf("part %d/%zu rank %d/%d  layers %s%s%s  %zu tensors  %s  -> %s\n", p.index + 1, plan.stages.parts.size(),
                f.rank, tp, layer_range_text(p.range).c_str(), p.has_embedding ? " +embedding" : "",
                p.has_output ? " +output" : "", f.slices.size(), human_bytes(f.bytes).c_str(), f.path.c_str());
  }
  if (dry) {
    std::printf("dry run: nothing written\n");
    return 0;
  }
  std::filesystem::create_directories(out_dir);
  remove_stale_temps_in(out_dir);
  write_tp_split(files, plan, progress_printer("copied"));
  return 0;
}

}  // namespace

int cmd_split(int argc, char** argv) {
  po::options_description opts(
      "usage: baton split [-m] MODEL [--layers RANGES] [--tp N] -o DIR [--dry-run]\n\n"
      "Writes one GGUF v3 per pipeline stage holding all of MODEL's metadata, only\n"
      "that stage's tensors, and baton.split.* keys (layer range, part index and\n"
      "count, source tensor-table hash, tensor-data checksum). MODEL may be a\n"
      "llama.cpp shard set (give any shard). Tensors are copied in 4 MiB pieces, so\n"
      "memory stays bounded whatever the model size. All parts or none: each is\n"
      "written under a temporary name and all are renamed once every one is\n"
      "complete; the free space is checked first.\n\n"
      "With --tp N, every stage is cut into N tensor-parallel rank files (llama\n"
      "family): each holds 1/N of every layer's heads and FFN and of the vocabulary\n"
      "head, and is itself a smaller model of the same architecture (docs/SPLIT.md).\n\noptions");
  std::string model, layers, out_dir;
  int tp = 0, rank = -1;
  opts.add_options()("help,h", "show this help")
      ("model,m", po::value(&model), "the GGUF to split (or give it first, without -m)")
      ("layers", po::value(&layers), "ranges FIRST:LAST,... covering every layer in order; LAST may be "
                                     "'output' (the last layer). The first part also holds the embedding, "
                                     "the last the output head; tensors outside any layer go to every part")
      ("tp", po::value(&tp), "tensor-parallel ranks per stage (2 or more; must divide the KV heads and the FFN width); "
                             "without --layers, one stage of the whole model")
      ("rank", po::value(&rank), "with --tp: write only rank R's files (of every stage), for a node that holds "
                                 "only its own rank: a 153 GiB model's two rank files need not fit on one disk")
      ("output,o", po::value(&out_dir), "folder for the parts (created if missing)")
      ("dry-run", "print the plan and write nothing");
  po::positional_options_description pos;
  pos.add("model", 1);
  const auto vm = parse_command_line(argc, argv, {.options = opts, .positional = &pos});
  if (!vm) return 0;
  const bool dry = vm->count("dry-run") > 0;
  if (model.empty() || (layers.empty() && tp == 0) || (out_dir.empty() && !dry)) {
    std::fprintf(stderr, "baton split: MODEL, --layers (or --tp) and -o are required (see baton split --help)\n");
    return 1;
  }
  if (vm->count("tp") && tp < 2) {
    std::fprintf(stderr, "baton split: --tp must be 2 or more (got %d)\n", tp);
    return 1;
  }
  if (vm->count("rank") && (tp < 2 || rank < 0 || rank >= tp)) {
    std::fprintf(stderr, "baton split: --rank takes a rank of --tp N: 0..N-1 (got %d)\n", rank);
    return 1;
  }
  if (parse_only()) return 0;
  ModelFiles files = ModelFiles::open(model);
  const int n_layer = model_layer_count(files.meta());
  std::string stem = std::filesystem::path(model).stem().string();
  if (tp > 0) return split_tp(files, model, layers.empty() ? "0:output" : layers, tp, rank, out_dir, dry);
  SplitPlan plan = plan_split(files, parse_layer_ranges(layers, n_layer), out_dir.empty() ? "." : out_dir, stem);
  std::printf("source %s: %d layers, %zu tensors, %s, tensor-table hash %016llx\n", model.c_str(), n_layer,
              files.tensors().size(), human_bytes(files.tensor_bytes()).c_str(),
              (unsigned long long)plan.source_hash);
  for (const SplitPart& p : plan.parts) {
    std::printf("part %d/%zu  layers %s%s%s  %zu tensors  %s  -> %s\n", p.index + 1, plan.parts.size(),
                layer_range_text(p.range).c_str(), p.has_embedding ? " +embedding" : "", p.has_output ? " +output" : "",
                p.tensors.size(), human_bytes(p.tensor_bytes).c_str(), p.path.c_str());
  }
  if (dry) {
    std::printf("dry run: nothing written\n");
    return 0;
  }
  std::filesystem::create_directories(out_dir);
  remove_stale_temps_in(out_dir);
  write_split(files, plan, progress_printer("copied"));
  return 0;
}

int cmd_merge(int argc, char** argv) {
  po::options_description opts(
      "usage: baton merge PART... -o FILE\n\n"
      "Rebuilds the source GGUF from the parts `baton split` wrote: metadata without\n"
      "the baton.split.* keys and every tensor in the source's order, byte for byte.\n"
      "Tensor-parallel rank files (split --tp) are merged across ranks too: give\n"
      "every rank file of every stage.\n"
      "Refuses parts that are missing, repeated or from another source.\n\noptions");
  std::vector<std::string> parts;
  std::string out;
  opts.add_options()("help,h", "show this help")("output,o", po::value(&out), "the merged file to write");
  po::options_description hidden;
  hidden.add_options()("parts", po::value(&parts));
  po::positional_options_description pos;
  pos.add("parts", -1);
  const auto vm = parse_command_line(argc, argv, {.options = opts, .hidden = &hidden, .positional = &pos});
  if (!vm) return 0;
  if (parts.empty() || out.empty()) {
    std::fprintf(stderr, "baton merge: PART... and -o are required (see baton merge --help)\n");
    return 1;
  }
  if (parse_only()) return 0;
  remove_stale_temps_beside(out);
  merge_parts(parts, out, progress_printer("merged"));
  return 0;
}

}  // namespace baton
