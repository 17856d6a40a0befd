#include "coordinator/commands/draft_options.h"

#include <cstdio>
#include <stdexcept>

#include "engine/dspark/dspark_device.h"
#include "engine/dspark/dspark_source.h"
#include "net/log.h"

namespace baton {

namespace po = boost::program_options;

void add_draft_options(po::options_description& desc, DraftChoice& c) {
  // clang-format off
  desc.add_options()
      ("draft-max", po::value<int>(&c.max)->default_value(c.max),
       "tokens guessed per verify forward, 1..7 (the DSpark drafter guesses at most its block size, 5)")
      ("draft-threshold", po::value<float>(&c.threshold)->default_value(c.threshold, "0.8"),
       "the DSpark drafter stops guessing at the first token whose confidence is below this (0..1)")
      ("no-draft", po::bool_switch(&c.off),
       "decode without the model's DSpark drafter (on by default when the model file or --draft has one: on "
       "CUDA its network runs on the target's GPU where it fits beside the model; baton serve drafts while one "
       "request decodes alone)")
      ("draft-always", po::bool_switch(&c.always),
       "draft at every step even where it does not pay (by default drafting pauses while its tokens per second "
       "fall below plain decoding's, measured as it runs, and probes again later: docs/SPECULATIVE.md)")
      ("gpu-drafter", po::bool_switch(&c.on_gpu),
       "with --backend cuda: the DSpark drafter's network on the target's GPU, sharing its embedding and head, "
       "even where it does not fit under --mem-limit or leave 1 GiB free (the default places it there only "
       "where it does, and leaves it off otherwise)");
  // clang-format on
}

std::unique_ptr<DsparkDraftSource> make_dspark_source(const StageRunner& stage, const GgufFile& model_file,
                                                      const GgufFile& drafter_file, const DsparkShape& shape,
                                                      const LoadOptions& load, bool on_gpu, int n_threads,
                                                      float threshold, const char* who) {
  if (on_gpu) {
    LoadOptions drafter_load = load;
    drafter_load.progress = nullptr;  // the model's progress line names the model
    if (std::unique_ptr<DsparkNetwork> device = dspark_device_network(stage, drafter_file, shape, drafter_load)) {
      return std::make_unique<DsparkDraftSource>(std::move(device), threshold);
    }
  }
  if (const Model* host = stage.host_model()) {
    return std::make_unique<DsparkDraftSource>(drafter_file, shape, *host, n_threads, threshold);
  }
  if (net::log_enabled(net::LogLevel::info)) {
    std::fprintf(stderr, "%s: the drafter's host copy of the target's embedding and head: %.2f GiB\n", who,
                 double(DsparkDraftSource::target_ends_bytes(model_file)) / double(uint64_t(1) << 30));
  }
  return std::make_unique<DsparkDraftSource>(drafter_file, shape, model_file, n_threads, threshold);
}

void check_draft_options(const DraftChoice& c) {
  if (c.max < 1 || c.max > DraftChoice::kMaxGuesses) throw std::invalid_argument("--draft-max must be in 1..7");
  if (!(c.threshold >= 0 && c.threshold <= 1)) throw std::invalid_argument("--draft-threshold must be in 0..1");
}

}  // namespace baton
