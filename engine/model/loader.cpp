#include "engine/model/loader.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "engine/gguf/file.h"
#include "engine/model/weight_layout.h"

namespace baton {

namespace {

using Clock = std::chrono::steady_clock;

// Tensors closer than this in the file are read as one run (the bytes between
// them are read and skipped); farther apart, the gap is not read at all (a
// pipeline slice skips the other stages' layers).
constexpr uint64_t kMaxGap = uint64_t(1) << 20;

uint64_t align_down(uint64_t n, uint64_t a) { return n / a * a; }
uint64_t align_up_to(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Reads "<key>: <n> kB" from /proc/self/status.
uint64_t proc_status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0 && line.size() > klen && line[klen] == ':') {
      return std::strtoull(line.c_str() + klen + 1, nullptr, 10) * 1024;
    }
  }
  return 0;
}

// A file descriptor opened with O_DIRECT, closed on scope exit; -1 when the
// file system refuses it (tmpfs on older kernels, some FUSE mounts).
class DirectFd {
 public:
  explicit DirectFd(const std::string& path) {
    if (!path.empty()) fd_ = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  }
  ~DirectFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  DirectFd(const DirectFd&) = delete;
  DirectFd& operator=(const DirectFd&) = delete;
  int get() const { return fd_; }
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// Reads up to len bytes at offset (all aligned) into buf; returns the bytes
// read (short only at the end of the file), or -1 with errno EINVAL when the
// file system turns O_DIRECT reads down after all.
int64_t pread_direct(int fd, uint8_t* buf, uint64_t len, uint64_t offset) {
  uint64_t got = 0;
  while (got < len) {
    const ssize_t n = ::pread(fd, buf + got, size_t(len - got), off_t(offset + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && got == 0) return -1;
      throw std::system_error(errno, std::generic_category(), "pread (O_DIRECT) failed");
    }
    if (n == 0) break;
    got += uint64_t(n);
  }
  return int64_t(got);
}

std::vector<LoadItem> sorted_checked(const GgufFile& f, std::vector<LoadItem> items) {
  std::sort(items.begin(), items.end(),
            [](const LoadItem& a, const LoadItem& b) { return a.file_offset < b.file_offset; });
  for (const auto& it : items) {
    if (it.file_offset > f.file_size() || it.nbytes > f.file_size() - it.file_offset) {
      throw std::runtime_error(fmt::format("tensor {}: bytes [{}, {}) are outside the file of {} bytes", it.name,
                                           it.file_offset, it.file_offset + it.nbytes, f.file_size()));
    }
  }
  return items;
}

uint64_t total_bytes(const std::vector<LoadItem>& items) {
  uint64_t t = 0;
  for (const auto& it : items) t += it.nbytes;
  return t;
}

// Calls the callback at most once per piece, always with done <= total and
// never going backwards.
struct ProgressReporter {
  const LoadOptions& opt;
  uint64_t total;
  Clock::time_point t0 = Clock::now();
  uint64_t done = 0;
  void add(uint64_t n) { done += n; }
  void report() const {
    if (opt.progress) opt.progress({done, total, seconds_since(t0)});
  }
};

// Drops the page cache behind a reader that moves forward through the file.
// POSIX_FADV_DONTNEED drops only the folios that lie wholly inside its range,
// and the kernel caches file data in large folios (readahead grows them up to
// 2 MiB), so dropping exactly the bytes just read keeps every folio that
// straddles a piece boundary, and a load of many small tensors would leave
// much of the file cached (docs/MEMORY.md). Each drop therefore reaches back over the
// previous boundary by kDropSlack, and finish() drops the whole range the
// load read, plus the readahead window past its end.
class CacheDropper {
 public:
  explicit CacheDropper(const GgufFile& f) : f_(f) {}
  void after_read(uint64_t offset, uint64_t n) {
    low_ = std::min(low_, offset);
    high_ = std::max(high_, offset + n);
    const uint64_t from = std::max(low_, offset > kDropSlack ? offset - kDropSlack : 0);
    f_.drop_cache(from, offset + n - from);
  }
  void finish() {
    const uint64_t end = std::min(f_.file_size(), high_ + kReadaheadSlack);
    if (low_ < end) f_.drop_cache(low_, end - low_);
  }

 private:
  static constexpr uint64_t kDropSlack = uint64_t(4) << 20;        // twice the largest page-cache folio
  static constexpr uint64_t kReadaheadSlack = uint64_t(32) << 20;  // above any readahead window
  const GgufFile& f_;
  uint64_t low_ = UINT64_MAX, high_ = 0;
};

}  // namespace

std::vector<LoadItem> load_items(const WeightLayout& layout) {
  std::vector<LoadItem> out;
  auto add = [&](const std::vector<WeightLayout::Entry>& entries) {
    for (const auto& e : entries) {
      if (!e.info || e.alias) continue;
      out.push_back({e.info->name, e.info->file_offset, e.info->nbytes, e.offset});
    }
  };
  add(layout.embedding);
  for (const auto& l : layout.layers) add(l);
  add(layout.head);
  std::sort(out.begin(), out.end(), [](const LoadItem& a, const LoadItem& b) { return a.file_offset < b.file_offset; });
  return out;
}

