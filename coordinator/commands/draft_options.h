// The drafter's flags that `baton run` and `baton serve` share (--no-draft,
// --draft-max, --draft-threshold, --draft-always, --gpu-drafter; docs/DSPARK.md), defined
// once so that both commands read and check them alike; and the one-sequence
// draft source `baton run` and `baton bench` build beside a loaded stage.
#pragma once

#include <boost/program_options.hpp>

#include <memory>

#include "engine/spec/speculative.h"

namespace baton {

// Adds the five options to `desc`, writing into `choice`.
void add_draft_options(boost::program_options::options_description& desc, DraftChoice& choice);
// Throws std::invalid_argument for a value outside its range.
void check_draft_options(const DraftChoice& choice);

class DsparkDraftSource;
class GgufFile;
class StageRunner;
struct DsparkShape;
struct LoadOptions;

// The DSpark drafter `shape` (from `drafter_file`: a sidecar or the model
// file) beside `stage`: its network on the stage's GPU when `on_gpu` and the
// stage is on one; else on `n_threads` CPU threads over the stage's host
// weights; else (a GPU stage) on the CPU with its own host copy of the
// target's embedding and head read from `model_file`, whose size `who`
// logs. The draft returns its logits (set_return_logits) by default.
std::unique_ptr<DsparkDraftSource> make_dspark_source(const StageRunner& stage, const GgufFile& model_file,
                                                      const GgufFile& drafter_file, const DsparkShape& shape,
                                                      const LoadOptions& load, bool on_gpu, int n_threads,
                                                      float threshold, const char* who);

}  // namespace baton
