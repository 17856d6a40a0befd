#include "engine/cuda/graph_profile.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <map>
#include <thread>
#include <vector>

#include "engine/runtime/backend.h"
#include "kernels/cuda/common.cuh"

namespace baton::cuda {

namespace {

// Readable kernel name: demangled, without the argument list and namespaces.
std::string kernel_name(const void* func) {
  const char* raw = nullptr;
  if (cudaFuncGetName(&raw, func) != cudaSuccess || raw == nullptr) {
    (void)cudaGetLastError();
    return "?";
  }
  int status = 0;
  char* dem = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
  std::string s = status == 0 && dem ? dem : raw;
  std::free(dem);
  // Namespaces first (so "(anonymous namespace)" is not taken for the
  // parameter list), then the return type and the parameter list.
  for (const char* ns : {"(anonymous namespace)::", "baton::cuda::detail::", "baton::cuda::", "baton::"}) {
    for (size_t at; (at = s.find(ns)) != std::string::npos;) s.erase(at, std::strlen(ns));
  }
  if (s.rfind("void ", 0) == 0) s.erase(0, 5);
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) {
      s.resize(i);
      break;
    }
  }
  if (s.size() > 64) s = s.substr(0, 61) + "...";
  return s;
}

std::string kernel_node_name(const cudaKernelNodeParams& p) {
  return fmt::format("{} [{}x{}x{} x {}]", kernel_name(p.func), p.gridDim.x, p.gridDim.y, p.gridDim.z, p.blockDim.x);
}

// The nodes in an order that respects every edge (Kahn's algorithm).
std::vector<cudaGraphNode_t> ordered_nodes(cudaGraph_t g) {
  size_t n = 0;
  BATON_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  BATON_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
  size_t m = 0;
  BATON_CUDA_CHECK(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &m));
  // With the edge data: programmatic edges refuse a query without it.
  std::vector<cudaGraphNode_t> from(m), to(m);
  std::vector<cudaGraphEdgeData> data(m);
  if (m > 0) BATON_CUDA_CHECK(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &m));
  std::map<cudaGraphNode_t, int> indeg;
  std::map<cudaGraphNode_t, std::vector<cudaGraphNode_t>> out;
  for (auto v : nodes) indeg[v] = 0;
  for (size_t e = 0; e < m; ++e) {
    ++indeg[to[e]];
    out[from[e]].push_back(to[e]);
  }
  std::vector<cudaGraphNode_t> order, ready;
  for (auto v : nodes) {
    if (indeg[v] == 0) ready.push_back(v);
  }
  while (!ready.empty()) {
    cudaGraphNode_t v = ready.front();
    ready.erase(ready.begin());
    order.push_back(v);
    for (auto w : out[v]) {
      if (--indeg[w] == 0) ready.push_back(w);
    }
  }
  return order;
}

// Median replay time of `exec` over 20 launches (after one warm-up), with
// the minimum and maximum.
struct Replay {
  float median = 0, min = 0, max = 0;
};
Replay time_replay(cudaGraphExec_t exec, cudaStream_t stream) {
  cudaEvent_t a, b;
  BATON_CUDA_CHECK(cudaEventCreate(&a));
  BATON_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 21; ++r) {
    BATON_CUDA_CHECK(cudaEventRecord(a, stream));
    BATON_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    BATON_CUDA_CHECK(cudaEventRecord(b, stream));
    BATON_CUDA_CHECK(cudaStreamSynchronize(stream));
    float ms = 0;
    BATON_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    if (r > 0) t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return {t[t.size() / 2], t.front(), t.back()};
}

void hold_stream(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }

}  // namespace

