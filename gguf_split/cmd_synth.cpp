// `baton synth --arch A --shape NAME -o FILE [--type T] [--seed S] [--data random|alias|sparse]`:
// writes a random-weight model of a named shape, with a real tokenizer
// section, for tests and benchmarks. Progress goes to stderr.
#include <boost/program_options.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "gguf_split/commands.h"
#include "gguf_split/progress_throttle.h"
#include "gguf_split/stale_temps.h"
#include "engine/base/command_line.h"
#include "engine/base/progress_line.h"
#include "gguf_split/synth.h"

namespace baton {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

std::string shapes_help() {
  std::string out = "shapes (NAME, or NAME-TYPE to pick the type):\n";
  for (const auto& s : synth_shapes()) {
    std::string types;
    for (const auto& t : s.types) types += (types.empty() ? "" : "|") + t;
    out += "  " + s.name + " (" + s.arch + "; types " + types + ", default " + s.default_type + ")\n      " +
           s.summary + "\n";
  }
  return out;
}

// Prints "written X of Y GiB (P%), R GB/s, ETA T s" at most twice a second;
// the rate counts from the first tensor byte (the header of a big vocabulary
// takes a while before it).
class Progress {
 public:
  explicit Progress(bool quiet) : throttle_(quiet) {}
  void operator()(uint64_t done, uint64_t total) {
    const auto now = Clock::now();
    if (!started_) {
      started_ = true;
      start_ = now;
      throttle_.restart(now);
    }
    if (!throttle_.due(now, done, total)) return;
    const double s = std::chrono::duration<double>(now - start_).count();
    const double rate = s > 0 ? double(done) / s : 0;
    const double eta = rate > 0 ? double(total - done) / rate : 0;
    char line[128];
    std::snprintf(line, sizeof line, "written %.2f of %.2f GiB (%3.0f%%), %.2f GB/s, ETA %.0f s", gib(done), gib(total),
                  percent(done, total), rate / 1e9, eta);
    print_progress_line(line, done == total);
  }

 private:
  ProgressThrottle throttle_;
  bool started_ = false;
  Clock::time_point start_;
};

}  // namespace

int cmd_synth(int argc, char** argv) {
  std::string arch, shape, type, out, draft_out, data = "random";
  uint64_t seed = 0x5eed;
  int layers = 0;
  po::options_description opts(
      "usage: baton synth --shape NAME -o FILE [options]\n\n"
      "Writes a random-weight GGUF model of a named shape with a real tokenizer\n"
      "section (llama: byte-fallback SentencePiece; deepseek4: byte-level BPE with\n"
      "DeepSeek's special tokens, pre-tokenizer deepseek-v3), padded with unused or\n"
      "placeholder tokens to the shape's vocabulary size. The same seed gives the\n"
      "same file.\n\noptions");
  opts.add_options()
      ("help,h", "show this help")
      ("arch", po::value(&arch), "llama or deepseek4 (optional; checked against the shape)")
      ("shape", po::value(&shape), "shape name, see below")
      ("type", po::value(&type), "llama: f32|f16|q8_0|q4_k (matrices; norms stay f32); deepseek4: q2 (IQ2_XXS "
                                 "gate/up, Q2_K down experts) | q4 (Q4_K experts); other tensors as published: "
                                 "Q8_0 attention/shared/output, F16 embedding/HC/compressor/indexer")
      ("output,o", po::value(&out), "file to write (through a temporary name beside it, renamed when complete)")
      ("seed", po::value(&seed), "random seed (default 0x5eed = 24301)")
      ("data", po::value(&data), "random: every tensor its own random data; alias: tensors of one name "
                                 "pattern, type and shape share one repeated random tile (written at disk "
                                 "speed, full size on disk; the output head stays random, so greedy "
                                 "picks are not ties); sparse: header only, the data a sparse hole "
                                 "(reads as zeros; for planning)")
      ("dspark", "deepseek4: add the DSpark drafter (random weights of its real shapes; tiny: the last three "
                 "layers as target layers) to the model file, keys deepseek4.dspark.*, tensors mtp.*")
      ("draft-out", po::value(&draft_out), "with --dspark: write the drafter to this sidecar file instead "
                                           "(general.architecture deepseek4-dspark, keys dspark.*), for --draft")
      ("layers", po::value(&layers), "only the first N layers, each of the shape's own size (a shorter model "
                                     "for a card that cannot hold the whole, e.g. 20 of Flash's 43 on an 80 GB card)")
      ("quiet,q", "no progress on stderr");
  const std::string help_tail = "\n" + shapes_help();
  const auto vm = parse_command_line(argc, argv, {.options = opts, .help_tail = help_tail});
  if (!vm) return 0;
  if (shape.empty() || out.empty()) {
    std::fprintf(stderr, "baton synth: --shape and -o are required (see baton synth --help)\n");
    return 1;
  }
  const auto mode = synth_data_from_name(data);
  if (!mode) {
    std::fprintf(stderr, "baton synth: --data must be random, alias or sparse, not '%s'\n", data.c_str());
    return 1;
  }
  if (parse_only()) return 0;
  SynthOptions o;
  o.arch = arch;
  o.shape = shape;
  o.type = type;
  o.seed = seed;
  o.data = *mode;
  o.dspark = vm->count("dspark") > 0;
  o.draft_out = draft_out;
  if (!draft_out.empty() && !o.dspark) {
    std::fprintf(stderr, "baton synth: --draft-out needs --dspark\n");
    return 1;
  }
  o.layers = layers;
  Progress progress(vm->count("quiet") > 0);
  o.progress = [&](uint64_t done, uint64_t total) { progress(done, total); };
  remove_stale_temps_beside(out);
  const auto t0 = Clock::now();
  SynthResult r = write_synth_model(out, o);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("wrote %s: %s-%s, %llu tensors, %.2f GiB of tensor data (%s), vocab %lld, seed %llu, %.1f s\n",
              out.c_str(), r.shape.c_str(), r.type.c_str(), static_cast<unsigned long long>(r.n_tensors),
              gib(r.tensor_bytes), synth_data_name(*mode), static_cast<long long>(r.n_vocab),
              static_cast<unsigned long long>(seed), s);
  if (!draft_out.empty()) {
    std::printf("wrote %s: DSpark drafter, %.2f GiB of tensor data\n", draft_out.c_str(), gib(r.draft_bytes));
  }
  return 0;
}

}  // namespace baton
