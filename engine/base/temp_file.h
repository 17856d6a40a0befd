// Every file Baton writes goes through here: created exclusively (O_EXCL, so
// never through a link planted at the name) under an unpredictable name in
// the target's own folder (so the final rename stays on one file system), and
// renamed over the target only when complete. Until commit() the target is
// untouched; a TempFile that dies uncommitted removes its file.
//
// A process killed mid-write (SIGKILL, SIGXFSZ, a power cut) cannot remove
// its file, so the name says whose it is:
//   TARGET.baton-HOST-PID-XXXXXX.tmp
// (HOST: this machine's name, letters, digits, '_' and '-' only, at most 32;
// PID: the writer's process id; XXXXXX: six random characters), and the
// commands that write into a folder first remove the ones whose process is
// gone (remove_stale_temp_files).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace baton {

class TempFile {
 public:
  // Creates "<target>.baton-HOST-PID-XXXXXX.tmp" with `mode`.
  // Throws std::system_error when the folder cannot take a new file.
  explicit TempFile(const std::string& target, mode_t mode = 0644);
  ~TempFile();  // closes and removes the file unless committed
  TempFile(TempFile&& o) noexcept;
  TempFile& operator=(TempFile&&) = delete;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }  // the temporary name
  const std::string& target() const { return target_; }

  // Writes all of `n` bytes at the current offset (throws on a short write).
  void write(const void* data, size_t n);
  // fsync and close (throws on failure); idempotent.
  void finish();
  // finish(), then renames the file over the target.
  void commit();

 private:
  std::string target_, path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Bytes free for an unprivileged writer in the folder holding `path`, or
// UINT64_MAX when the file system does not say.
uint64_t free_bytes_at(const std::string& path);

// The writer of a TempFile name (the file name, without its folder).
struct TempFileOwner {
  std::string target;  // the file name it was to become
  std::string host;    // as the name spells it
  long pid = 0;
};
std::optional<TempFileOwner> temp_file_owner(const std::string& file_name);

// Removes from `folder` the TempFile files (regular files named as above) of
// writers on this host whose process no longer exists: what a killed
// process left. Another machine's files (a shared folder) and a live
// process's are never touched. Returns the paths removed; what cannot be
// read or removed is left as it is.
std::vector<std::string> remove_stale_temp_files(const std::string& folder);

}  // namespace baton