std::string profile_graph(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream, int passes) {
  const std::vector<cudaGraphNode_t> order = graph ? ordered_nodes(graph) : std::vector<cudaGraphNode_t>{};
  const size_t n = order.size();
  std::vector<std::string> names(n);
  std::vector<cudaGraphNodeType> types(n);
  std::vector<cudaKernelNodeParams> kp(n);
  std::vector<cudaMemcpy3DParms> cp(n);
  std::vector<cudaMemsetParams> sp(n);
  for (size_t i = 0; i < n; ++i) {
    BATON_CUDA_CHECK(cudaGraphNodeGetType(order[i], &types[i]));
    if (types[i] == cudaGraphNodeTypeKernel) {
      BATON_CUDA_CHECK(cudaGraphKernelNodeGetParams(order[i], &kp[i]));
      names[i] = kernel_node_name(kp[i]);
    } else if (types[i] == cudaGraphNodeTypeMemcpy) {
      BATON_CUDA_CHECK(cudaGraphMemcpyNodeGetParams(order[i], &cp[i]));
      names[i] = "memcpy";
    } else if (types[i] == cudaGraphNodeTypeMemset) {
      BATON_CUDA_CHECK(cudaGraphMemsetNodeGetParams(order[i], &sp[i]));
      names[i] = "memset";
    } else {
      names[i] = fmt::format("node type {} (skipped)", int(types[i]));
    }
  }
  std::vector<cudaEvent_t> ev(n + 1);
  for (auto& e : ev) BATON_CUDA_CHECK(cudaEventCreate(&e));
  std::vector<std::vector<float>> us(n);
  for (int p = 0; p < passes; ++p) {
    BATON_CUDA_CHECK(cudaLaunchHostFunc(stream, hold_stream, nullptr));
    for (size_t i = 0; i < n; ++i) {
      BATON_CUDA_CHECK(cudaEventRecord(ev[i], stream));
      if (types[i] == cudaGraphNodeTypeKernel) {
        BATON_CUDA_CHECK(cudaLaunchKernel(kp[i].func, kp[i].gridDim, kp[i].blockDim, kp[i].kernelParams,
                                          kp[i].sharedMemBytes, stream));
      } else if (types[i] == cudaGraphNodeTypeMemcpy) {
        BATON_CUDA_CHECK(cudaMemcpy3DAsync(&cp[i], stream));
      } else if (types[i] == cudaGraphNodeTypeMemset) {
        const cudaMemsetParams& s = sp[i];
        if (s.elementSize == 1) {
          BATON_CUDA_CHECK(cudaMemset2DAsync(s.dst, s.pitch, int(s.value), s.width, s.height, stream));
        }
      }
    }
    BATON_CUDA_CHECK(cudaEventRecord(ev[n], stream));
    BATON_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (size_t i = 0; i < n; ++i) {
      float ms = 0;
      BATON_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
      us[i].push_back(ms * 1000.0f);
    }
  }
  // Median pass per node, summed by name.
  std::map<std::string, std::pair<int, double>> by_name;
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> v = us[i];
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    const double t = v[v.size() / 2];
    auto& r = by_name[names[i]];
    ++r.first;
    r.second += t;
    total += t;
  }
  std::vector<std::pair<std::string, std::pair<int, double>>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  std::string s;
  if (n > 0) s = fmt::format("graph profile: {} nodes, node-by-node sum {:.1f} us\n", n, total);
  if (n > 0) {
    s += fmt::format("{:>9} {:>6} {:>8} {:>6}  {}\n", "total_us", "count", "mean_us", "share",
                     "kernel [grid x threads]");
  }
  for (const auto& [name, r] : rows) {
    s += fmt::format("{:9.1f} {:6d} {:8.2f} {:5.1f}%  {}\n", r.second, r.first, r.second / r.first,
                     100.0 * r.second / total, name);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  if (exec) {
    const Replay r = time_replay(exec, stream);
    s += fmt::format("graph replay: median {:.3f} ms (min {:.3f}, max {:.3f}) over 20\n", r.median, r.min, r.max);
  }
  return s;
}

std::string marginal_costs(cudaGraph_t graph, cudaStream_t stream) {
  size_t n = 0;
  BATON_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  BATON_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  std::map<std::string, std::vector<cudaGraphNode_t>> by_name;
  for (cudaGraphNode_t v : nodes) {
    cudaGraphNodeType type;
    BATON_CUDA_CHECK(cudaGraphNodeGetType(v, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams p;
    BATON_CUDA_CHECK(cudaGraphKernelNodeGetParams(v, &p));
    by_name[kernel_node_name(p)].push_back(v);
  }
  cudaGraphExec_t exec = nullptr;
  BATON_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const float base = time_replay(exec, stream).median;
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [name, vs] : by_name) {
    for (cudaGraphNode_t v : vs) BATON_CUDA_CHECK(cudaGraphNodeSetEnabled(exec, v, 0));
    const float without = time_replay(exec, stream).median;
    for (cudaGraphNode_t v : vs) BATON_CUDA_CHECK(cudaGraphNodeSetEnabled(exec, v, 1));
    const double saved = 1000.0 * (base - without);
    rows.emplace_back(saved,
                      fmt::format("{:9.1f} {:6d} {:8.2f}  {}\n", saved, vs.size(), saved / double(vs.size()), name));
  }
  cudaGraphExecDestroy(exec);
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s =
      fmt::format("marginal cost in the replay ({:.3f} ms): the replay with one kernel's nodes disabled\n", base);
  s += fmt::format("{:>9} {:>6} {:>8}  {}\n", "saved_us", "count", "per_us", "kernel [grid x threads]");
  for (const auto& r : rows) s += r.second;
  return s;
}

DecodeProfiler::~DecodeProfiler() {
  if (graph_) cudaGraphDestroy(graph_);
}

void DecodeProfiler::keep(cudaGraph_t graph) {
  if (!stage_profiling() || graph_) return;
  BATON_CUDA_CHECK(cudaGraphClone(&graph_, graph));
}

void DecodeProfiler::report(cudaGraphExec_t exec, cudaStream_t stream, int64_t position,
                            const std::function<void()>& enqueue_step) {
  const bool due = graph_ && steps_ >= 10;
  steps_ = 0;
  if (!due) return;
  BATON_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::string table = profile_graph(graph_, exec, stream, /*passes=*/5);
  std::fprintf(stderr, "== decode at position %lld\n%s", static_cast<long long>(position), table.c_str());
  std::fprintf(stderr, "%s", marginal_costs(graph_, stream).c_str());
  // A/B in this process: the same step re-captured without programmatic
  // launch, then with it again.
  for (const bool pdl : {false, true}) {
    set_programmatic_launch(pdl);
    cudaGraph_t g = nullptr;
    BATON_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_step();
    } catch (...) {
      cudaStreamEndCapture(stream, &g);
      if (g) cudaGraphDestroy(g);
      set_programmatic_launch(true);
      throw;
    }
    BATON_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
    set_programmatic_launch(true);
    cudaGraphExec_t variant = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&variant, g, 0);
    size_t nodes = 0;
    if (err == cudaSuccess) BATON_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
    cudaGraphDestroy(g);
    BATON_CUDA_CHECK(err);
    const std::string t = profile_graph(nullptr, variant, stream, 0);
    cudaGraphExecDestroy(variant);
    std::fprintf(stderr, "variant pdl=%d (%zu nodes): %s", int(pdl), nodes, t.c_str());
  }
}

}  // namespace baton::cuda
