// `baton convert --from DIR -o FILE [--type T]`: a HuggingFace llama-family
// (gguf_split/convert_llama.h) or DeepSeek V4 (gguf_split/convert_deepseek4.h)
// checkpoint to GGUF, chosen by config.json's model_type. Progress goes to
// stderr.
#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "gguf_split/commands.h"
#include "gguf_split/convert_deepseek4.h"
#include "gguf_split/convert_llama.h"
#include "gguf_split/progress_throttle.h"
#include "gguf_split/stale_temps.h"
#include "engine/base/command_line.h"
#include "engine/base/progress_line.h"

namespace baton {
namespace {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

// "converted X of Y GiB (P%)" at most twice a second, and once at the end.
class Progress {
 public:
  explicit Progress(bool quiet) : throttle_(quiet) {}
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void operator()(uint64_t done, uint64_t total) {
    if (!throttle_.due(Clock::now(), done, total)) return;
    char line[96];
    std::snprintf(line, sizeof line, "converted %.2f of %.2f GiB (%3.0f%%)", gib(done), gib(total), percent(done, total));
    print_progress_line(line, done >= total);
  }

 private:
  ProgressThrottle throttle_;
};

// config.json's model_type; "" when unreadable (the converter then says why).
std::string model_type(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "config.json");
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>()
                                                                                  : "";
}

// A --type / --expert-type value: a type this build can quantize to.
std::optional<DType> writable_type(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return char(std::toupper(c)); });
  auto t = dtype_from_name(upper);
  if (!t || !dtype_info(*t).quantize) return std::nullopt;
  return t;
}

}  // namespace

int cmd_convert(int argc, char** argv) {
  std::string from, out, type = "auto", expert_type;
  po::options_description opts(
      "usage: baton convert --from DIR -o FILE [--type T]\n\n"
      "Converts a HuggingFace checkpoint folder (config.json and model.safetensors,\n"
      "or model.safetensors.index.json with its shards) of a LlamaForCausalLM,\n"
      "Qwen2ForCausalLM, Qwen3ForCausalLM or DeepSeek V4 (model_type deepseek_v4)\n"
      "model to a GGUF file that baton runs. Tensors stream through a few MiB of\n"
      "memory. A byte-level BPE tokenizer.json (Llama 3, Qwen2/3, DeepSeek) is\n"
      "converted; otherwise the file holds a placeholder vocabulary (token ids\n"
      "work, text does not; see docs/CONVERT.md).\n\noptions");
  opts.add_options()
      ("help,h", "show this help")
      ("from", po::value(&from), "checkpoint folder")
      ("output,o", po::value(&out), "GGUF file to write (through a temporary name beside it, renamed when complete)")
      ("type", po::value(&type), "matrix type: auto (keep each tensor's f32/f16/bf16) | f32 | f16 | bf16 | q8_0 | "
                                  "q4_0 | q4_k | q5_k | q6_k | q2_k; norms and biases stay f32; deepseek_v4: a "
                                  "quantized type goes to the roles the published files quantize, F16 to the rest")
      ("expert-type", po::value(&expert_type), "deepseek_v4: the routed experts' type (e.g. q2_k, q4_k)")
      ("quiet,q", "no progress on stderr");
  const auto vm = parse_command_line(argc, argv, {.options = opts});
  if (!vm) return 0;
  if (from.empty() || out.empty()) {
    std::fprintf(stderr, "baton convert: --from and -o are required (see baton convert --help)\n");
    return 1;
  }
  ConvertOptions o;
  o.from_dir = from;
  o.out = out;
  if (type != "auto") {
    o.type = writable_type(type);
    if (!o.type) {
      std::fprintf(stderr, "baton convert: --type '%s' is not a type this build can write (see --help)\n", type.c_str());
      return 1;
    }
  }
  if (parse_only()) return 0;  // the checkpoint's config.json is read below
  std::optional<DType> experts;
  const bool deepseek4 = model_type(from) == "deepseek_v4";
  if (!expert_type.empty()) {
    experts = writable_type(expert_type);
    if (!experts) {
      std::fprintf(stderr, "baton convert: --expert-type '%s' is not a type this build can write (see --help)\n",
                   expert_type.c_str());
      return 1;
    }
    if (!deepseek4) {
      std::fprintf(stderr, "baton convert: --expert-type applies to deepseek_v4 checkpoints only\n");
      return 1;
    }
  }
  Progress progress(vm->count("quiet") > 0);
  o.progress = [&](uint64_t done, uint64_t total) { progress(done, total); };
  o.note = [&](const std::string& s) {
    end_progress_line();
    std::fprintf(stderr, "note: %s\n", s.c_str());
  };
  remove_stale_temps_beside(out);
  const auto t0 = Clock::now();
  ConvertResult r = deepseek4 ? convert_hf_deepseek4(o, experts) : convert_hf_llama(o);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("wrote %s: %s, %d layers, %llu tensors, %.3f GiB of tensor data, vocab %lld, %.1f s\n", out.c_str(),
              r.arch.c_str(), r.n_layer, static_cast<unsigned long long>(r.n_tensors), gib(r.tensor_bytes),
              static_cast<long long>(r.n_vocab), s);
  std::printf("vocabulary: %s\n", r.vocabulary.c_str());
  return 0;
}

}  // namespace baton
