// Every file Baton writes goes through here: created exclusively (O_EXCL, so
// never through a link planted at the name) under an unpredictable name in
// the target's own folder (so the final rename stays on one file system), and
// renamed over the target only when complete. Until commit() the target is
// untouched; a TempFile that dies uncommitted removes its file.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace baton {

class TempFile {
 public:
  // Creates "<target>.XXXXXX.tmp" (six random characters) with `mode`.
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

}  // namespace baton
