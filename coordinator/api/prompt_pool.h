// The threads that turn request bodies into prompts (parse, render the chat
// template, tokenize), off the HTTP threads: a template from a model file is
// input from strangers and may take its whole time limit, and the HTTP
// threads must keep answering /health and reading sockets meanwhile.
//
// Each job gets a cancel flag: set when its client leaves (the caller wires
// the exchange's abort to it) and when the pool stops, so that a server
// asked to stop does not wait for renders in progress. Jobs still queued
// when the pool stops run with the flag already set (they answer at once,
// e.g. 503), so that no exchange is dropped unanswered.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace baton {

class PromptPool {
 public:
  using Cancel = std::shared_ptr<std::atomic<bool>>;
  using Job = std::function<void(const std::atomic<bool>& cancel)>;

  // `threads` workers; at most `max_queued` jobs wait beyond those running.
  // With 0 threads, submit() runs each job at once on the caller's thread
  // (a harness that needs the answer before handle() returns).
  PromptPool(int threads, size_t max_queued);
  ~PromptPool();  // stop()

  // Queues job; false (job dropped) when the queue is full or the pool has stopped.
  bool submit(Job job, Cancel cancel);
  bool stopping() const {
    std::lock_guard lock(mu_);
    return stopping_;
  }
  // Sets every job's cancel flag, lets the queued ones run (cancelled) and
  // joins the threads. Idempotent.
  void stop();

 private:
  struct Entry {
    Job job;
    Cancel cancel;
  };
  void work();

  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  std::vector<Cancel> running_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace baton
