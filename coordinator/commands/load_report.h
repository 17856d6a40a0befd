// What the commands print about loading a stage: a progress line on stderr
// while the weights stream in, and a one-line summary of the load (time,
// rate, host peak RSS, device memory against the plan).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/backend.h"
#include "engine/loader.h"

namespace baton {

// A progress callback that redraws "loading <what>: X of Y GiB (P%), R GB/s,
// ETA T s" on stderr at most twice a second, ending with a newline.
std::function<void(const LoadProgress&)> stderr_load_progress(std::string what);

// "loaded 4.58 GiB in 2.10 s (2.34 GB/s, O_DIRECT); host RSS peak +300 MiB
// over 400 MiB (ring 256 MiB); device: plan 5.10 GiB, cudaMemGetInfo 5.11 GiB".
std::string load_summary(const StageRunner& r);

}  // namespace baton
