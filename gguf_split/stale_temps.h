// What split, merge, synth and convert do before they write into a folder:
// remove the temporary files that killed writers left there
// (engine/base/temp_file.h names them by host and pid; only those whose process
// is gone), one line each on stdout.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "engine/base/temp_file.h"

namespace baton {

// `folder` of the parts, or the folder of one output file (target_file).
inline void remove_stale_temps_in(const std::string& folder) {
  for (const std::string& p : remove_stale_temp_files(folder.empty() ? "." : folder)) {
    std::printf("removed %s: a temporary file of a writer that no longer runs\n", p.c_str());
  }
}

inline void remove_stale_temps_beside(const std::string& target_file) {
  remove_stale_temps_in(std::filesystem::path(target_file).parent_path().string());
}

}  // namespace baton
