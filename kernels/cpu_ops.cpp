#include "kernels/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace baton {

// ---------------------------------------------------------------- ThreadPool

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads < 1) throw std::invalid_argument("ThreadPool: thread count must be >= 1, got " + std::to_string(n_threads));
  workers_.reserve(size_t(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

namespace {
// Chunk c of n tasks split between k threads: contiguous, sizes differ by at most one.
inline int64_t chunk_begin(int64_t n, int k, int c) { return n * c / k; }
}  // namespace

void ThreadPool::run(int64_t n_tasks, Task fn, int64_t min_tasks_per_thread) {
  if (n_tasks <= 0) return;
  min_tasks_per_thread = std::max<int64_t>(1, min_tasks_per_thread);
  int64_t by_work = (n_tasks + min_tasks_per_thread - 1) / min_tasks_per_thread;
  int threads = int(std::min<int64_t>(size(), by_work));
  if (threads <= 1) {
    fn(0, n_tasks, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_tasks_ = n_tasks;
    job_threads_ = threads;
    pending_ = threads - 1;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0, chunk_begin(n_tasks, threads, 1), 0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const Task* job;
    int64_t n;
    int k;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= job_threads_) continue;  // this job is too small to need us
      job = job_;
      n = job_tasks_;
      k = job_threads_;
    }
    std::exception_ptr err;
    try {
      (*job)(chunk_begin(n, k, index), chunk_begin(n, k, index + 1), index);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_.notify_one();
  }
}

// ---------------------------------------------------------------- elementwise

void rmsnorm(const float* x, const float* w, float* out, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

void rope_inv_freq(float* inv_freq, int rot_dim, double freq_base) {
  for (int i = 0; i < rot_dim / 2; ++i) inv_freq[i] = float(std::pow(freq_base, -2.0 * i / rot_dim));
}

void rope(float* x, int n_heads, int head_dim, int rot_dim, int64_t pos, const float* inv_freq, RopeMode mode) {
  const int half = rot_dim / 2;
  for (int i = 0; i < half; ++i) {
    // The angle in double: positions reach 10^5 and float would lose digits.
    double theta = double(pos) * double(inv_freq[i]);
    float c = float(std::cos(theta)), s = float(std::sin(theta));
    int a = mode == RopeMode::Normal ? 2 * i : i;
    int b = mode == RopeMode::Normal ? 2 * i + 1 : i + half;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + int64_t(h) * head_dim;
      float x0 = v[a], x1 = v[b];
      v[a] = x0 * c - x1 * s;
      v[b] = x0 * s + x1 * c;
    }
  }
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  float inv = float(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

namespace {

// Both reads come before the write, so out may alias gate or up.
template <bool kClamp>
void swiglu_impl(const float* gate, const float* up, float* out, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i], u = up[i];
    if constexpr (kClamp) {
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
    }
    out[i] = silu(g) * u;
  }
}

}  // namespace

void swiglu(const float* gate, const float* up, float* out, int64_t n) { swiglu_impl<false>(gate, up, out, n, 0.0f); }

void swiglu_clamped(const float* gate, const float* up, float* out, int64_t n, float limit) {
  swiglu_impl<true>(gate, up, out, n, limit);
}

// ---------------------------------------------------------------- matmul

void matmul(const float* x, int64_t n_tokens, int64_t x_stride, const WeightView& w, float* out,
            int64_t out_stride, ThreadPool& pool, float* row_scratch) {
  // Rows outside, tokens inside: each weight row is read from memory once per
  // batch and reused from cache for every token.
  auto task = [&](int64_t r0, int64_t r1, int worker) {
    if (w.type == DType::F32) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* wr = reinterpret_cast<const float*>(w.row(r));
        for (int64_t t = 0; t < n_tokens; ++t) out[t * out_stride + r] = dot_f32_lanes8(wr, x + t * x_stride, w.cols);
      }
    } else if (row_scratch) {
      float* wr = row_scratch + int64_t(worker) * w.cols;
      for (int64_t r = r0; r < r1; ++r) {
        dequantize_row(w.type, w.row(r), wr, w.cols);
        for (int64_t t = 0; t < n_tokens; ++t) out[t * out_stride + r] = dot_f32_lanes8(wr, x + t * x_stride, w.cols);
      }
    } else {
      for (int64_t r = r0; r < r1; ++r) {
        const uint8_t* wr = w.row(r);
        for (int64_t t = 0; t < n_tokens; ++t) out[t * out_stride + r] = dot_row(w.type, wr, x + t * x_stride, w.cols);
      }
    }
  };
  // About 64K multiply-adds per thread before another thread is worth waking.
  int64_t per_row = std::max<int64_t>(1, w.cols * n_tokens);
  pool.run(w.rows, task, std::max<int64_t>(1, 65536 / per_row));
}

// ---------------------------------------------------------------- attention

void attention(const AttentionArgs& a, ThreadPool& pool) {
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0) {
    throw std::invalid_argument("attention: n_head " + std::to_string(a.n_head) + " is not a multiple of n_head_kv " +
                                std::to_string(a.n_head_kv));
  }
  const int group = a.n_head / a.n_head_kv;
  const int64_t k_row = int64_t(a.n_head_kv) * a.head_dim_k;
  const int64_t v_row = int64_t(a.n_head_kv) * a.head_dim_v;
  const int64_t scratch_stride = a.pos0 + a.n_tokens;
  // One task per (token, query head).
  auto task = [&](int64_t i0, int64_t i1, int worker) {
    float* scores = a.scratch + int64_t(worker) * scratch_stride;
    for (int64_t i = i0; i < i1; ++i) {
      int64_t t = i / a.n_head;
      int h = int(i % a.n_head);
      int kvh = h / group;
      const float* q = a.q + t * a.q_stride + int64_t(h) * a.head_dim_k;
      int64_t n_pos = a.pos0 + t + 1;  // causal: itself and everything before
      const float* k = a.k_cache + int64_t(kvh) * a.head_dim_k;
      for (int64_t p = 0; p < n_pos; ++p) scores[p] = a.scale * dot_f32_lanes8(q, k + p * k_row, a.head_dim_k);
      softmax(scores, n_pos);
      float* o = a.out + t * a.out_stride + int64_t(h) * a.head_dim_v;
      std::fill(o, o + a.head_dim_v, 0.0f);
      const float* v = a.v_cache + int64_t(kvh) * a.head_dim_v;
      for (int64_t p = 0; p < n_pos; ++p) {
        const float s = scores[p];
        const float* vp = v + p * v_row;
        for (int d = 0; d < a.head_dim_v; ++d) o[d] += s * vp[d];
      }
    }
  };
  int64_t per_task = std::max<int64_t>(1, (a.pos0 + a.n_tokens) * (a.head_dim_k + a.head_dim_v));
  pool.run(a.n_tokens * a.n_head, task, std::max<int64_t>(1, 32768 / per_task));
}

}  // namespace baton
