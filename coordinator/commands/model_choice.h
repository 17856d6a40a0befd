// Which model `run` and `serve` run. The one they use when none is named: $BATON_MODEL, else the
// stories260K fixture beside the checkout, else Baton's built-in synthetic
// model (a fresh clone from a public host has no fixtures). Worker processes
// open their model by path, so the synthetic model is written to a private
// temporary folder that lives as long as the command.
#pragma once

#include <string>
#include <vector>

namespace baton {

class GgufFile;

// The fixture's path relative to the current folder (and to the binary's checkout).
inline constexpr const char* kDefaultModelRel = "../shared/models/stories260K.gguf";

// $BATON_MODEL, else the fixture (relative to the current folder, then to the
// binary's checkout), else "" (the built-in synthetic model).
std::string default_model();

// The synthetic model as a file, removed with its folder when this goes.
class SyntheticModelFile {
 public:
  SyntheticModelFile();  // throws std::system_error when no temporary folder can be made
  ~SyntheticModelFile();
  SyntheticModelFile(const SyntheticModelFile&) = delete;
  SyntheticModelFile& operator=(const SyntheticModelFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

// The rank files of `--tp N` for a run or a server of local workers: the
// model's layers placed on `stages` pipeline stages as `--workers` places
// them, and each stage cut into `tp` rank files (baton split --tp), written
// with progress into a private temporary folder ($TMPDIR) that lives as long
// as the command. paths(): stage by stage, rank by rank.
class TpRankFiles {
 public:
  TpRankFiles(const std::string& model, const GgufFile& file, int stages, int tp);
  ~TpRankFiles();
  TpRankFiles(const TpRankFiles&) = delete;
  TpRankFiles& operator=(const TpRankFiles&) = delete;
  const std::vector<std::string>& paths() const { return paths_; }

 private:
  std::string dir_;
  std::vector<std::string> paths_;
};

// A part written by `baton split` holds only some layers: loading it alone
// would fail on the first tensor it lacks, so this throws what to run
// instead (--parts with all of them, or the model it was split from).
void refuse_split_part(const GgufFile& f, const std::string& path);

}  // namespace baton
