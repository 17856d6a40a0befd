// TempFile: see temp_file.h.
#include "engine/temp_file.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <system_error>

namespace baton {

namespace {

std::system_error sys_error(const std::string& what) { return {errno, std::generic_category(), what}; }

}  // namespace

TempFile::TempFile(const std::string& target, mode_t mode) : target_(target) {
  std::string tmpl = target + ".XXXXXX.tmp";
  // mkostemps: O_CREAT|O_EXCL with a random name, so an existing file or
  // link at that name is never opened.
  fd_ = ::mkostemps(tmpl.data(), 4, O_CLOEXEC);
  if (fd_ < 0) throw sys_error("cannot create a temporary file beside " + target);
  path_ = tmpl;
  if (::fchmod(fd_, mode) != 0) {
    const std::system_error e = sys_error("cannot set the mode of " + path_);
    ::close(fd_);
    ::unlink(path_.c_str());
    throw e;
  }
}

TempFile::TempFile(TempFile&& o) noexcept
    : target_(std::move(o.target_)), path_(std::move(o.path_)), fd_(o.fd_), committed_(o.committed_) {
  o.fd_ = -1;
  o.committed_ = true;  // the moved-from object owns nothing to remove
}

TempFile::~TempFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(path_.c_str());
}

void TempFile::write(const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw sys_error("cannot write " + path_);
    p += w;
    n -= size_t(w);
  }
}

void TempFile::finish() {
  if (fd_ < 0) return;
  if (::fsync(fd_) != 0) throw sys_error("cannot sync " + path_);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw sys_error("cannot close " + path_);
}

void TempFile::commit() {
  finish();
  if (::rename(path_.c_str(), target_.c_str()) != 0) throw sys_error("cannot rename " + path_ + " to " + target_);
  committed_ = true;
}

uint64_t free_bytes_at(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  struct statvfs s {};
  if (::statvfs(dir.c_str(), &s) != 0) return std::numeric_limits<uint64_t>::max();
  return uint64_t(s.f_bavail) * uint64_t(s.f_frsize);
}

}  // namespace baton
