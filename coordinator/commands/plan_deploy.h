// From a placement to a deployment in one step: the `baton split` command
// that cuts the model at the placement's stage boundaries, and the config
// stanza (configs/*.toml, docs/CONFIG.md) that serves the parts it writes.
// `baton plan` prints both when the placement fits.
#pragma once

#include <string>
#include <vector>

#include "coordinator/cluster/placement.h"

namespace baton {

// The placement's stages that hold layers, in pipeline order.
std::vector<const StagePlacement*> used_stages(const Placement& p);

// A word as a POSIX shell reads it back: bare when it is plain, else in
// single quotes.
std::string shell_word(const std::string& word);

// "baton split MODEL --layers 0:21,22:42 -o DIR" for two or more stages;
// "" for one (a single stage serves the file as it is).
std::string split_command(const std::string& model, const Placement& p, const std::string& out_dir);

// The TOML a local cluster runs the placement with: [model] parts (the
// files split_command writes, relative to a config beside DIR) or path (one
// stage, absolute), [serving] ctx and parallel, one [[node]] per used stage.
std::string config_stanza(const std::string& model, const Placement& p, const std::vector<NodeSpec>& nodes,
                          const PlacementRequest& req, const std::string& out_dir);

}  // namespace baton
