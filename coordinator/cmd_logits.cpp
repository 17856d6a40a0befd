// `baton logits -m MODEL --tokens "1,2,3" [--backend cpu|cuda] -o FILE`: runs
// token ids through the whole model and writes the logits of every position,
// n_tokens rows of n_vocab floats, as raw little-endian f32 or as .npy (when
// FILE ends in .npy). It is the hook for oracles: another implementation
// (transformers, llama.cpp) computes the same rows and a script compares.
#include <boost/program_options.hpp>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "engine/backend.h"
#include "engine/gguf.h"

namespace baton {
namespace {

namespace po = boost::program_options;

// The refusal of an unavailable backend: exit status 2, as `baton run` does.
struct BackendRefused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::vector<int32_t> parse_tokens(const std::string& s) {
  std::vector<int32_t> ids;
  const char* p = s.data();
  const char* end = p + s.size();
  while (p < end) {
    while (p < end && (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t')) ++p;
    if (p == end) break;
    int32_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || v < 0) {
      throw std::invalid_argument("--tokens: '" + std::string(p, std::min<size_t>(12, size_t(end - p))) +
                                  "' is not a token id (comma-separated non-negative integers)");
    }
    ids.push_back(v);
    p = next;
  }
  if (ids.empty()) throw std::invalid_argument("--tokens: no token ids given");
  return ids;
}

// NumPy format 1.0: magic, version, header length (u16), a Python dict
// literal padded with spaces to a 64-byte boundary and ending in '\n'.
std::string npy_header(uint64_t rows, uint64_t cols) {
  std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows) + ", " +
                     std::to_string(cols) + "), }";
  const size_t fixed = 10;  // magic (6) + version (2) + length (2)
  size_t total = fixed + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - fixed - dict.size() - 1, ' ');
  dict += '\n';
  std::string h = "\x93NUMPY";
  h += char(1);
  h += char(0);
  h += char(dict.size() & 0xff);
  h += char(dict.size() >> 8);
  return h + dict;
}

void write_all(FILE* f, const void* p, size_t n, const std::string& path) {
  if (std::fwrite(p, 1, n, f) != n) throw std::runtime_error("cannot write " + path + ": " + std::strerror(errno));
}

}  // namespace

int cmd_logits(int argc, char** argv) {
  std::string model, tokens, out, backend_name_arg = "cpu";
  int n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  int64_t batch = 64;
  po::options_description opts(
      "usage: baton logits -m MODEL --tokens IDS -o FILE [options]\n\n"
      "Runs the token ids through the whole model (from position 0, no BOS added)\n"
      "and writes the logits of every position: n_tokens rows of n_vocab float32,\n"
      "raw little-endian, or NumPy .npy when FILE ends in .npy.\n\noptions");
  opts.add_options()
      ("help,h", "show this help")
      ("model,m", po::value(&model), "GGUF model file")
      ("tokens", po::value(&tokens), "token ids, comma-separated (e.g. \"1,2,3\")")
      ("output,o", po::value(&out), "file to write (.npy: NumPy format; else raw f32)")
      ("backend", po::value(&backend_name_arg), "cpu (default) or cuda")
      ("threads,t", po::value(&n_threads), "CPU threads (default: all cores)")
      ("batch,b", po::value(&batch), "tokens per forward pass (default 64)");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(opts).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::fprintf(stderr, "baton logits: %s (see baton logits --help)\n", e.what());
    return 1;
  }
  if (vm.count("help")) {
    std::cout << opts << "\n";
    return 0;
  }
  try {
    if (model.empty() || tokens.empty() || out.empty()) {
      throw std::invalid_argument("-m, --tokens and -o are required (see baton logits --help)");
    }
    if (n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
    if (batch < 1) throw std::invalid_argument("--batch must be >= 1");
    auto backend = backend_from_name(backend_name_arg);
    if (!backend) throw std::invalid_argument("--backend must be cpu or cuda, got '" + backend_name_arg + "'");
    if (std::string why = backend_unavailable(*backend); !why.empty()) throw BackendRefused(why);
    const std::vector<int32_t> ids = parse_tokens(tokens);

    GgufFile file = GgufFile::open(model);
    StageConfig sc;
    sc.n_ctx = int64_t(ids.size());
    sc.n_threads = n_threads;
    sc.max_batch = batch;
    sc.all_logits = true;
    std::unique_ptr<StageRunner> stage = make_stage_runner(*backend, file, sc);
    const int64_t V = stage->n_vocab();
    for (int32_t id : ids) {
      if (id >= V) throw std::out_of_range("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                           std::to_string(V) + ")");
    }

    const bool npy = out.size() >= 4 && out.compare(out.size() - 4, 4, ".npy") == 0;
    const std::string tmp = out + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw std::runtime_error("cannot create " + tmp + ": " + std::strerror(errno));
    try {
      if (npy) {
        const std::string h = npy_header(ids.size(), uint64_t(V));
        write_all(f, h.data(), h.size(), tmp);
      }
      for (size_t at = 0; at < ids.size(); at += size_t(stage->max_batch())) {
        const size_t n = std::min(ids.size() - at, size_t(stage->max_batch()));
        std::span<const float> rows = stage->forward(0, std::span<const int32_t>(ids.data() + at, n));
        if (rows.size() != n * size_t(V)) {
          throw std::logic_error("the backend returned " + std::to_string(rows.size()) + " logits for " +
                                 std::to_string(n) + " tokens");
        }
        write_all(f, rows.data(), rows.size_bytes(), tmp);
      }
      if (std::fclose(f) != 0) {
        f = nullptr;
        throw std::runtime_error("cannot write " + tmp + ": " + std::strerror(errno));
      }
      f = nullptr;
      if (std::rename(tmp.c_str(), out.c_str()) != 0) {
        throw std::runtime_error("cannot rename " + tmp + " to " + out + ": " + std::strerror(errno));
      }
    } catch (...) {
      if (f) std::fclose(f);
      std::remove(tmp.c_str());
      throw;
    }
    std::printf("wrote %s: %zu x %lld float32 logits (%s, %s backend)\n", out.c_str(), ids.size(),
                static_cast<long long>(V), npy ? "npy" : "raw", backend_name(*backend));
  } catch (const BackendRefused& e) {
    std::fprintf(stderr, "baton logits: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton logits: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace baton
