#include "gguf_split/split.h"
#include "engine/model/layer_range_text.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace baton {
namespace {

constexpr std::string_view kSplitPrefix = "baton.split.";
constexpr std::string_view kSourceIndex = split_keys::kSourceIndex;
// llama.cpp shard keys: a part or a merged file is a whole file, not a shard.
constexpr std::string_view kShardPrefix = "split.";
// A part's header is the source's metadata plus the baton.split.* keys and
// its tensor table: the source's header and this much more bounds it.
constexpr uint64_t kPartHeaderExtra = uint64_t(1) << 20;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

int parse_int(std::string_view s, const std::string& spec) {
  int v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || v < 0) {
    throw std::invalid_argument("bad layer range '" + spec + "': '" + std::string(s) + "' is not a layer number");
  }
  return v;
}

// Streams the tensor bytes of `src` into the writer, feeding the checksum.
void add_copied_tensor(GgufWriter& w, const TensorRef& src, XXH3_state_t* hash,
                       const std::function<void(uint64_t)>& advance) {
  const GgufTensorInfo& t = *src.info;
  std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
  const GgufFile* file = src.file;
  const uint64_t base = t.file_offset;
  w.add_tensor_chunked(t.name, t.type, ne, [file, base, hash, advance](uint64_t off, uint8_t* dst, uint64_t n) {
    file->read_bytes(base + off, n, dst);
    file->drop_cache(base + off, n);
    if (hash) XXH3_64bits_update(hash, dst, n);
    advance(n);
  });
}

}  // namespace

std::vector<LayerRange> parse_layer_ranges(const std::string& spec, int n_layer) {
  std::vector<LayerRange> out;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    std::string_view item(spec.data() + pos, comma - pos);
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      throw std::invalid_argument("bad layer range '" + std::string(item) + "': expected FIRST:LAST");
    }
    LayerRange r;
    r.first = parse_int(item.substr(0, colon), spec);
    std::string_view last = item.substr(colon + 1);
    r.last = last == "output" ? n_layer - 1 : parse_int(last, spec);
    out.push_back(r);
    pos = comma + 1;
  }
  int next = 0;
  for (const LayerRange& r : out) {
    if (r.first != next || r.last < r.first || r.last >= n_layer) {
      throw std::invalid_argument("layer ranges '" + spec + "' must cover layers " + layer_range_text(0, n_layer - 1) +
                                  " contiguously and in order (range " + layer_range_text(r) + " breaks this)");
    }
    next = r.last + 1;
  }
  if (next != n_layer) {
    throw std::invalid_argument("layer ranges '" + spec + "' end at layer " + std::to_string(next - 1) +
                                " but the model has layers " + layer_range_text(0, n_layer - 1));
  }
  return out;
}

int model_layer_count(const GgufFile& meta) {
  const std::string& arch = meta.get_str("general.architecture");
  const int64_t n = meta.get_int(arch + ".block_count");
  if (n < 1 || n > 100000) throw std::runtime_error(arch + ".block_count " + std::to_string(n) + " is out of range");
  return int(n);
}

SplitPlan plan_split(const ModelFiles& model, const std::vector<LayerRange>& ranges, const std::string& out_dir,
                     const std::string& stem) {
  SplitPlan plan;
  plan.n_layer = model_layer_count(model.meta());
  plan.source_hash = model.tensor_table_hash();
  const int count = int(ranges.size());
  for (int i = 0; i < count; ++i) {
    SplitPart p;
    p.index = i;
    p.range = ranges[size_t(i)];
    p.has_embedding = i == 0;
    p.has_output = i == count - 1;
    p.path = (std::filesystem::path(out_dir) / split_part_file_name(stem, i, count, p.range)).string();
    plan.parts.push_back(std::move(p));
  }
  for (const TensorRef& t : model.tensors()) {
    const TensorPlace place = tensor_place(t.info->name);
    for (SplitPart& p : plan.parts) {
      bool take = false;
      switch (place.kind) {
        case TensorPlace::kLayer:
          if (place.layer >= plan.n_layer) {
            throw std::runtime_error("tensor '" + t.info->name + "' names layer " + std::to_string(place.layer) +
                                     " but the model has " + std::to_string(plan.n_layer) + " layers");
          }
          take = place.layer >= p.range.first && place.layer <= p.range.last;
          break;
        case TensorPlace::kEmbedding: take = p.has_embedding; break;
        case TensorPlace::kOutput: take = p.has_output; break;
        case TensorPlace::kShared: take = true; break;
      }
      if (take) {
        p.tensors.push_back(&t);
        p.tensor_bytes += t.info->nbytes;
      }
    }
  }
  return plan;
}