void check_staging_ring(int slots, uint64_t slot_bytes) {
  if (slots < 1 || slot_bytes < kDirectIoAlignment || slot_bytes % kDirectIoAlignment != 0) {
    throw std::invalid_argument(fmt::format("staging ring of {} x {} bytes: need at least one slot of a multiple of {}",
                                            slots, slot_bytes, kDirectIoAlignment));
  }
}

uint8_t* staging_slot(uint8_t* ring, int slots, uint64_t slot_bytes, int i) {
  if (i < 0 || i >= slots) throw std::out_of_range(fmt::format("staging slot {} of {}", i, slots));
  return ring + uint64_t(i) * slot_bytes;
}

void check_staging_copy(const uint8_t* slot, uint64_t slot_bytes, const uint8_t* src, uint64_t dst_offset, uint64_t n,
                        uint64_t dst_bytes, const char* destination) {
  if (src < slot || src + n > slot + slot_bytes) throw std::out_of_range("staging copy: source outside its slot");
  if (dst_offset > dst_bytes || n > dst_bytes - dst_offset) {
    throw std::out_of_range(fmt::format("staging copy of {} bytes at {} is outside the {} byte {}", n, dst_offset,
                                        dst_bytes, destination));
  }
}

HostStagingSink::HostStagingSink(uint8_t* dst, uint64_t dst_bytes, int slots, uint64_t slot_bytes)
    : dst_(dst), dst_bytes_(dst_bytes), slots_(slots), slot_bytes_(slot_bytes) {
  check_staging_ring(slots, slot_bytes);
  ring_ = static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlignment, uint64_t(slots) * slot_bytes));
  if (!ring_) throw std::bad_alloc();
}

HostStagingSink::~HostStagingSink() { std::free(ring_); }

uint8_t* HostStagingSink::slot(int i) { return staging_slot(ring_, slots_, slot_bytes_, i); }

void HostStagingSink::copy(int i, const uint8_t* src, uint64_t dst_offset, uint64_t n) {
  check_staging_copy(slot(i), slot_bytes_, src, dst_offset, n, dst_bytes_, "destination");
  std::memcpy(dst_ + dst_offset, src, n);
}

LoadStats load_staged(const GgufFile& f, const std::vector<LoadItem>& unsorted, StagingSink& sink,
                      const LoadOptions& opt) {
  const std::vector<LoadItem> items = sorted_checked(f, unsorted);
  const int slots = sink.slots();
  const uint64_t slot_bytes = sink.slot_bytes();
  if (slots < 1 || slot_bytes < kDirectIoAlignment) {
    throw std::invalid_argument(fmt::format("staging ring of {} x {} bytes is too small", slots, slot_bytes));
  }
  LoadStats st;
  st.staging_bytes = uint64_t(slots) * slot_bytes;
  st.n_tensors = items.size();
  st.bytes = total_bytes(items);

  DirectFd dfd(opt.direct_io && slot_bytes % kDirectIoAlignment == 0 ? f.path() : std::string());
  bool direct = dfd.get() >= 0;
  CacheDropper dropper(f);

  st.rss_peak_reset = reset_peak_rss();
  st.rss_before = current_rss_bytes();
  ProgressReporter prog{opt, st.bytes};

  size_t next = 0;  // first item not yet completely delivered
  int64_t piece = 0;
  size_t run_first = 0;
  while (run_first < items.size()) {
    // One run: consecutive items with gaps below kMaxGap, read sequentially.
    size_t run_last = run_first;
    uint64_t run_end = items[run_first].file_offset + items[run_first].nbytes;
    while (run_last + 1 < items.size() && items[run_last + 1].file_offset <= run_end + kMaxGap) {
      ++run_last;
      run_end = std::max(run_end, items[run_last].file_offset + items[run_last].nbytes);
    }
    uint64_t p = direct ? align_down(items[run_first].file_offset, kDirectIoAlignment) : items[run_first].file_offset;
    while (p < run_end) {
      const int s = int(piece % slots);
      sink.wait(s);
      uint8_t* buf = sink.slot(s);
      const uint64_t need = std::min(slot_bytes, run_end - p);  // bytes of this piece that matter
      uint64_t got = 0;
      if (direct) {
        const uint64_t len = std::min(slot_bytes, align_up_to(run_end - p, kDirectIoAlignment));
        const int64_t n = pread_direct(dfd.get(), buf, len, p);
        if (n < 0) {
          direct = false;  // refused after all: buffered from here on
          dfd.close_now();
        } else {
          got = uint64_t(n);
        }
      }
      if (!direct) {
        f.read_bytes(p, need, buf);
        dropper.after_read(p, need);  // read into the slot: the page cache copy is not needed again
        got = need;
      }
      if (got < need) {
        throw std::runtime_error(fmt::format("read of {} bytes at {} returned {} (file truncated?)", need, p, got));
      }
      st.bytes_read += got;
      const uint64_t piece_end = p + need;
      for (size_t i = next; i <= run_last && items[i].file_offset < piece_end; ++i) {
        const LoadItem& it = items[i];
        const uint64_t lo = std::max(p, it.file_offset), hi = std::min(piece_end, it.file_offset + it.nbytes);
        if (lo >= hi) continue;
        sink.copy(s, buf + (lo - p), it.dst_offset + (lo - it.file_offset), hi - lo);
        prog.add(hi - lo);
      }
      while (next <= run_last && items[next].file_offset + items[next].nbytes <= piece_end) ++next;
      sink.release(s);
      ++piece;
      p = piece_end;
      if (prog.done < prog.total) prog.report();
    }
    run_first = run_last + 1;
  }
  sink.finish();
  if (!direct) dropper.finish();
  st.seconds = seconds_since(prog.t0);
  st.direct_io = direct && !items.empty();
  st.rss_peak = peak_rss_bytes();
  prog.report();
  return st;
}

