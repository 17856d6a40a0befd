// The checkpoint contract of speculative decoding's target side
// (docs/SPECULATIVE.md), shared by every backend's stage so that they accept
// and refuse the same forwards and cuts with the same messages: the CPU
// Stage and the CUDA deepseek4 stage hold one SpecCheckpoint each and ask
// these functions what a call may do; each then copies its own rows.
#pragma once

#include <cstdint>

namespace baton {

class Arch;
struct ForwardOptions;
struct StageConfig;

// The last checkpointed forward of a stage (seq -1: none): a cut of seq may
// land anywhere in [pos0, pos0 + n] while no other forward has run on seq.
struct SpecCheckpoint {
  int seq = -1;
  int64_t pos0 = 0;
  int64_t n = 0;
};

// Checks a forward_rows call of n_tokens against the stage's config before
// anything runs: the logit rows it asks for (verify_rows, or any with
// all_logits), a checkpoint of at most verify_rows tokens, capture only
// with capture_layers. Throws std::invalid_argument naming the limit.
void check_forward_options(const StageConfig& c, int64_t n_tokens, const ForwardOptions& o);

// What truncate_seq(seq, n) must do on a sequence holding `have` positions.
enum class SpecCut {
  Nothing,   // n == have
  Reset,     // n == 0
  Truncate,  // the architecture's KV can be cut anywhere (Arch::kv_truncatable)
  Restore,   // put back the checkpoint's rows of positions n and later, then set the length
};
// Throws std::out_of_range beyond the positions and std::invalid_argument
// for a cut outside `last` (which must already be dropped, seq -1, when a
// forward ran on seq after it), naming what could be kept.
SpecCut plan_cut(const Arch& arch, const SpecCheckpoint& last, int seq, int64_t have, int64_t n);

}  // namespace baton
