// The streaming loader on the CPU: a staged load through a tiny ring and a
// direct load put every tensor byte for byte where the layout says, for a
// whole model and for a middle slice (gaps in the file), with O_DIRECT and
// buffered reads; progress is monotonic and ends at the total.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "engine/model/arch.h"
#include "engine/gguf/file.h"
#include "engine/model/loader.h"
#include "engine/base/memory_plan.h"
#include "engine/model/model.h"
#include "engine/runtime/stage.h"
#include "gguf_split/synth.h"
#include "tests/test_util.h"

namespace baton {
namespace {

struct Fixture {
  test::TempDir dir;
  std::string path;
  explicit Fixture(uint64_t seed, DType type) {
    SynthConfig sc;
    sc.n_layer = 3;
    sc.n_embd = 256;
    sc.n_head = 4;
    sc.n_head_kv = 2;
    sc.n_ff = 512;
    sc.weight_type = type;
    sc.seed = seed;
    path = dir.file("model.gguf");
    write_synthetic_model(path, sc);
  }
};

struct ProgressLog {
  std::vector<LoadProgress> calls;
  std::function<void(const LoadProgress&)> fn() {
    return [this](const LoadProgress& p) { calls.push_back(p); };
  }
  void expect_monotonic(uint64_t total) const {
    ASSERT_FALSE(calls.empty());
    uint64_t last = 0;
    double last_s = 0;
    int finals = 0;
    for (const auto& p : calls) {
      EXPECT_EQ(p.total, total);
      EXPECT_GE(p.done, last);
      EXPECT_LE(p.done, p.total);
      EXPECT_GE(p.seconds, last_s);
      last = p.done;
      last_s = p.seconds;
      finals += p.done == p.total;
    }
    EXPECT_EQ(calls.back().done, total);
    EXPECT_EQ(finals, 1) << "the total is reported exactly once, at the end";
  }
};

// Every item of the layout equals GgufFile::read_tensor, and the bytes
// between tensors were not written (the destination starts poisoned).
void expect_loaded(const GgufFile& f, const std::vector<LoadItem>& items, const std::vector<uint8_t>& dst) {
  std::vector<char> covered(dst.size(), 0);
  for (const auto& it : items) {
    const GgufTensorInfo* t = f.find_tensor(it.name);
    ASSERT_NE(t, nullptr) << it.name;
    ASSERT_EQ(t->nbytes, it.nbytes);
    std::vector<uint8_t> want(t->nbytes);
    f.read_tensor(*t, want.data());
    EXPECT_EQ(std::memcmp(dst.data() + it.dst_offset, want.data(), want.size()), 0) << it.name;
    std::fill_n(covered.begin() + std::ptrdiff_t(it.dst_offset), it.nbytes, char(1));
  }
  for (size_t i = 0; i < dst.size(); ++i) {
    if (!covered[i]) {
      ASSERT_EQ(dst[i], 0xA5) << "byte " << i << " outside every tensor was written";
    }
  }
}

WeightLayout layout_of(const GgufFile& f, StageParts parts) {
  auto arch = Arch::from_gguf(f);
  return Model::plan(f, *arch, parts);
}

TEST(Loader, StagedTinyRingIsByteIdentical) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (DType type : {DType::F32, DType::Q4_K}) {
    Fixture fx(seed, type);
    GgufFile f = GgufFile::open(fx.path);
    // The whole model, then a middle layer alone: its tensors sit between
    // other layers' in the file, so the loader must skip the gaps.
    for (StageParts parts : {StageParts{{0, 2}, true, true}, StageParts{{1, 1}, false, false}}) {
      const WeightLayout wl = layout_of(f, parts);
      const auto items = load_items(wl);
      for (bool direct : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(type)) + " layers " + std::to_string(parts.layers.first) + "-" +
                     std::to_string(parts.layers.last) + (direct ? " O_DIRECT" : " buffered"));
        std::vector<uint8_t> dst(wl.bytes, 0xA5);
        HostStagingSink sink(dst.data(), dst.size(), 2, 64 << 10);
        ProgressLog log;
        LoadOptions lo;
        lo.slots = 2;
        lo.slot_bytes = 64 << 10;
        lo.direct_io = direct;
        lo.progress = log.fn();
        const LoadStats st = load_staged(f, items, sink, lo);
        expect_loaded(f, items, dst);
        uint64_t total = 0;
        for (const auto& it : items) total += it.nbytes;
        EXPECT_EQ(st.bytes, total);
        EXPECT_EQ(st.n_tensors, items.size());
        EXPECT_GE(st.bytes_read, total);
        EXPECT_EQ(st.staging_bytes, 2u * (64u << 10));
        if (!direct) {
          EXPECT_FALSE(st.direct_io);
        }
        log.expect_monotonic(total);
        // A 64 KiB ring over more than 64 KiB of tensors: many pieces.
        EXPECT_GE(log.calls.size(), total / (64 << 10));
      }
    }
  }
}

