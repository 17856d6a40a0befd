#include "coordinator/api/prompt_pool.h"

#include <algorithm>

namespace baton {

PromptPool::PromptPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

PromptPool::~PromptPool() { stop(); }

bool PromptPool::submit(Job job, Cancel cancel) {
  bool run_here = false;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return false;
    run_here = threads_.empty();
    if (!run_here) {
      if (queue_.size() >= max_queued_) return false;
      queue_.push_back({std::move(job), std::move(cancel)});
    }
  }
  if (run_here) {
    job(*cancel);  // a pool without threads: on the caller's
  } else {
    cv_.notify_one();
  }
  return true;
}

void PromptPool::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    for (const Cancel& c : running_) *c = true;
    for (Entry& e : queue_) *e.cancel = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
  std::lock_guard lock(mu_);
  threads_.clear();
}

void PromptPool::work() {
  for (;;) {
    Entry e;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to answer
      e = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) *e.cancel = true;
      running_.push_back(e.cancel);
    }
    try {
      e.job(*e.cancel);
    } catch (...) {
      // Jobs answer their own errors; one that throws anyway must not end the thread.
    }
    std::lock_guard lock(mu_);
    running_.erase(std::find(running_.begin(), running_.end(), e.cancel));
  }
}

}  // namespace baton
