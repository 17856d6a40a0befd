// Cluster topology files (TOML, configs/*.toml) for `baton serve --config`
// and `baton run --config`. A file names the model (or its split parts), how
// many stages the pipeline has, and whether the coordinator starts the
// workers itself on this machine (loopback) or waits for workers on other
// machines to register (`baton worker --coordinator ...`). docs/CONFIG.md
// describes every key; unknown keys are refused so that a typo never passes
// silently.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/plan/node_plan.h"  // NodeSpec

namespace baton {

// [sampling]: serve's defaults for requests that leave a field out, as its
// flags --temp, --top-p, --top-k, --min-p, --seed, --repeat-penalty,
// --repeat-last-n, --presence-penalty and --frequency-penalty set them (a
// flag wins). Checked against the sampler's ranges (engine/sampling/sampler.h).
struct ConfigSampling {
  std::optional<double> temperature, top_p, min_p, repeat_penalty, presence_penalty, frequency_penalty;
  std::optional<int64_t> top_k, repeat_last_n;
  std::optional<uint64_t> seed;  // -1 in the file: a random seed per request (as if absent)
};

struct ClusterConfig {
  std::string file;                // the config's own path (for messages)
  std::string model;               // full GGUF, relative paths resolved against the file's folder
  std::vector<std::string> parts;  // split parts, one stage each (local workers load them)
  int workers = 0;                 // stages
  int tp = 1;                      // tensor-parallel ranks per stage: workers x tp worker processes
  bool local = true;               // start the workers here on loopback
  std::string listen = "127.0.0.1:0";  // remote: where workers register (HOST:PORT)
  std::string secret_file;             // remote: the shared secret (never inline)
  int64_t ctx = 0;                     // 0: the model's, at most 4096
  int parallel = 0;                    // 0: the command's default
  int64_t batch = 0;                   // prompt tokens per step; 0: default
  bool prefix_cache = true;            // false: as serve --no-prefix-cache
  int threads_per_worker = 0;          // local workers; 0: cores / workers
  std::string link = "auto";           // stage links: auto, tcp or nccl (net/link_choice.h)
  ConfigSampling sampling;             // [sampling]
  std::vector<NodeSpec> nodes;      // [[node]]: for `baton plan`, and the reader
  // The backend every [[node]] names explicitly, when they all name the same
  // one: a local cluster's workers run on it unless --backend is given.
  std::optional<Backend> node_backend;
};

// Reads and checks a config file. Throws std::runtime_error naming the file,
// the key and (for syntax errors) the line.
ClusterConfig load_cluster_config(const std::string& path);

}  // namespace baton
