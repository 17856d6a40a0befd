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

// Where a remote config has the coordinator listen and the workers dial,
// and the secret file it names.
inline constexpr int kRemoteCoordinatorPort = 7070;
inline constexpr int kRemoteWorkerPort = 7071;
inline constexpr const char* kRemoteSecretFile = "/etc/baton/cluster.secret";

// The TOML that runs the placement. Nodes given without names: a local
// cluster, [model] parts (the files split_command writes, relative to a
// config beside DIR) or path (one stage, absolute), [serving] ctx and
// parallel, one [[node]] per used stage. Nodes given by name (NAME=SIZE):
// machines of their own, a remote cluster (local = false, listen,
// secret_file), with the coordinator's and each node's `baton worker`
// command in comments.
std::string config_stanza(const std::string& model, const Placement& p, const std::vector<NodeSpec>& nodes,
                          const PlacementRequest& req, const std::string& out_dir);

}  // namespace baton
