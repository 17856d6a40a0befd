// TempFile: see temp_file.h.
#include "engine/base/temp_file.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <system_error>

namespace baton {

namespace {

std::system_error sys_error(const std::string& what) { return {errno, std::generic_category(), what}; }

constexpr size_t kMaxHostChars = 32;

bool host_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

// This machine's name as temporary names spell it.
std::string host_tag() {
  char buf[256] = {};
  std::string host;
  if (::gethostname(buf, sizeof buf - 1) == 0) {
    for (const char* p = buf; *p && host.size() < kMaxHostChars; ++p) host += host_char(*p) ? *p : '_';
  }
  return host.empty() ? "host" : host;
}

bool process_gone(long pid) { return pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH; }

}  // namespace

TempFile::TempFile(const std::string& target, mode_t mode) : target_(target) {
  std::string tmpl = target + ".baton-" + host_tag() + "-" + std::to_string(::getpid()) + "-XXXXXX.tmp";
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

std::optional<TempFileOwner> temp_file_owner(const std::string& name) {
  // From the right: ".tmp", six random characters, "-", the pid, "-", the
  // host (which may hold '-'), ".baton-", the target.
  const std::string suffix = ".tmp", marker = ".baton-";
  if (name.size() < suffix.size() + 7 || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return std::nullopt;
  }
  const size_t rnd = name.size() - suffix.size() - 6;
  for (size_t i = rnd; i < rnd + 6; ++i) {
    if (!std::isalnum(static_cast<unsigned char>(name[i]))) return std::nullopt;
  }
  if (name[rnd - 1] != '-') return std::nullopt;
  size_t p = rnd - 1;  // the '-' before the random characters
  size_t digits = p;
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(name[digits - 1]))) --digits;
  if (digits == p || p - digits > 9 || digits == 0 || name[digits - 1] != '-') return std::nullopt;
  const long pid = std::stol(name.substr(digits, p - digits));
  const size_t host_end = digits - 1;
  const size_t at = name.rfind(marker, host_end);
  if (at == std::string::npos || at == 0 || at + marker.size() >= host_end) return std::nullopt;
  const std::string host = name.substr(at + marker.size(), host_end - at - marker.size());
  if (host.empty() || host.size() > kMaxHostChars) return std::nullopt;
  for (char c : host) {
    if (!host_char(c)) return std::nullopt;
  }
  return TempFileOwner{name.substr(0, at), host, pid};
}

std::vector<std::string> remove_stale_temp_files(const std::string& folder) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  const std::string here = host_tag();
  std::error_code ec;
  fs::directory_iterator it(folder.empty() ? "." : folder, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::optional<TempFileOwner> owner = temp_file_owner(it->path().filename().string());
    if (!owner || owner->host != here || !process_gone(owner->pid)) continue;
    std::error_code sec;
    if (!fs::is_regular_file(it->symlink_status(sec)) || sec) continue;
    if (::unlink(it->path().c_str()) == 0) removed.push_back(it->path().string());
  }
  return removed;
}

}  // namespace baton
