#include "coordinator/cluster/cluster_config.h"

// The header-only form of toml++: nothing to link, also on machines that
// have only the binary.
#define TOML_HEADER_ONLY 1
#define TOML_EXCEPTIONS 1
#include <toml++/toml.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "engine/plan/node_plan.h"  // parse_size
#include "engine/sampling/sampler.h"   // the sampling ranges
#include "net/address.h"

namespace baton {

namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw std::runtime_error(what.rfind("cannot read", 0) == 0 ? what : file + ": " + what);
}

void only_keys(const std::string& file, const toml::table& t, const std::string& where,
               const std::set<std::string>& allowed) {
  for (const auto& [k, v] : t) {
    if (!allowed.count(std::string(k.str()))) {
      fail(file, "unknown key '" + std::string(k.str()) + "' in " + where + " (see docs/CONFIG.md)");
    }
  }
}

template <class T>
T get(const std::string& file, const toml::table& t, const std::string& where, const char* key, T def) {
  const toml::node* n = t.get(key);
  if (!n) return def;
  if constexpr (std::is_same_v<T, bool>) {
    // as_boolean, not value<bool>: toml++ converts an integer to a bool.
    if (const toml::value<bool>* v = n->as_boolean()) return v->get();
    fail(file, where + "." + key + " must be true or false");
  } else if constexpr (std::is_integral_v<T>) {
    if (auto v = n->value<int64_t>()) return T(*v);
    fail(file, where + "." + key + " must be an integer");
  } else {
    if (auto v = n->value<std::string>()) return *v;
    fail(file, where + "." + key + " must be a string");
  }
}

std::string resolve(const fs::path& base, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  return (base / p).lexically_normal().string();
}

}  // namespace

