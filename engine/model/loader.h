// The streaming weight loader (docs/MEMORY.md, rule 3: bounded staging).
//
// Reads the tensors of a stage's slice from the GGUF file with pread and puts
// each at its planned offset inside the one weight allocation. Two ways:
//
//   load_staged  file -> a fixed ring of staging buffers -> destination.
//                The ring belongs to a StagingSink: pinned host buffers and
//                asynchronous copies to the device for the CUDA backend
//                (engine/cuda/), plain memcpy for tests. The file is read in
//                large aligned runs with O_DIRECT where the file system allows
//                it (else buffered reads that drop the page cache behind
//                themselves), so host memory is the ring whatever the model.
//   load_direct  file -> host destination (CPU backend: the weights live in
//                host memory, so no staging), buffered pread in pieces of at
//                most one slot, dropping the page cache behind each piece.
//
// Neither maps the file or pins/registers more than the ring. Both report
// progress (bytes, rate, ETA through a callback) and measure the load.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace baton {

class GgufFile;
struct WeightLayout;

// One tensor to load: bytes [file_offset, file_offset + nbytes) of the file
// go to [dst_offset, dst_offset + nbytes) of the destination.
struct LoadItem {
  std::string name;
  uint64_t file_offset = 0;
  uint64_t nbytes = 0;
  uint64_t dst_offset = 0;
};

// The distinct tensors of a layout (a tied tensor once), in file order.
std::vector<LoadItem> load_items(const WeightLayout& layout);

struct LoadProgress {
  uint64_t done = 0;   // tensor bytes delivered to their place (queued, for a staged load)
  uint64_t total = 0;  // tensor bytes of the whole load
  double seconds = 0;  // since the load started
  double rate() const { return seconds > 0 ? double(done) / seconds : 0.0; }           // bytes/s
  double eta() const { return rate() > 0 ? double(total - done) / rate() : 0.0; }     // seconds
};

struct LoadOptions {
  uint64_t slot_bytes = uint64_t(64) << 20;  // one staging buffer (and the largest single read)
  int slots = 4;                             // buffers in the ring
  bool direct_io = true;                     // try O_DIRECT for staged loads
  // Called on the loading thread after each piece, and once at the end with
  // done == total. Progress is monotonic.
  std::function<void(const LoadProgress&)> progress;
};

struct LoadStats {
  uint64_t bytes = 0;          // tensor bytes loaded
  uint64_t bytes_read = 0;     // bytes read from the file (aligned runs, small gaps included)
  uint64_t n_tensors = 0;
  double seconds = 0;
  bool direct_io = false;      // O_DIRECT was used for the whole load
  uint64_t staging_bytes = 0;  // the ring (0 for a direct load)
  // Host memory (VmRSS, VmHWM of /proc/self/status): before the load, and the
  // peak during it. The peak is reset just before the load where the kernel
  // allows it (/proc/self/clear_refs), so peak - before is the load's own cost.
  // A caller that allocates the ring itself (the CUDA stage's pinned ring)
  // replaces rss_before with its reading from before the ring.
  uint64_t rss_before = 0;
  uint64_t rss_peak = 0;
  bool rss_peak_reset = false;  // false: rss_peak is the process's peak since start
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

// The destination side of a staged load. The loader owns the order: for each
// piece it waits for a slot, reads into it, queues the copies out of it and
// releases it.
class StagingSink {
 public:
  virtual ~StagingSink() = default;
  virtual int slots() const = 0;
  virtual uint64_t slot_bytes() const = 0;
  // Slot i's buffer, aligned to kDirectIoAlignment.
  virtual uint8_t* slot(int i) = 0;
  // Blocks until every copy queued from slot i has completed.
  virtual void wait(int i) = 0;
  // Queues a copy of n bytes at src (inside slot i) to dst_offset of the
  // destination.
  virtual void copy(int i, const uint8_t* src, uint64_t dst_offset, uint64_t n) = 0;
  // No more copies from slot i until the next wait(i).
  virtual void release(int i) = 0;
  // Blocks until every queued copy has completed.
  virtual void finish() = 0;
};

// O_DIRECT wants file offsets, lengths and buffers aligned to the logical
// block size; 4096 covers every common device.
inline constexpr uint64_t kDirectIoAlignment = 4096;

// The checks every staging ring makes, whatever memory it copies into (the
// host ring below, the CUDA build's pinned ring). check_staging_ring throws
// std::invalid_argument unless there is at least one slot of a multiple of
// kDirectIoAlignment; staging_slot gives slot i of the ring and
// check_staging_copy refuses a source outside that slot or a destination
// range outside dst_bytes (std::out_of_range; `destination` names it).
void check_staging_ring(int slots, uint64_t slot_bytes);
uint8_t* staging_slot(uint8_t* ring, int slots, uint64_t slot_bytes, int i);
void check_staging_copy(const uint8_t* slot, uint64_t slot_bytes, const uint8_t* src, uint64_t dst_offset, uint64_t n,
                        uint64_t dst_bytes, const char* destination);

// A ring of host buffers copying synchronously into a host destination: the
// CPU-side stand-in for the pinned ring (tests; a staged load into host memory).
class HostStagingSink : public StagingSink {
 public:
  HostStagingSink(uint8_t* dst, uint64_t dst_bytes, int slots, uint64_t slot_bytes);
  ~HostStagingSink() override;
  HostStagingSink(const HostStagingSink&) = delete;
  HostStagingSink& operator=(const HostStagingSink&) = delete;
  int slots() const override { return slots_; }
  uint64_t slot_bytes() const override { return slot_bytes_; }
  uint8_t* slot(int i) override;
  void wait(int) override {}
  void copy(int i, const uint8_t* src, uint64_t dst_offset, uint64_t n) override;
  void release(int) override {}
  void finish() override {}

 private:
  uint8_t* dst_;
  uint64_t dst_bytes_;
  int slots_;
  uint64_t slot_bytes_;
  uint8_t* ring_ = nullptr;
};

// Throws std::runtime_error on a read error or an item outside the file,
// std::invalid_argument on a ring too small for aligned reads.
LoadStats load_staged(const GgufFile& f, const std::vector<LoadItem>& items, StagingSink& sink,
                      const LoadOptions& options);
LoadStats load_direct(const GgufFile& f, const std::vector<LoadItem>& items, uint8_t* dst, uint64_t dst_bytes,
                      const LoadOptions& options);

// Sequential read speed of the file (bytes/s): up to max_bytes from the start
// of the data section with O_DIRECT where allowed (else buffered, dropping
// the page cache), in reads of slot_bytes. For comparing a load with the disk.
double measure_file_read(const std::string& path, uint64_t max_bytes, uint64_t slot_bytes, bool* direct_io = nullptr);

// VmRSS / VmHWM of this process in bytes (0 when /proc is unavailable).
uint64_t current_rss_bytes();
uint64_t peak_rss_bytes();
// Resets VmHWM to the current RSS; false where the kernel does not allow it.
bool reset_peak_rss();

// "1.23 GiB of 4.56 GiB (27%), 2.10 GB/s, ETA 2 s": for progress lines.
std::string format_progress(const LoadProgress& p);

}  // namespace baton