TEST(Loader, DirectLoadAndModelUseIt) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Fixture fx(seed + 1, DType::Q8_0);
  GgufFile f = GgufFile::open(fx.path);
  const WeightLayout wl = layout_of(f, {{0, 2}, true, true});
  const auto items = load_items(wl);
  std::vector<uint8_t> dst(wl.bytes, 0xA5);
  ProgressLog log;
  LoadOptions lo;
  lo.slot_bytes = 64 << 10;
  lo.progress = log.fn();
  const LoadStats st = load_direct(f, items, dst.data(), dst.size(), lo);
  expect_loaded(f, items, dst);
  log.expect_monotonic(st.bytes);
  EXPECT_EQ(st.staging_bytes, 0u);

  // The CPU stage loads through the same path and reports it.
  ProgressLog stage_log;
  LoadOptions slo;
  slo.progress = stage_log.fn();
  StageConfig sc;
  sc.n_ctx = 16;
  Stage stage(f, sc, slo);
  EXPECT_EQ(stage.load_stats().bytes, st.bytes);
  EXPECT_GT(stage.load_stats().rss_peak, 0u);
  stage_log.expect_monotonic(st.bytes);
}

// Bytes of the file in the page cache (mincore over a mapping that is never
// touched, so mapping it caches nothing).
uint64_t cached_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return 0;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  void* map = ::mmap(nullptr, size_t(size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> in((size_t(size) + size_t(page) - 1) / size_t(page));
  uint64_t n = 0;
  if (::mincore(map, size_t(size), in.data()) == 0) {
    for (unsigned char c : in) n += c & 1;
  }
  ::munmap(map, size_t(size));
  return n * uint64_t(page);
}

// Regression: dropping exactly the bytes of each read left half of the file
// cached, because the kernel drops only whole folios and readahead builds
// large ones that straddle the pieces (found by the cgroup load test).
TEST(Loader, BufferedLoadsLeaveTheFileOutOfThePageCache) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::TempDir dir;
  SynthConfig sc;
  sc.n_layer = 2;
  sc.n_embd = 512;
  sc.n_head = 8;
  sc.n_head_kv = 4;
  sc.n_ff = 1536;
  sc.seed = seed;
  const std::string path = dir.file("model.gguf");
  write_synthetic_model(path, sc);
  auto uncache = [&] {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  uncache();
  if (cached_bytes(path) > 0) GTEST_SKIP() << "this file system keeps the file cached (tmpfs?)";
  GgufFile f = GgufFile::open(path);
  const uint64_t file_size = f.file_size();
  const WeightLayout wl = layout_of(f, {{0, 1}, true, true});
  const auto items = load_items(wl);
  std::vector<uint8_t> dst(wl.bytes, 0xA5);
  LoadOptions lo;
  lo.slot_bytes = 1 << 20;  // pieces smaller than the tensors and the readahead folios
  load_direct(f, items, dst.data(), dst.size(), lo);
  // The header is read through other paths and may stay; the tensor data may not.
  EXPECT_LT(cached_bytes(path), file_size / 20) << "of " << file_size;
  expect_loaded(f, items, dst);  // (reads the file, so after the check)

  uncache();
  lo.direct_io = false;
  lo.slots = 2;
  HostStagingSink sink(dst.data(), dst.size(), 2, 1 << 20);
  load_staged(f, items, sink, lo);
  EXPECT_LT(cached_bytes(path), file_size / 20) << "of " << file_size;
}

TEST(Loader, RefusesBadInput) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Fixture fx(seed + 2, DType::F32);
  GgufFile f = GgufFile::open(fx.path);
  const WeightLayout wl = layout_of(f, {{0, 2}, true, true});
  auto items = load_items(wl);
  std::vector<uint8_t> dst(wl.bytes);
  // A destination too small for the layout.
  EXPECT_THROW(load_direct(f, items, dst.data(), dst.size() / 2, {}), std::out_of_range);
  {
    HostStagingSink small(dst.data(), dst.size() / 2, 2, 64 << 10);
    EXPECT_THROW(load_staged(f, items, small, {}), std::out_of_range);
  }
  // A slot that cannot hold an aligned read, and a tensor past the file.
  EXPECT_THROW(HostStagingSink(dst.data(), dst.size(), 2, 1000), std::invalid_argument);
  items.back().file_offset = f.file_size();
  HostStagingSink sink(dst.data(), dst.size(), 2, 64 << 10);
  EXPECT_THROW(load_staged(f, items, sink, {}), std::runtime_error);
}

TEST(Loader, MeasuresAndFormats) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Fixture fx(seed + 3, DType::F32);
  bool direct = false;
  EXPECT_GT(measure_file_read(fx.path, 1 << 20, 64 << 10, &direct), 0.0);
  EXPECT_GT(current_rss_bytes(), 0u);
  EXPECT_GE(peak_rss_bytes(), current_rss_bytes() / 2);
  const std::string s = format_progress({uint64_t(1) << 30, uint64_t(4) << 30, 2.0});
  EXPECT_NE(s.find("1.00 of 4.00 GiB"), std::string::npos) << s;
  EXPECT_NE(s.find("GB/s"), std::string::npos) << s;
  EXPECT_NE(s.find("ETA 6 s"), std::string::npos) << s;
}

}  // namespace
}  // namespace baton