ClusterConfig load_cluster_config(const std::string& path) {
  ClusterConfig c;
  c.file = path;
  toml::table root;
  if (std::error_code ec; !fs::is_regular_file(path, ec)) {
    const char* why = !fs::exists(path, ec) ? "no such file"
                      : fs::is_directory(path, ec) ? "it is a folder"
                                                   : "not a regular file";
    fail(path, "cannot read the config file " + path + ": " + why);
  }
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    fail(path, "line " + std::to_string(where.line) + ", column " + std::to_string(where.column) + ": " +
                   std::string(e.description()));
  }
  const fs::path base = fs::absolute(path).parent_path();
  only_keys(path, root, "the file", {"model", "cluster", "serving", "sampling", "node"});

  if (const toml::table* m = root["model"].as_table()) {
    only_keys(path, *m, "[model]", {"path", "parts"});
    c.model = resolve(base, get<std::string>(path, *m, "model", "path", ""));
    if (const toml::node* parts = m->get("parts")) {
      const toml::array* arr = parts->as_array();
      if (!arr) fail(path, "model.parts must be an array of file names");
      for (const toml::node& p : *arr) {
        auto s = p.value<std::string>();
        if (!s) fail(path, "model.parts must be an array of file names");
        c.parts.push_back(resolve(base, *s));
      }
    }
  } else if (root.contains("model")) {
    fail(path, "model must be a table: [model]");
  }
  if (c.model.empty() && c.parts.empty()) fail(path, "[model] needs path (a GGUF) or parts (split parts)");
  if (c.model.empty()) c.model = c.parts.front();

  if (const toml::table* t = root["cluster"].as_table()) {
    only_keys(path, *t, "[cluster]", {"workers", "tp", "local", "listen", "secret_file", "threads_per_worker", "link"});
    c.workers = get<int>(path, *t, "cluster", "workers", 0);
    c.tp = get<int>(path, *t, "cluster", "tp", 1);
    c.local = get<bool>(path, *t, "cluster", "local", true);
    c.listen = get<std::string>(path, *t, "cluster", "listen", c.listen);
    c.secret_file = resolve(base, get<std::string>(path, *t, "cluster", "secret_file", ""));
    c.threads_per_worker = get<int>(path, *t, "cluster", "threads_per_worker", 0);
    try {
      (void)net::split_host_port(c.listen);  // the syntax now; the name resolves when the coordinator binds it
    } catch (const std::invalid_argument& e) {
      fail(path, std::string("cluster.listen: ") + e.what());
    }
    c.link = get<std::string>(path, *t, "cluster", "link", c.link);
    if (c.link != "auto" && c.link != "tcp" && c.link != "nccl") fail(path, "cluster.link must be auto, tcp or nccl");
  }
  if (!c.parts.empty()) {
    if (c.workers != 0 && c.workers != int(c.parts.size())) {
      fail(path, "cluster.workers must equal the number of model.parts");
    }
    c.workers = int(c.parts.size());
  }
  if (c.workers < 1 || c.workers > 64) fail(path, "cluster.workers must be in 1..64");
  if (c.tp < 1 || c.tp > 64 || c.workers * c.tp > 64) fail(path, "cluster.tp must be in 1..64, and workers x tp at most 64");
  if (c.tp > 1 && !c.parts.empty()) {
    fail(path, "cluster.tp makes rank files from model.path; rank files of baton split --tp go to model.parts without it");
  }
  if (c.threads_per_worker < 0) fail(path, "cluster.threads_per_worker must be >= 0");
  if (!c.local && c.secret_file.empty()) {
    fail(path, "a cluster of remote workers needs cluster.secret_file (the secret is never written inline)");
  }
  if (!c.local && !c.parts.empty()) {
    fail(path, "model.parts are for local workers; remote workers name their part with baton worker --model");
  }

  if (const toml::table* t = root["serving"].as_table()) {
    only_keys(path, *t, "[serving]", {"ctx", "parallel", "batch", "prefix_cache"});
    c.ctx = get<int64_t>(path, *t, "serving", "ctx", 0);
    c.parallel = get<int>(path, *t, "serving", "parallel", 0);
    c.batch = get<int64_t>(path, *t, "serving", "batch", 0);
    c.prefix_cache = get<bool>(path, *t, "serving", "prefix_cache", true);
    if (c.ctx < 0 || c.parallel < 0 || c.batch < 0) fail(path, "serving values must be >= 0");
  }

  if (const toml::node* st = root.get("sampling")) {
    const toml::table* t = st->as_table();
    if (!t) fail(path, "sampling must be a table: [sampling]");
    only_keys(path, *t, "[sampling]",
              {"temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n",
               "presence_penalty", "frequency_penalty"});
    auto number = [&](const SamplingRange& r, const char* key) -> std::optional<double> {
      const toml::node* n = t->get(key);
      if (!n) return std::nullopt;
      const std::optional<double> v = n->is_number() ? n->value<double>() : std::nullopt;
      if (!v) fail(path, std::string("sampling.") + key + " must be a number");
      if (!(std::isfinite(*v) && *v >= r.lo && *v <= r.hi)) {
        fail(path, fmt::format("sampling.{} must be between {} and {}, got {}", key, r.lo, r.hi, *v));
      }
      return v;
    };
    auto integer = [&](const SamplingRange& r, const char* key) -> std::optional<int64_t> {
      if (!t->get(key)) return std::nullopt;
      const int64_t v = get<int64_t>(path, *t, "sampling", key, 0);
      if (double(v) < r.lo || double(v) > r.hi) {
        fail(path, fmt::format("sampling.{} must be between {} and {}, got {}", key, r.lo, r.hi, v));
      }
      return v;
    };
    ConfigSampling& d = c.sampling;
    d.temperature = number(kTemperatureRange, "temperature");
    d.top_p = number(kTopPRange, "top_p");
    d.min_p = number(kMinPRange, "min_p");
    d.repeat_penalty = number(kRepeatPenaltyRange, "repeat_penalty");
    d.presence_penalty = number(kPresencePenaltyRange, "presence_penalty");
    d.frequency_penalty = number(kFrequencyPenaltyRange, "frequency_penalty");
    d.top_k = integer(kTopKRange, "top_k");
    d.repeat_last_n = integer(kRepeatLastNRange, "repeat_last_n");
    if (t->get("seed")) {
      const int64_t seed = get<int64_t>(path, *t, "sampling", "seed", 0);
      if (seed < -1) fail(path, "sampling.seed must be an integer >= 0, or -1 for a random seed per request");
      if (seed >= 0) d.seed = uint64_t(seed);
    }
  }

  if (const toml::node* nodes = root.get("node")) {
    const toml::array* arr = nodes->as_array();
    if (!arr) fail(path, "node must be an array of tables: [[node]]");
    bool all_named = !arr->empty();
    for (const toml::node& n : *arr) {
      const toml::table* t = n.as_table();
      if (!t) fail(path, "node must be an array of tables: [[node]]");
      only_keys(path, *t, "[[node]]", {"name", "backend", "memory", "unified"});
      all_named = all_named && t->contains("backend");
      NodeSpec s;
      s.name = get<std::string>(path, *t, "node", "name", "");
      const std::string backend = get<std::string>(path, *t, "node", "backend", "cuda");
      if (backend != "cpu" && backend != "cuda") fail(path, "node.backend must be cpu or cuda");
      s.backend = backend == "cpu" ? Backend::Cpu : Backend::Cuda;
      const std::string mem = get<std::string>(path, *t, "node", "memory", "");
      if (!mem.empty()) {
        try {
          s.memory_bytes = parse_size(mem);
        } catch (const std::exception& e) {
          fail(path, "node.memory: " + std::string(e.what()));
        }
      }
      s.unified = get<bool>(path, *t, "node", "unified", false);
      c.nodes.push_back(std::move(s));
    }
    if (all_named && std::all_of(c.nodes.begin(), c.nodes.end(),
                                 [&](const NodeSpec& s) { return s.backend == c.nodes.front().backend; })) {
      c.node_backend = c.nodes.front().backend;
    }
  }
  return c;
}

}  // namespace baton
