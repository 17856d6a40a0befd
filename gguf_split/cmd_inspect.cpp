// `baton inspect FILE [--json] [--full]`: a GGUF file's header, metadata and
// tensor table, as text for people or as one JSON object for scripts.
#include <boost/program_options.hpp>
#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "gguf_split/commands.h"
#include "engine/tp/slice.h"
#include "engine/base/command_line.h"
#include "engine/gguf/file.h"

namespace baton {
namespace {

namespace po = boost::program_options;
using Json = nlohmann::ordered_json;

// Arrays longer than this are shown as their first items unless --full.
constexpr size_t kShownItems = 8;

// Escapes control characters so one key or value stays on one line.
std::string printable(const std::string& s, size_t max_chars) {
  std::string out;
  size_t n = 0;
  for (char c : s) {
    if (n++ == max_chars) {
      out += "...";
      break;
    }
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string quoted(const std::string& s, size_t max_chars) { return "'" + printable(s, max_chars) + "'"; }

std::string number_text(const GgufValue& v) {
  char buf[64];
  switch (v.type) {
    case GgufType::FLOAT32: std::snprintf(buf, sizeof buf, "%.9g", v.num.f); return buf;
    case GgufType::FLOAT64: std::snprintf(buf, sizeof buf, "%.17g", v.num.f); return buf;
    case GgufType::BOOL: return v.num.u ? "true" : "false";
    case GgufType::UINT8: case GgufType::UINT16: case GgufType::UINT32: case GgufType::UINT64:
      return std::to_string(v.num.u);
    default: return std::to_string(v.num.i);
  }
}

std::string type_text(const GgufValue& v) {
  if (v.type != GgufType::ARRAY) return gguf_type_name(v.type);
  std::string inner = v.items.empty() || v.elem_type != GgufType::ARRAY
                          ? gguf_type_name(v.elem_type)
                          : type_text(v.items.front());
  return "arr[" + inner + "]";
}

std::string value_text(const GgufValue& v, bool full) {
  if (v.type == GgufType::STRING) return quoted(v.str, full ? std::string::npos : 200);
  if (v.type != GgufType::ARRAY) return number_text(v);
  size_t shown = full ? v.items.size() : std::min(v.items.size(), kShownItems);
  std::string out = "len=" + std::to_string(v.items.size()) + " [";
  for (size_t i = 0; i < shown; ++i) {
    if (i) out += ", ";
    const GgufValue& item = v.items[i];
    out += item.type == GgufType::ARRAY ? "[" + value_text(item, full) + "]" : value_text(item, full);
  }
  if (shown < v.items.size()) out += shown ? ", ..." : "...";
  return out + "]";
}

Json value_json(const GgufValue& v, bool full) {
  switch (v.type) {
    case GgufType::STRING: return v.str;
    case GgufType::BOOL: return v.num.u != 0;
    case GgufType::FLOAT32: case GgufType::FLOAT64: return v.num.f;
    case GgufType::UINT8: case GgufType::UINT16: case GgufType::UINT32: case GgufType::UINT64:
      return v.num.u;
    case GgufType::ARRAY: break;
    default: return v.num.i;
  }
  size_t shown = full ? v.items.size() : std::min(v.items.size(), kShownItems);
  Json items = Json::array();
  for (size_t i = 0; i < shown; ++i) items.push_back(value_json(v.items[i], full));
  Json a = {{"length", v.items.size()}, {"items", std::move(items)}};
  if (shown < v.items.size()) a["truncated"] = true;
  return a;
}

std::string dims_text(const GgufTensorInfo& t) {
  std::string out = "[";
  for (uint32_t d = 0; d < t.n_dims; ++d) out += (d ? ", " : "") + std::to_string(t.ne[d]);
  return out + "]";
}

struct Totals {
  uint64_t bytes = 0;
  uint64_t params = 0;
};

Totals totals(const GgufFile& f) {
  Totals t;
  for (const auto& ti : f.tensors()) {
    t.bytes += ti.nbytes;
    t.params += ti.n_elements();
  }
  return t;
}

std::string hash_text(uint64_t h) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, h);
  return buf;
}

void print_text(const GgufFile& f, const std::string& path, bool full) {
  std::printf("file: %s\n", path.c_str());
  std::printf("GGUF version %u, alignment %" PRIu64 ", data offset %" PRIu64 ", size %" PRIu64
              " bytes\n",
              f.version(), f.alignment(), f.data_offset(), f.file_size());
  size_t key_width = 0;
  for (const auto& [key, v] : f.metadata()) key_width = std::max(key_width, key.size());
  key_width = std::min<size_t>(key_width, 60);
  std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
  for (const auto& [key, v] : f.metadata()) {
    std::printf("  %-*s  %-10s %s\n", int(key_width), printable(key, 200).c_str(),
                type_text(v).c_str(), value_text(v, full).c_str());
  }
  size_t name_width = 4;
  for (const auto& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  name_width = std::min<size_t>(name_width, 60);
  std::printf("\ntensors (%zu):\n", f.tensors().size());
  if (!f.tensors().empty()) {
    std::printf("  %-*s  %-8s %-24s %14s %14s\n", int(name_width), "name", "type", "dims", "offset",
                "bytes");
  }
  for (const auto& t : f.tensors()) {
    std::printf("  %-*s  %-8s %-24s %14" PRIu64 " %14" PRIu64 "\n", int(name_width), printable(t.name, 200).c_str(),
                dtype_name(t.type), dims_text(t).c_str(), t.offset, t.nbytes);
  }
  Totals tot = totals(f);
  std::printf("\ntotal: %zu tensors, %" PRIu64 " bytes, %" PRIu64 " parameters\n", f.tensors().size(),
              tot.bytes, tot.params);
  std::printf("tensor table hash: %s\n", hash_text(f.tensor_table_hash()).c_str());
  if (f.has(tp_keys::kSize)) {
    std::printf("tensor-parallel rank %" PRId64 " of %" PRId64 " (vocabulary rows %" PRId64 "..%" PRId64 ")\n",
                f.get_int(tp_keys::kRank), f.get_int(tp_keys::kSize), f.get_int(tp_keys::kVocabBegin),
                f.get_int(tp_keys::kVocabBegin) + f.get_int(tp_keys::kVocabCount) - 1);
  }
}

void print_json(const GgufFile& f, const std::string& path, bool full) {
  Json metadata = Json::object();
  for (const auto& [key, v] : f.metadata()) {
    Json entry = {{"type", type_text(v)}, {"value", value_json(v, full)}};
    metadata[key] = std::move(entry);
  }
  Json tensors = Json::array();
  for (const auto& t : f.tensors()) {
    Json dims = Json::array();
    for (uint32_t d = 0; d < t.n_dims; ++d) dims.push_back(t.ne[d]);
    tensors.push_back({{"name", t.name},
                       {"type", dtype_name(t.type)},
                       {"dims", std::move(dims)},
                       {"offset", t.offset},
                       {"file_offset", t.file_offset},
                       {"bytes", t.nbytes}});
  }
  Totals tot = totals(f);
  Json out = {{"file", path},
              {"version", f.version()},
              {"alignment", f.alignment()},
              {"data_offset", f.data_offset()},
              {"file_size", f.file_size()},
              {"tensor_table_hash", hash_text(f.tensor_table_hash())},
              {"metadata", std::move(metadata)},
              {"tensors", std::move(tensors)},
              {"totals",
               {{"tensors", f.tensors().size()}, {"bytes", tot.bytes}, {"parameters", tot.params}}}};
  // Strings in GGUF files are not guaranteed to be UTF-8: replace, don't throw.
  std::cout << out.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  po::options_description visible("usage: baton inspect [-m] FILE [options]\n\noptions");
  visible.add_options()
      ("help,h", "show this help")
      ("model,m", po::value<std::string>(), "the GGUF file (or give it first, without -m)")
      ("json", "print one JSON object instead of text")
      ("full", "print every array item instead of the first few");
  po::positional_options_description positional;
  positional.add("model", 1);
  const auto parsed = parse_command_line(
      argc, argv,
      {.options = visible,
       .help_tail = "\nPrints the header, metadata and tensor table of a GGUF file.\n",
       .positional = &positional});
  if (!parsed) return 0;
  const po::variables_map& vm = *parsed;
  if (!vm.count("model")) {
    std::fprintf(stderr, "baton inspect: no FILE given (see baton inspect --help)\n");
    return 1;
  }
  const std::string path = vm["model"].as<std::string>();
  if (parse_only()) return 0;
  try {
    GgufFile f = GgufFile::open(path);
    if (vm.count("json")) {
      print_json(f, path, vm.count("full") > 0);
    } else {
      print_text(f, path, vm.count("full") > 0);
    }
    std::fflush(stdout);
  } catch (const std::exception& e) {
    // Which file, in front of the reason; cli/ prints the line.
    throw std::runtime_error(path + ": " + e.what());
  }
  return 0;
}

}  // namespace baton
