// CPU reference kernels for the llama-family forward pass: RMS norm, rotary
// embedding (normal and NEOX pairing), softmax, SwiGLU, matmul of activations
// by a weight of any compute dtype, and causal attention with grouped-query
// heads over a KV cache.
//
// Conventions: activations are row-major float32, one row per token. A weight
// is a GGUF matrix: `rows` rows (output features) of `cols` elements (input
// features, ggml ne[0]), each row `row_bytes` bytes of its dtype. No kernel
// allocates; scratch comes from the caller.
#pragma once

#include <cmath>
#include <condition_variable>
#include <exception>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "kernels/quant.h"

namespace baton {

// A non-owning reference to a callable, so that handing work to the pool
// never allocates (std::function may).
template <typename Sig>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef>)
  FunctionRef(F&& f)  // NOLINT: implicit by design; f must outlive the call
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, Args... a) -> R { return (*static_cast<std::remove_reference_t<F>*>(o))(a...); }) {}
  R operator()(Args... a) const { return call_(obj_, a...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

// A fixed set of worker threads that split a range of independent tasks
// (output rows, heads) between themselves and the calling thread. Threads are
// created once; run() blocks until every task is done. Not reentrant: one
// run() at a time per pool.
class ThreadPool {
 public:
  // fn(begin, end, worker): handle tasks [begin, end); worker is in [0, size())
  // and indexes per-thread scratch.
  using Task = FunctionRef<void(int64_t, int64_t, int)>;

  explicit ThreadPool(int n_threads = 1);  // n_threads >= 1, counting the caller
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Splits [0, n_tasks) into contiguous chunks, one per thread. Work below
  // `min_tasks_per_thread` per thread runs on fewer threads (often just the
  // caller) because waking threads costs more than tiny work.
  void run(int64_t n_tasks, Task fn, int64_t min_tasks_per_thread = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  // The job of the current generation.
  const Task* job_ = nullptr;
  int64_t job_tasks_ = 0;
  int job_threads_ = 0;
  std::exception_ptr error_;  // first exception a worker caught in this job
};

// A weight matrix in its stored dtype (see the conventions above).
struct WeightView {
  DType type = DType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  uint64_t row_bytes = 0;
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + uint64_t(r) * row_bytes; }
};

enum class RopeMode {
  Normal,  // rotate adjacent pairs (2i, 2i+1): llama GGUFs store Q/K permuted for this
  Neox,    // rotate pairs (i, i + rot_dim/2): qwen2, qwen3
};

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; w may be null (no scale).
// out may alias x.
void rmsnorm(const float* x, const float* w, float* out, int64_t n, float eps);

// Rotates, in place, the first rot_dim dims of each of n_heads heads of
// head_dim floats (contiguous) for position pos. inv_freq[i] = base^(-2i/rot_dim)
// for i < rot_dim/2 (see rope_inv_freq). Dims past rot_dim are left as they are.
void rope(float* x, int n_heads, int head_dim, int rot_dim, int64_t pos, const float* inv_freq, RopeMode mode);
// Fills inv_freq[0 .. rot_dim/2).
void rope_inv_freq(float* inv_freq, int rot_dim, double freq_base);

// In place, numerically stable (subtracts the max).
void softmax(float* x, int64_t n);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// DeepSeek V4's SwiGLU: the gate clamped to at most limit and up to
// [-limit, limit] before silu(gate) * up; out may alias gate or up.
void swiglu_clamped(const float* gate, const float* up, float* out, int64_t n, float limit);

// Eight independent partial sums let the compiler vectorise without -ffast-math
// and keep the rounding independent of the thread count. Inline so that each
// caller's loop keeps it in registers.
inline float dot_f32_lanes8(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// out[t][r] = sum_c w[r][c] * x[t][c] for t < n_tokens, r < w.rows.
// x rows are x_stride floats apart, out rows out_stride floats apart.
// Threaded over output rows. out must not alias x.
// row_scratch (optional): pool.size() * w.cols floats. With it, each row of a
// non-F32 weight is dequantized once and reused for every token of the batch
// (prefill), instead of being decoded again per token by dot_row. Either way
// each output depends only on its row and token, not on the batch or threads.
void matmul(const float* x, int64_t n_tokens, int64_t x_stride, const WeightView& w, float* out,
            int64_t out_stride, ThreadPool& pool, float* row_scratch = nullptr);

// Causal attention over a KV cache.
struct AttentionArgs {
  int n_head = 0;       // query heads
  int n_head_kv = 0;    // key/value heads; n_head % n_head_kv == 0 (GQA group size)
  int head_dim_k = 0;   // q and k head width
  int head_dim_v = 0;   // v and output head width
  float scale = 0;      // usually 1/sqrt(head_dim_k)
  // q: n_tokens rows of n_head*head_dim_k floats, q_stride apart.
  const float* q = nullptr;
  int64_t q_stride = 0;
  int64_t n_tokens = 0;
  // Token t is at position pos0 + t and sees cache positions [0, pos0 + t].
  int64_t pos0 = 0;
  // Cache rows per position: k_cache[p * n_head_kv*head_dim_k], v_cache likewise;
  // rows [0, pos0 + n_tokens) must be filled.
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  // out: n_tokens rows of n_head*head_dim_v floats, out_stride apart.
  float* out = nullptr;
  int64_t out_stride = 0;
  // Per-thread scores: pool.size() * (pos0 + n_tokens) floats.
  float* scratch = nullptr;
};
void attention(const AttentionArgs& a, ThreadPool& pool);

}  // namespace baton