LoadStats load_direct(const GgufFile& f, const std::vector<LoadItem>& unsorted, uint8_t* dst, uint64_t dst_bytes,
                      const LoadOptions& opt) {
  const std::vector<LoadItem> items = sorted_checked(f, unsorted);
  const uint64_t piece = std::max<uint64_t>(opt.slot_bytes, kDirectIoAlignment);
  LoadStats st;
  st.n_tensors = items.size();
  st.bytes = total_bytes(items);
  st.rss_peak_reset = reset_peak_rss();
  st.rss_before = current_rss_bytes();
  ProgressReporter prog{opt, st.bytes};
  CacheDropper dropper(f);
  for (const auto& it : items) {
    if (it.dst_offset > dst_bytes || it.nbytes > dst_bytes - it.dst_offset) {
      throw std::out_of_range(fmt::format("tensor {}: {} bytes at {} are outside the {} byte destination", it.name,
                                          it.nbytes, it.dst_offset, dst_bytes));
    }
    for (uint64_t off = 0; off < it.nbytes; off += piece) {
      const uint64_t n = std::min(piece, it.nbytes - off);
      f.read_bytes(it.file_offset + off, n, dst + it.dst_offset + off);
      dropper.after_read(it.file_offset + off, n);
      st.bytes_read += n;
      prog.add(n);
      if (prog.done < prog.total) prog.report();
    }
  }
  dropper.finish();
  st.seconds = seconds_since(prog.t0);
  st.rss_peak = peak_rss_bytes();
  prog.report();
  return st;
}

double measure_file_read(const std::string& path, uint64_t max_bytes, uint64_t slot_bytes, bool* direct_io) {
  slot_bytes = std::max(align_up_to(slot_bytes, kDirectIoAlignment), kDirectIoAlignment);
  GgufFile f = GgufFile::open(path);
  const uint64_t size = std::min(max_bytes, f.file_size());
  uint8_t* buf = static_cast<uint8_t*>(std::aligned_alloc(kDirectIoAlignment, slot_bytes));
  if (!buf) throw std::bad_alloc();
  DirectFd dfd(path);
  bool direct = dfd.get() >= 0;
  CacheDropper dropper(f);
  const auto t0 = Clock::now();
  uint64_t done = 0;
  try {
    while (done < size) {
      const uint64_t need = std::min(slot_bytes, size - done);
      if (direct) {
        const int64_t n = pread_direct(dfd.get(), buf, align_up_to(need, kDirectIoAlignment), done);
        if (n >= 0) {
          if (uint64_t(n) < need) throw std::runtime_error("short read while measuring the file");
          done += need;
          continue;
        }
        direct = false;
      }
      f.read_bytes(done, need, buf);
      dropper.after_read(done, need);
      done += need;
    }
  } catch (...) {
    std::free(buf);
    throw;
  }
  std::free(buf);
  dropper.finish();
  if (direct_io) *direct_io = direct;
  const double s = seconds_since(t0);
  return s > 0 ? double(done) / s : 0.0;
}

uint64_t current_rss_bytes() { return proc_status_kb("VmRSS"); }
uint64_t peak_rss_bytes() { return proc_status_kb("VmHWM"); }

bool reset_peak_rss() {
  // Writing 5 to clear_refs resets the peak resident set size (Linux >= 4.0).
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return bool(out);
}

std::string format_progress(const LoadProgress& p) {
  const double gib = double(uint64_t(1) << 30);
  return fmt::format("{:.2f} of {:.2f} GiB ({:3.0f}%), {:.2f} GB/s, ETA {:.0f} s", double(p.done) / gib,
                     double(p.total) / gib, p.total ? 100.0 * double(p.done) / double(p.total) : 100.0,
                     p.rate() / 1e9, p.eta());
}

}  // namespace baton
