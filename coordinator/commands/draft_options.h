// The drafter's flags that `baton run` and `baton serve` share (--no-draft,
// --draft-max, --draft-threshold, --gpu-drafter; docs/DSPARK.md), defined
// once so that both commands read and check them alike.
#pragma once

#include <boost/program_options.hpp>

#include "engine/spec/speculative.h"

namespace baton {

// Adds the four options to `desc`, writing into `choice`.
void add_draft_options(boost::program_options::options_description& desc, DraftChoice& choice);
// Throws std::invalid_argument for a value outside its range.
void check_draft_options(const DraftChoice& choice);

}  // namespace baton
