#include "coordinator/commands/plan_deploy.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "engine/model/layer_range_text.h"
#include "engine/model/part_info.h"

namespace baton {

namespace {

// A size parse_size reads back exactly, in the unit that divides it into
// the smallest number (97887MiB, 128GB, 128GiB).
std::string exact_size(uint64_t bytes) {
  const std::pair<const char*, uint64_t> units[] = {
      {"TiB", uint64_t(1) << 40}, {"GiB", uint64_t(1) << 30}, {"MiB", uint64_t(1) << 20}, {"KiB", uint64_t(1) << 10},
      {"TB", 1000000000000ull},   {"GB", 1000000000ull},      {"MB", 1000000ull},         {"KB", 1000ull}};
  std::string best = std::to_string(bytes) + "B";
  uint64_t best_count = bytes;
  for (const auto& [unit, size] : units) {
    if (bytes >= size && bytes % size == 0 && bytes / size < best_count) {
      best_count = bytes / size;
      best = std::to_string(best_count) + unit;
    }
  }
  return best;
}

// A TOML basic string.
std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::vector<const StagePlacement*> used_stages(const Placement& p) {
  std::vector<const StagePlacement*> out;
  for (const StagePlacement& s : p.stages) {
    if (s.used()) out.push_back(&s);
  }
  return out;
}

std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789_./:=,+-@%") == std::string::npos;
  if (plain) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string split_command(const std::string& model, const Placement& p, const std::string& out_dir) {
  const auto stages = used_stages(p);
  if (stages.size() < 2) return "";
  std::string ranges;
  for (const StagePlacement* s : stages) ranges += (ranges.empty() ? "" : ",") + layer_range_text(s->layers);
  return "baton split " + shell_word(model) + " --layers " + ranges + " -o " + shell_word(out_dir);
}

namespace {

// What each named node runs: the coordinator on the first, then a worker on
// every node with its part (the same path on each machine).
std::string remote_commands(const std::vector<const StagePlacement*>& stages, const std::vector<NodeSpec>& nodes,
                            const std::vector<std::string>& files) {
  const std::string coord = nodes[stages.front()->node].name;
  std::string out = "# Workers on the machines named (each resolving to its cluster address on every node).\n"
                    "# Start the coordinator and a worker on each node with its part copied there (any order):\n";
  out += fmt::format("#   {}$ baton serve --config THIS_FILE --host 0.0.0.0 --port 8080\n", coord);
  for (size_t i = 0; i < stages.size(); ++i) {
    const NodeSpec& n = nodes[stages[i]->node];
    out += fmt::format("#   {}$ baton worker --coordinator {}:{} --listen {}:{} --backend {} --secret-file {} --model {}\n",
                       n.name, coord, kRemoteCoordinatorPort, n.name, kRemoteWorkerPort, backend_name(n.backend),
                       kRemoteSecretFile, shell_word(files[i]));
  }
  out += fmt::format("# The secret file (same bytes on every node, chmod 600) is yours to create: head -c 32 /dev/urandom "
                     "| base64 > {}\n",
                     kRemoteSecretFile);
  return out;
}

}  // namespace

namespace {

// The files split_command writes, in stage order (under out_dir as given).
std::vector<std::string> part_paths(const std::string& model, const std::vector<const StagePlacement*>& stages,
                                    const std::string& out_dir) {
  const std::string stem = std::filesystem::path(model).stem().string();
  std::vector<std::string> paths;
  for (size_t i = 0; i < stages.size(); ++i) {
    const std::string file = split_part_file_name(stem, int(i), int(stages.size()), stages[i]->layers);
    paths.push_back((std::filesystem::path(out_dir) / file).string());
  }
  return paths;
}

// [serving] and one [[node]] per used stage.
std::string serving_and_nodes(const std::vector<const StagePlacement*>& stages, const std::vector<NodeSpec>& nodes,
                              const PlacementRequest& req) {
  std::string out = fmt::format("\n[serving]\nctx = {}\nparallel = {}\n", req.n_ctx, req.n_seq);
  for (const StagePlacement* s : stages) {
    const NodeSpec& n = nodes[s->node];
    out += fmt::format("\n[[node]]\nname = {}\nbackend = \"{}\"\nmemory = \"{}\"\n", toml_string(n.name),
                       backend_name(n.backend), exact_size(n.memory_bytes));
    if (n.unified) out += "unified = true\n";
  }
  return out;
}

}  // namespace

std::string config_stanza(const std::string& model, const Placement& p, const std::vector<NodeSpec>& nodes,
                          const PlacementRequest& req, const std::string& out_dir) {
  const auto stages = used_stages(p);
  const std::vector<std::string> parts = stages.size() < 2 ? std::vector<std::string>{} : part_paths(model, stages, out_dir);
  // Nodes given by name are machines of their own: a remote cluster.
  const bool remote = std::all_of(stages.begin(), stages.end(), [&](const StagePlacement* s) { return nodes[s->node].named; });
  if (remote) {
    // Each machine opens its file by an absolute path.
    std::vector<std::string> files;
    if (parts.empty()) files.push_back(std::filesystem::absolute(model).string());
    for (const std::string& part : parts) files.push_back(std::filesystem::absolute(part).string());
    std::string out = remote_commands(stages, nodes, files);
    out += "[model]\n# The coordinator reads the metadata and the tokenizer only: any part.\npath = " +
           toml_string(files.front()) + "\n";
    out += fmt::format("\n[cluster]\nworkers = {}\nlocal = false\nlisten = \"0.0.0.0:{}\"\nsecret_file = {}\n",
                       stages.size(), kRemoteCoordinatorPort, toml_string(kRemoteSecretFile));
    return out + serving_and_nodes(stages, nodes, req);
  }
  // A config's relative paths are read from its own folder: the one model
  // is named absolutely, the parts relative to a config saved beside them.
  std::string out = "# " + std::string(stages.size() < 2 ? "One local worker" : "Local workers, one per part") +
                    " (nodes given by name print a config of workers on those machines).\n[model]\n";
  if (parts.empty()) {
    out += "path = " + toml_string(std::filesystem::absolute(model).string()) + "\n";
  } else {
    out += "parts = [";
    for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + toml_string(parts[i]);
    out += "]\n";
  }
  out += fmt::format("\n[cluster]\nworkers = {}\n", stages.size());
  return out + serving_and_nodes(stages, nodes, req);
}

}  // namespace baton
