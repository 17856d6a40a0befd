// The meter of one render (see limits.h).
#include "chat/jinja/limits.h"

#include <fmt/format.h>

#include "chat/jinja/value.h"

namespace baton::jinja {
namespace {
thread_local Meter* g_active = nullptr;
}  // namespace

Meter::Meter(const RenderLimits& limits)
    : limits_(limits), start_(std::chrono::steady_clock::now()), previous_(g_active) {
  g_active = this;
}

Meter::~Meter() {
  g_active = previous_;
  // Emptying each namespace drops what it holds; the namespaces themselves
  // then go with the list (none holds another any more).
  for (const auto& ns : namespaces_) {
    std::vector<std::pair<std::string, Value>> items;
    items.swap(ns->items);
  }
}

Meter* Meter::active() { return g_active; }

void Meter::step() {
  if (++steps_ > limits_.max_steps)
    throw RenderError(fmt::format("the template runs too long (more than {} steps)", limits_.max_steps));
  work(kStepWork);
}

void Meter::poll() {
  next_check_ = work_ + kCheckEvery;
  if (work_ > limits_.max_work)
    throw RenderError(fmt::format("the template runs too long (more than {} units of work)", limits_.max_work));
  if (limits_.cancel && limits_.cancel->load(std::memory_order_relaxed))
    throw RenderError("the chat template's rendering was cancelled");
  if (limits_.deadline == std::chrono::steady_clock::time_point::max()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now > limits_.deadline) {
    const double s = std::chrono::duration<double>(now - start_).count();
    throw RenderError(fmt::format("the chat template ran longer than {:.2g} s (its deadline)", s));
  }
}

void Meter::need(size_t bytes) const {
  if (bytes <= limits_.max_bytes && *live_ <= limits_.max_bytes - bytes) return;
  const size_t max = limits_.max_bytes;
  throw RenderError(fmt::format("the template builds values larger than {} in all (its memory limit)",
                                max % (size_t(1) << 20) == 0 ? fmt::format("{} MiB", max >> 20)
                                                             : fmt::format("{} bytes", max)));
}

void Meter::charge(size_t bytes) {
  need(bytes);
  *live_ += bytes;
}

void Meter::too_deep() const {
  throw RenderError(fmt::format("recursion too deep (more than {} levels of expressions, statements, macro "
                                "calls and nested values)",
                                kMaxDepth));
}

}  // namespace baton::jinja