void check_free_space(const ModelFiles& model, const SplitPlan& plan) {
  if (plan.parts.empty()) return;
  const uint64_t header = model.meta().data_offset() + kPartHeaderExtra;
  uint64_t need = 0;
  for (const SplitPart& p : plan.parts) need += p.tensor_bytes + header;
  // A sparse source (a synthetic model) splits into sparse parts: its holes
  // cost no space, so it needs at most what it occupies itself.
  uint64_t occupied = 0;
  for (const GgufFile& f : model.files()) {
    struct stat st {};
    if (::stat(f.path().c_str(), &st) != 0) return;
    occupied += uint64_t(st.st_blocks) * 512;
  }
  need = std::min(need, occupied + header * plan.parts.size());
  const uint64_t free = free_bytes_at(plan.parts.front().path);
  if (free < need) {
    throw std::runtime_error("not enough free space for the parts in " +
                             std::filesystem::path(plan.parts.front().path).parent_path().string() + ": they need " +
                             std::to_string(need >> 20) + " MiB, " + std::to_string(free >> 20) + " MiB are free");
  }
}

void write_split(const ModelFiles& model, const SplitPlan& plan, const Progress& progress) {
  check_free_space(model, plan);
  uint64_t total = 0, done = 0;
  for (const SplitPart& p : plan.parts) total += p.tensor_bytes;
  std::map<const GgufTensorInfo*, uint32_t> source_index;
  for (size_t i = 0; i < model.tensors().size(); ++i) source_index[model.tensors()[i].info] = uint32_t(i);

  // Every part is written under a temporary name and renamed only once all
  // are complete: a failure (a full disk) leaves no part, never a partial set
  // (the TempFiles remove themselves as this unwinds).
  std::vector<TempFile> written;
  for (const SplitPart& p : plan.parts) {
    GgufWriter w;
    for (const auto& [key, value] : model.meta().metadata()) {
      if (starts_with(key, kSplitPrefix) || starts_with(key, kShardPrefix)) continue;
      w.set(key, value);
    }
    set_part_keys(w, p, plan.parts.size(), plan.source_hash);
    std::vector<GgufValue> idx;
    for (const TensorRef* t : p.tensors) idx.push_back(GgufValue::of_u32(source_index.at(t->info)));
    w.set(std::string(kSourceIndex), GgufValue::of_array(GgufType::UINT32, std::move(idx)));

    XXH3_state_t* hash = XXH3_createState();
    const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> free_hash(hash, &XXH3_freeState);
    XXH3_64bits_reset(hash);
    auto advance = [&](uint64_t n) {
      done += n;
      if (progress) progress(done, total);
    };
    for (const TensorRef* t : p.tensors) add_copied_tensor(w, *t, hash, advance);
    written.push_back(write_checksummed(w, p.path, [hash] { return XXH3_64bits_digest(hash); }));
  }
  commit_all(written);
}

void set_part_keys(GgufWriter& w, const SplitPart& p, size_t count, uint64_t source_hash) {
  w.set(split_keys::kLayerFirst, GgufValue::of_u32(uint32_t(p.range.first)));
  w.set(split_keys::kLayerLast, GgufValue::of_u32(uint32_t(p.range.last)));
  w.set(split_keys::kHasEmbedding, GgufValue::of_bool(p.has_embedding));
  w.set(split_keys::kHasOutput, GgufValue::of_bool(p.has_output));
  w.set(split_keys::kCount, GgufValue::of_u32(uint32_t(count)));
  w.set(split_keys::kIndex, GgufValue::of_u32(uint32_t(p.index)));
  w.set(split_keys::kSourceHash, GgufValue::of_u64(source_hash));
}

TempFile write_checksummed(GgufWriter& w, const std::string& path, const std::function<uint64_t()>& digest) {
  // The checksum is known only once the data has streamed through: the
  // writer patches the placeholder in place before it renames the file.
  w.set_deferred(split_keys::kDataChecksum, GgufValue::of_u64(0), [digest] { return GgufValue::of_u64(digest()); });
  return w.write_uncommitted(path);
}

void commit_all(std::vector<TempFile>& written) {
  for (size_t i = 0; i < written.size(); ++i) {
    try {
      written[i].commit();
    } catch (...) {
      for (size_t k = 0; k < i; ++k) ::unlink(written[k].target().c_str());
      throw;
    }
  }
}

