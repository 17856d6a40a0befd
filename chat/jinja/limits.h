// What one render of a chat template may spend. A model file's template is
// input from strangers: without limits a few bytes of it can recurse until
// the stack overflows, loop for hours or build gigabytes. RenderLimits says
// how much a render may take; the Meter counts it while the render runs and
// throws RenderError (value.h) at the first limit passed.
// docs/RELIABILITY.md ("Hostile chat templates") gives the reasons and the
// figures behind each default.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace baton::jinja {

struct Dict;

// One depth limit for everything that recurses, so that the stack a
// template uses does not grow with its size. At load: the parser's descent
// and the depth of every expression's syntax tree. While rendering, counted
// together: expression evaluation, statement blocks, macro calls, and the
// walks over nested lists and dicts (str, repr, tojson, ==, <, in). The
// lists and dicts a template builds nest at most this deep too (freeing them
// recurses that deep). The published templates need at most 48 levels for
// an ordinary conversation, and 323 (Kimi K3's recursive json_sorted macro)
// for a tool whose parameter schema nests as deep as the API's 64-level
// JSON allows. At the limit a render or a parse needs less than 2 MiB of
// stack under ASan + UBSan (the HostileJinja tests run at the limit on a
// 4 MiB thread, half of a default thread's 8 MiB).
inline constexpr int kMaxDepth = 512;

struct RenderLimits {
  // Statements run plus loop iterations.
  uint64_t max_steps = 5'000'000;
  // Units of work, about one per byte copied, scanned or compared (see the
  // prices below): at most about 1.5 s of CPU on a 2-core x86 VM.
  uint64_t max_work = uint64_t(2) << 30;
  // Bytes of strings, lists and dicts that the template built and that are
  // alive at once, its output included (the conversation it reads is not
  // counted). A published template builds a few times its output.
  size_t max_bytes = size_t(64) << 20;
  // A render past the deadline, or that sees *cancel set, throws. The clock
  // and the flag are read every kCheckEvery units of work.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  const std::atomic<bool>* cancel = nullptr;
};

// Prices in units of work: a statement, loop iteration or macro call, an
// expression node evaluated, a list item visited or copied (or a match
// found in a string), a dict entry made, a byte decoded as UTF-8 (case
// mapping, indexing by code point). A byte
// copied, scanned or compared costs one. A unit is about a nanosecond or
// less of the slowest of these on a 2-core x86 VM (docs/RELIABILITY.md).
inline constexpr uint64_t kStepWork = 64, kNodeWork = 32, kItemWork = 16, kEntryWork = 64, kCharWork = 4;
inline constexpr uint64_t kCheckEvery = uint64_t(1) << 20;
// Bytes charged for a built string beyond its characters, and per list item
// and dict entry (the heap objects around them).
inline constexpr size_t kStringBytes = 80, kItemBytes = 96, kEntryBytes = 136;
// The longest message raise_exception passes on (the rest is cut, "..."
// marks the cut): it ends up in an HTTP error body.
inline constexpr size_t kMaxRaiseBytes = 1000;

// The counters of one render, installed for its thread while it exists (a
// render runs on one thread). The value code charges the active meter; with
// none installed (parsing, converting the input) nothing is counted.
class Meter {
 public:
  explicit Meter(const RenderLimits& limits);
  // Clears every namespace the render made: a namespace can hold itself
  // (`{% set ns.self = ns %}`), a reference cycle that would otherwise keep
  // what it holds alive after the render.
  ~Meter();
  Meter(const Meter&) = delete;
  Meter& operator=(const Meter&) = delete;

  static Meter* active();

  void step();
  void work(uint64_t units) {
    work_ += units;
    if (work_ >= next_check_) poll();
  }
  // Checks the work, the deadline and the cancel flag now.
  void poll();
  // Throws unless `bytes` more fit in max_bytes (call before allocating).
  void need(size_t bytes) const;
  void charge(size_t bytes);
  void refund(size_t bytes) { *live_ -= bytes; }
  // The live-bytes counter, shared with what refunds it when freed.
  const std::shared_ptr<size_t>& live() const { return live_; }

  void enter() {
    if (++depth_ > kMaxDepth) too_deep();
  }
  void leave() { --depth_; }

  void adopt_namespace(std::shared_ptr<Dict> ns) { namespaces_.push_back(std::move(ns)); }

 private:
  [[noreturn]] void too_deep() const;

  RenderLimits limits_;
  std::chrono::steady_clock::time_point start_;
  uint64_t steps_ = 0, work_ = 0, next_check_ = kCheckEvery;
  int depth_ = 0;
  std::shared_ptr<size_t> live_ = std::make_shared<size_t>(0);
  std::vector<std::shared_ptr<Dict>> namespaces_;
  Meter* previous_;
};

// The same, on the active meter; nothing without one.
inline void work(uint64_t units) {
  if (Meter* m = Meter::active()) m->work(units);
}
inline void need_bytes(size_t bytes) {
  if (Meter* m = Meter::active()) m->need(bytes);
}

// One level of depth for the scope of a recursive call.
class DepthGuard {
 public:
  DepthGuard() : m_(Meter::active()) {
    if (m_) m_->enter();
  }
  explicit DepthGuard(Meter& m) : m_(&m) { m_->enter(); }
  ~DepthGuard() {
    if (m_) m_->leave();
  }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  Meter* m_;
};

// Namespaces alive in this process (they are the one value that can form a
// reference cycle; the tests check that a render frees every one it made).
size_t live_namespaces();

}  // namespace baton::jinja
