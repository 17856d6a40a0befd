// The one scheduler of both engines: LocalEngine (a stage in this process)
// and ClusterEngine (a pipeline of workers) ask it which sequences run in
// the next batch, and share its admission rules.
//
// A step's batch holds, within a token budget (`--batch`): one decode token
// of every running sequence that is ready, then chunks of waiting prompts
// (chunked prefill), each at most prefill_chunk tokens. Decodes go first so
// that a long prompt never stalls the sequences already generating; a share
// of the budget stays for prompts whenever some wait, so that new requests
// start even when the decodes alone would fill it. Among sequences of one
// kind, the one that ran longest ago goes first (then the one admitted
// first): when the budget cannot take them all, every sequence still gets
// its turn.
//
// Admission is by KV capacity: a request takes a sequence slot (a KV cache
// of the whole context on every stage) when one is free; until then it
// waits in a FIFO queue, and beyond the queue's capacity it is refused with
// QueueFullError (HTTP 429), never admitted into memory that is not there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

namespace baton {

// What the planner needs to know of a sequence that holds a slot.
struct SchedSeq {
  int slot = 0;
  int64_t prompt_left = 0;  // prompt tokens not yet run; 0: decoding
  bool ready = false;       // may take a step now (none in flight; a decode has its input)
  uint64_t last_run = 0;    // the step it last ran in (0: never)
  uint64_t admitted = 0;    // admission order
};

struct SchedChunk {
  int slot = 0;
  int64_t n_tokens = 0;  // a prompt chunk, or 1 for a decode
  bool prefill = false;
};

// The next batch: ready decodes, then prompt chunks, within budget tokens.
std::vector<SchedChunk> plan_batch(std::span<const SchedSeq> seqs, int64_t budget, int64_t prefill_chunk);

// Throws QueueFullError when `running` sequences in slots and `waiting`
// queued requests leave no room for another (slots + queue capacity).
void check_admission(int running, int waiting, int slots, int queue_capacity);

// The queue steps of both engines, under their lock. Seq has `id` and `slot`.

// Moves the queued request with this id, if any, to `dropped`; false when
// it is not queued (it may hold a slot).
template <class Seq>
bool drop_queued(std::deque<std::unique_ptr<Seq>>& queue, uint64_t id, std::vector<std::unique_ptr<Seq>>& dropped) {
  auto it = std::find_if(queue.begin(), queue.end(), [&](const auto& q) { return q->id == id; });
  if (it == queue.end()) return false;
  dropped.push_back(std::move(*it));
  queue.erase(it);
  return true;
}

// Queued requests take the free slots in FIFO order: `choose(seq, free)`
// returns the free slot it takes (free[i]: slot i holds no request; the
// prefix cache's choice), and `admit` sees it (its slot set) before it
// enters the slot.
template <class Seq, class Choose, class Admit>
void admit_queued(std::deque<std::unique_ptr<Seq>>& queue, std::vector<std::unique_ptr<Seq>>& slots, Choose&& choose,
                  Admit&& admit) {
  std::vector<bool> free(slots.size());
  while (!queue.empty()) {
    for (size_t i = 0; i < slots.size(); ++i) free[i] = !slots[i];
    if (std::find(free.begin(), free.end(), true) == free.end()) return;
    std::unique_ptr<Seq> seq = std::move(queue.front());
    queue.pop_front();
    const int i = choose(*seq, free);
    seq->slot = i;
    admit(*seq);
    slots[size_t(i)] = std::move(seq);
  }
}

}  // namespace baton