std::string verify_part(const GgufFile& part) {
  const GgufValue* want = part.find(split_keys::kDataChecksum);
  if (!want) return "it has no " + std::string(split_keys::kDataChecksum) + " key (not a baton split part)";
  XXH3_state_t* hash = XXH3_createState();
  XXH3_64bits_reset(hash);
  std::vector<uint8_t> buf(4u << 20);
  for (const GgufTensorInfo& t : part.tensors()) {
    for (uint64_t off = 0; off < t.nbytes; off += buf.size()) {
      const uint64_t n = std::min<uint64_t>(buf.size(), t.nbytes - off);
      part.read_bytes(t.file_offset + off, n, buf.data());
      XXH3_64bits_update(hash, buf.data(), n);
    }
  }
  const uint64_t got = XXH3_64bits_digest(hash);
  XXH3_freeState(hash);
  if (want->type != GgufType::UINT64 || want->num.u != got) return "tensor data checksum mismatch (file damaged or modified)";
  return "";
}

void merge_parts(const std::vector<std::string>& part_paths, const std::string& out_path, const Progress& progress) {
  if (part_paths.empty()) throw std::invalid_argument("no parts to merge");
  std::vector<GgufFile> parts;
  for (const std::string& p : part_paths) parts.push_back(GgufFile::open(p));
  // Rank files of a tensor-parallel split are put back together across ranks too.
  if (std::any_of(parts.begin(), parts.end(), [](const GgufFile& f) { return is_tp_rank_file(f); })) {
    merge_tp_ranks(parts, out_path, progress);
    return;
  }
  // Damaged parts are refused before anything is written (this reads each part once more).
  for (const GgufFile& f : parts) {
    if (std::string why = verify_part(f); !why.empty()) throw std::runtime_error(f.path() + ": " + why);
  }
  // Order by index and check that the parts are one complete set of one source.
  const uint64_t count = uint64_t(parts[0].get_int(split_keys::kCount));
  const uint64_t source = split_key_u64(parts[0], split_keys::kSourceHash);
  // Checked before sizing anything by it: the count is file data (a part
  // holds at least one layer, and a model has at most 100000).
  if (count == 0 || count > 100000) {
    throw std::runtime_error(parts[0].path() + ": malformed baton.split keys (part count " + std::to_string(count) +
                             ")");
  }
  std::vector<const GgufFile*> by_index(count, nullptr);
  for (const GgufFile& f : parts) {
    if (!f.has(split_keys::kIndex)) throw std::runtime_error(f.path() + ": not a baton split part");
    const uint64_t idx = uint64_t(f.get_int(split_keys::kIndex));
    if (uint64_t(f.get_int(split_keys::kCount)) != count || split_key_u64(f, split_keys::kSourceHash) != source) {
      throw std::runtime_error(f.path() + ": belongs to a different split (count or source hash differs)");
    }
    if (idx >= count || by_index[idx]) {
      throw std::runtime_error(f.path() + ": part index " + std::to_string(idx) + " is out of range or repeated");
    }
    by_index[idx] = &f;
  }
  for (uint64_t i = 0; i < count; ++i) {
    if (!by_index[i]) throw std::runtime_error("part " + std::to_string(i + 1) + " of " + std::to_string(count) + " is missing");
  }
  // Tensors back in source order; shared tensors appear in every part once.
  std::map<uint32_t, TensorRef> ordered;
  for (const GgufFile* f : by_index) {
    const GgufValue& idx = f->get_array(std::string(kSourceIndex));
    if (idx.items.size() != f->tensors().size()) {
      throw std::runtime_error(f->path() + ": " + std::string(kSourceIndex) + " does not match its tensor count");
    }
    for (size_t i = 0; i < idx.items.size(); ++i) {
      ordered.emplace(uint32_t(idx.items[i].as_int()), TensorRef{f, &f->tensors()[i]});
    }
  }
  uint32_t expect = 0;
  std::vector<const GgufTensorInfo*> infos;
  for (const auto& [i, t] : ordered) {
    if (i != expect++) throw std::runtime_error("source tensor " + std::to_string(expect - 1) + " is in no part");
    infos.push_back(t.info);
  }
  if (hash_tensor_table(infos) != source) {
    throw std::runtime_error("the merged tensor table does not hash to the source's (parts damaged?)");
  }
  GgufWriter w;
  for (const auto& [key, value] : by_index[0]->metadata()) {
    if (!starts_with(key, kSplitPrefix)) w.set(key, value);
  }
  uint64_t total = 0, done = 0;
  for (const auto& [i, t] : ordered) total += t.info->nbytes;
  auto advance = [&](uint64_t n) {
    done += n;
    if (progress) progress(done, total);
  };
  for (const auto& [i, t] : ordered) add_copied_tensor(w, t, nullptr, advance);
  w.write(out_path);
}

}  // namespace baton
