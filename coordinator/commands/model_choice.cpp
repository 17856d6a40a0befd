#include "coordinator/commands/model_choice.h"

#include <stdlib.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "engine/base/command_error.h"
#include "engine/gguf/file.h"
#include "engine/model/layer_range_text.h"
#include "engine/model/part_info.h"
#include "engine/tp/slice.h"
#include "coordinator/cluster/cluster.h"  // split_layers
#include "engine/plan/node_plan.h"         // ModelPlanner
#include "gguf_split/split.h"
#include "gguf_split/synth.h"
#include "net/log.h"

namespace baton {

namespace fs = std::filesystem;

std::string default_model() {
  if (const char* env = std::getenv("BATON_MODEL"); env && *env) return env;
  std::error_code ec;
  if (fs::is_regular_file(kDefaultModelRel, ec)) return kDefaultModelRel;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && !exe.empty()) {
    // <repo>/build/baton -> <repo>/../shared/models/...
    const fs::path candidate = exe.parent_path().parent_path() / kDefaultModelRel;
    if (fs::is_regular_file(candidate, ec)) return candidate.lexically_normal().string();
  }
  return "";
}

SyntheticModelFile::SyntheticModelFile() {
  std::string tmpl = (fs::temp_directory_path() / "baton-synthetic-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::system_error(errno, std::generic_category(), "cannot create a temporary folder");
  dir_ = tmpl;
  path_ = (fs::path(dir_) / "synthetic.gguf").string();
  try {
    write_synthetic_model(path_);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

SyntheticModelFile::~SyntheticModelFile() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

TpRankFiles::TpRankFiles(const std::string& model, const GgufFile& file, int stages, int tp) {
  const std::vector<StageSlice> slices = split_layers(ModelPlanner(file), stages);
  std::string layers;
  for (const StageSlice& s : slices) {
    layers += (layers.empty() ? "" : ",") + std::to_string(s.layers.first) + ":" + std::to_string(s.layers.last);
  }
  std::string tmpl = (fs::temp_directory_path() / "baton-tp-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::system_error(errno, std::generic_category(), "cannot create a temporary folder");
  dir_ = tmpl;
  try {
    // Progress as the loader shows it: for large models, or when asked (-v).
    const bool show = file.file_size() >= (uint64_t(256) << 20) || net::log_enabled(net::LogLevel::info);
    paths_ = write_tp_ranks(model, tp, dir_, layers, show ? progress_printer("writing rank files:") : Progress());
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

TpRankFiles::~TpRankFiles() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void refuse_split_part(const GgufFile& f, const std::string& path) {
  // A rank file alone computes partial sums and a slice of the logits: it
  // runs only beside its other ranks, which the commands do not wire up.
  if (f.has(tp_keys::kSize)) {
    throw std::runtime_error(path + ": this is tensor-parallel rank " + std::to_string(f.get_int(tp_keys::kRank, 0)) +
                             " of " + std::to_string(f.get_int(tp_keys::kSize, 0)) +
                             " (baton split --tp), which runs only beside its other ranks: give every rank file "
                             "with --parts, or the model it was split from with --tp " +
                             std::to_string(f.get_int(tp_keys::kSize, 0)));
  }
  const std::optional<PartInfo> part = about_file(path, [&] { return read_part_info(f); });
  if (!part || part->count <= 1) return;
  throw std::runtime_error(path + ": this is a split part (" + std::to_string(part->index + 1) + " of " +
                           std::to_string(part->count) + ", layers " +
                           layer_range_text(part->range.first, part->range.last) + "): use --parts with all " +
                           std::to_string(part->count) + " parts, or the model it was split from");
}

}  // namespace baton
