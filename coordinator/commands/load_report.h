// What the commands print about loading a stage: a progress line on stderr
// while the weights stream in, and a one-line summary of the load (time,
// rate, host peak RSS, device memory against the plan).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/runtime/backend.h"
#include "engine/model/loader.h"

namespace baton {

// A progress callback that redraws "loading <what>: X of Y GiB (P%), R GB/s,
// ETA T s" on stderr at most twice a second, ending with a newline.
std::function<void(const LoadProgress&)> stderr_load_progress(std::string what);

// "loaded X GiB in T s (R GB/s, O_DIRECT); host RSS peak +P MiB over B MiB
// (ring N MiB); device: plan X GiB, cudaMemGetInfo Y GiB".
std::string load_summary(const StageRunner& r);

// One warning line on stderr when --ctx asks for more positions than the
// model was trained on: it runs (the KV cache holds them), but text past the
// trained length degrades, so it is said rather than refused.
void warn_beyond_trained_context(const char* command, int64_t n_ctx_train, int64_t n_ctx);

}  // namespace baton
