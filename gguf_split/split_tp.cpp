// Tensor-parallel rank files (`baton split --tp N`) and their merge. The cuts
// are engine/tp/slice.h's; this file streams the bytes: a row cut is one
// contiguous range of the source tensor, a column cut one range of every row.
// Memory is one copy piece (4 MiB) plus metadata, as for layer parts.

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

#include "gguf_split/split.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace baton {
namespace {

constexpr std::string_view kSplitPrefix = "baton.split.";
constexpr std::string_view kShardPrefix = "split.";
constexpr uint64_t kHeaderExtra = uint64_t(1) << 20;

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

uint64_t elem_bytes(DType t, uint64_t n) {
  const std::optional<uint64_t> b = dtype_bytes(t, n);
  if (!b) throw std::runtime_error(std::string("element count not on a ") + dtype_name(t) + " block boundary");
  return *b;
}

uint64_t row_count(const GgufTensorInfo& t) { return t.n_elements() / uint64_t(t.ne[0]); }

// Reads bytes [off, off+n) of rank slice `s` of source tensor `t` into dst.
void read_slice(const TensorRef& src, const TpSlice& s, uint64_t off, uint8_t* dst, uint64_t n) {
  const GgufTensorInfo& t = *src.info;
  const GgufFile& f = *src.file;
  if (s.cut == TpCut::ExpertRows) {
    // Rows [begin, begin+count) of each expert: one contiguous range per expert.
    const uint64_t row = t.row_bytes(), mine = uint64_t(s.count) * row, whole = uint64_t(t.ne[1]) * row;
    while (n > 0) {
      const uint64_t e = off / mine, within = off % mine, take = std::min(n, mine - within);
      f.read_bytes(t.file_offset + e * whole + uint64_t(s.begin) * row + within, take, dst);
      off += take;
      dst += take;
      n -= take;
    }
    return;
  }
  if (s.cut != TpCut::Columns) {
    // Replicated or a range of the outermost dimension: contiguous in the source.
    const uint64_t inner = t.n_elements() / uint64_t(t.ne[t.n_dims - 1]);
    const uint64_t at = t.file_offset + (s.cut == TpCut::Replicated ? 0 : elem_bytes(t.type, uint64_t(s.begin) * inner)) + off;
    f.read_bytes(at, n, dst);
    f.drop_cache(at, n);
    return;
  }
  // The same columns of every row. The page cache is not dropped here: the
  // other ranks read the rest of these rows next.
  const uint64_t src_row = t.row_bytes(), rank_row = s.nbytes / row_count(t);
  const uint64_t col = elem_bytes(t.type, uint64_t(s.begin));
  while (n > 0) {
    const uint64_t row = off / rank_row, within = off % rank_row, take = std::min(n, rank_row - within);
    f.read_bytes(t.file_offset + row * src_row + col + within, take, dst);
    off += take;
    dst += take;
    n -= take;
  }
}

}  // namespace

TpSplitPlan plan_tp_split(const ModelFiles& model, const std::vector<LayerRange>& ranges, int n,
                          const std::string& out_dir, const std::string& stem) {
  TpSplitPlan plan;
  plan.n = n;
  plan.dims = read_tp_dims(model.meta());
  // The vocabulary from the tensors of every shard (the metadata file may not hold them).
  if (!model.meta().has(plan.dims.arch + ".vocab_size")) {
    if (const TensorRef* e = model.find("token_embd.weight")) plan.dims.n_vocab = e->info->ne[1];
    else if (const TensorRef* o = model.find("output.weight")) plan.dims.n_vocab = o->info->ne[1];
  }
  plan.stages = plan_split(model, ranges, out_dir, stem);
  // Every cut of every rank is checked before anything is written.
  std::vector<GgufTensorInfo> infos;
  for (const TensorRef& t : model.tensors()) infos.push_back(*t.info);
  tp_check_model(plan.dims, infos, n);
  const TensorRef* embd = model.find("token_embd.weight");
  const bool tied = model.find("output.weight") == nullptr && embd != nullptr;
  std::map<const GgufTensorInfo*, uint32_t> index;
  for (size_t i = 0; i < model.tensors().size(); ++i) index[model.tensors()[i].info] = uint32_t(i);
  const bool staged = plan.stages.parts.size() > 1;
  for (const SplitPart& p : plan.stages.parts) {
    std::string part_stem = stem;
    if (staged) {
      const std::string name = split_part_file_name(stem, p.index, int(plan.stages.parts.size()), p.range);
      part_stem = name.substr(0, name.size() - 5);  // without ".gguf"
    }
    for (int r = 0; r < n; ++r) {
      TpRankFile f;
      f.part = p.index;
      f.rank = r;
      f.path = (std::filesystem::path(out_dir) / tp_rank_file_name(part_stem, n, r)).string();
      for (const TensorRef* t : p.tensors) {
        f.slices.push_back(tp_slice_tensor(plan.dims, *t->info, n, r));
        f.sources.push_back(t);
        f.source_index.push_back(index.at(t->info));
      }
      // A tied head is split too: this rank's vocabulary rows of token_embd
      // become its own output.weight (the embedding itself stays whole).
      if (tied && p.has_output) {
        f.slices.push_back(tp_tied_head_slice(plan.dims, *embd->info, n, r));
        f.sources.push_back(embd);
        f.source_index.push_back(index.at(embd->info));
      }
      for (const TpSlice& s : f.slices) f.bytes += s.nbytes;
      plan.files.push_back(std::move(f));
    }
  }
  return plan;
}

namespace {

// The rank file's keys and tensor table; its tensors stream from the source
// through a copy of `on_bytes` (a checksum, progress). The header alone is the one
// `baton plan --tp` reads.
void fill_rank_writer(const ModelFiles& model, const TpSplitPlan& plan, const TpRankFile& f,
                      const std::vector<TpKeyChange>& changes, GgufWriter& w,
                      const std::function<void(const uint8_t*, uint64_t)>& on_bytes) {
  const GgufFile& meta = model.meta();
  std::map<std::string, const TpKeyChange*> changed;
  for (const TpKeyChange& c : changes) changed[c.key] = &c;
  const GgufTensorInfo* head = nullptr;
  if (const TensorRef* o = model.find("output.weight")) head = o->info;
  else if (const TensorRef* e = model.find("token_embd.weight")) head = e->info;
  const int64_t n_vocab = head ? head->ne[1] : plan.dims.n_vocab;
  const SplitPart& p = plan.stages.parts[size_t(f.part)];
  for (const auto& [key, value] : meta.metadata()) {
    if (starts_with(key, kSplitPrefix) || starts_with(key, kShardPrefix) || starts_with(key, tp_keys::kPrefix)) {
      continue;
    }
    auto c = changed.find(key);
    w.set(key, c == changed.end() ? value : c->second->value);
  }
  std::vector<GgufValue> added;
  for (const TpKeyChange& c : changes) {
    if (!c.added) continue;
    w.set(c.key, c.value);
    added.push_back(GgufValue::of_str(c.key));
  }
  set_part_keys(w, p, plan.stages.parts.size(), plan.stages.source_hash);
  std::vector<GgufValue> idx, cuts;
  for (size_t i = 0; i < f.slices.size(); ++i) {
    idx.push_back(GgufValue::of_u32(f.source_index[i]));
    GgufValue c;
    c.type = GgufType::UINT8;
    c.num.u = uint8_t(f.slices[i].cut);
    cuts.push_back(c);
  }
  w.set(split_keys::kSourceIndex, GgufValue::of_array(GgufType::UINT32, std::move(idx)));
  const auto [vb, vc] = tp_vocab_range(n_vocab, plan.n, f.rank);
  w.set(tp_keys::kRank, GgufValue::of_u32(uint32_t(f.rank)));
  w.set(tp_keys::kSize, GgufValue::of_u32(uint32_t(plan.n)));
  w.set(tp_keys::kVocabBegin, GgufValue::of_u32(uint32_t(vb)));
  w.set(tp_keys::kVocabCount, GgufValue::of_u32(uint32_t(vc)));
  w.set(tp_keys::kCuts, GgufValue::of_array(GgufType::UINT8, std::move(cuts)));
  w.set(tp_keys::kAddedKeys, GgufValue::of_array(GgufType::STRING, std::move(added)));
  for (const TpKeyChange& c : changes) {
    if (!c.added) w.set(tp_keys::kSourcePrefix + c.key, *meta.find(c.key));
  }
  for (size_t i = 0; i < f.slices.size(); ++i) {
    const TpSlice& s = f.slices[i];
    const TensorRef* src = f.sources[i];
    w.add_tensor_chunked(s.name, s.type, std::vector<int64_t>(s.ne, s.ne + s.n_dims),
                         [on_bytes, src, s](uint64_t off, uint8_t* dst, uint64_t n) {
                           read_slice(*src, s, off, dst, n);
                           on_bytes(dst, n);
                         });
  }
}

}  // namespace

void write_tp_split(const ModelFiles& model, const TpSplitPlan& plan, const Progress& progress) {
  const std::vector<TpRankFile>& files = plan.files;
  if (files.empty()) return;
  uint64_t total = 0, done = 0;
  for (const TpRankFile& f : files) total += f.bytes;
  const uint64_t need = total + (model.meta().data_offset() + kHeaderExtra) * files.size();
  const uint64_t free = free_bytes_at(files.front().path);
  if (free < need) {
    throw std::runtime_error("not enough free space for the rank files in " +
                             std::filesystem::path(files.front().path).parent_path().string() + ": they need " +
                             std::to_string(need >> 20) + " MiB, " + std::to_string(free >> 20) + " MiB are free");
  }
  const std::vector<TpKeyChange> changes = tp_key_changes(model.meta(), plan.dims, plan.n);
  // All files or none, as for layer parts.
  std::vector<TempFile> written;
  for (const TpRankFile& f : files) {
    XXH3_state_t* hash = XXH3_createState();
    const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> free_hash(hash, &XXH3_freeState);
    XXH3_64bits_reset(hash);
    GgufWriter w;
    fill_rank_writer(model, plan, f, changes, w, [&, hash](const uint8_t* dst, uint64_t n) {
      XXH3_64bits_update(hash, dst, n);
      done += n;
      if (progress) progress(done, total);
    });
    written.push_back(write_checksummed(w, f.path, [hash] { return XXH3_64bits_digest(hash); }));
  }
  commit_all(written);
}

void write_tp_rank_headers(const ModelFiles& model, const TpSplitPlan& plan) {
  const std::vector<TpKeyChange> changes = tp_key_changes(model.meta(), plan.dims, plan.n);
  for (const TpRankFile& f : plan.files) {
    GgufWriter w;
    fill_rank_writer(model, plan, f, changes, w, [](const uint8_t*, uint64_t) {});
    w.write_sparse(f.path);
  }
}

std::vector<std::string> write_tp_ranks(const std::string& source_path, int n, const std::string& out_dir,
                                        const std::string& layers, const Progress& progress) {
  ModelFiles model = ModelFiles::open(source_path);
  const int n_layer = model_layer_count(model.meta());
  const std::string spec = layers.empty() ? "0:output" : layers;
  TpSplitPlan plan = plan_tp_split(model, parse_layer_ranges(spec, n_layer), n, out_dir,
                                   std::filesystem::path(source_path).stem().string());
  std::filesystem::create_directories(out_dir);
  write_tp_split(model, plan, progress);
  std::vector<std::string> out;
  for (const TpRankFile& f : plan.files) out.push_back(f.path);
  return out;
}

bool is_tp_rank_file(const GgufFile& f) { return f.has(tp_keys::kSize); }

namespace {

// One source tensor rebuilt from the ranks' slices of one stage.
struct Merged {
  GgufTensorInfo info;  // the source's name, type, shape and size
  TpCut cut = TpCut::Replicated;
  std::vector<TensorRef> ranks;
};

void read_merged(const Merged& m, uint64_t off, uint8_t* dst, uint64_t n) {
  if (m.cut == TpCut::Replicated) {
    m.ranks[0].file->read_bytes(m.ranks[0].info->file_offset + off, n, dst);
    return;
  }
  if (m.cut == TpCut::Rows) {
    // The ranks' slices one after another.
    uint64_t start = 0;
    for (const TensorRef& r : m.ranks) {
      const uint64_t size = r.info->nbytes;
      if (n > 0 && off < start + size) {
        const uint64_t within = off - start, take = std::min(n, size - within);
        r.file->read_bytes(r.info->file_offset + within, take, dst);
        off += take;
        dst += take;
        n -= take;
      }
      start += size;
    }
    return;
  }
  if (m.cut == TpCut::ExpertRows) {
    // Each expert's rows are the ranks' rows of that expert one after another.
    const uint64_t row = m.info.row_bytes(), whole = uint64_t(m.info.ne[1]) * row;
    while (n > 0) {
      const uint64_t e = off / whole;
      uint64_t within = off % whole, start = 0;
      for (const TensorRef& r : m.ranks) {
        const uint64_t mine = uint64_t(r.info->ne[1]) * row;
        if (within < start + mine) {
          const uint64_t take = std::min(n, start + mine - within);
          r.file->read_bytes(r.info->file_offset + e * mine + (within - start), take, dst);
          off += take;
          dst += take;
          n -= take;
          break;
        }
        start += mine;
      }
    }
    return;
  }
  // Columns: each row is the ranks' rows side by side.
  const uint64_t rows = row_count(m.info), row = m.info.nbytes / rows;
  while (n > 0) {
    const uint64_t r_i = off / row;
    uint64_t within = off % row, start = 0;
    for (const TensorRef& r : m.ranks) {
      const uint64_t rb = r.info->nbytes / rows;
      if (within < start + rb) {
        const uint64_t take = std::min(n, start + rb - within);
        r.file->read_bytes(r.info->file_offset + r_i * rb + (within - start), take, dst);
        off += take;
        dst += take;
        n -= take;
        break;
      }
      start += rb;
    }
  }
}

}  // namespace

void merge_tp_ranks(const std::vector<GgufFile>& files, const std::string& out_path, const Progress& progress) {
  for (const GgufFile& f : files) {
    if (!is_tp_rank_file(f)) {
      throw std::runtime_error(f.path() + ": not a tensor-parallel rank file; rank files merge only with each other");
    }
    if (std::string why = verify_part(f); !why.empty()) throw std::runtime_error(f.path() + ": " + why);
  }
  const GgufFile& first = files[0];
  const int64_t n = first.get_int(tp_keys::kSize), count = first.get_int(split_keys::kCount);
  const uint64_t source = split_key_u64(first, split_keys::kSourceHash);
  if (n < 2 || n > kMaxTpRanks || count < 1 || count > 100000) {
    throw std::runtime_error(first.path() + ": malformed baton.tp / baton.split keys");
  }
  std::vector<std::vector<const GgufFile*>> grid(size_t(count), std::vector<const GgufFile*>(size_t(n), nullptr));
  for (const GgufFile& f : files) {
    if (f.get_int(tp_keys::kSize) != n || f.get_int(split_keys::kCount) != count ||
        split_key_u64(f, split_keys::kSourceHash) != source) {
      throw std::runtime_error(f.path() + ": belongs to a different split (rank count, part count or source differs)");
    }
    const int64_t part = f.get_int(split_keys::kIndex), rank = f.get_int(tp_keys::kRank);
    if (part < 0 || part >= count || rank < 0 || rank >= n) {
      throw std::runtime_error(f.path() + ": part " + std::to_string(part) + " rank " + std::to_string(rank) +
                               " is out of range");
    }
    const GgufFile*& slot = grid[size_t(part)][size_t(rank)];
    if (slot) {
      throw std::runtime_error(f.path() + ": rank " + std::to_string(rank) + " of part " + std::to_string(part + 1) +
                               " is given twice (also " + slot->path() + ")");
    }
    slot = &f;
  }
  for (int64_t p = 0; p < count; ++p) {
    for (int64_t r = 0; r < n; ++r) {
      if (!grid[size_t(p)][size_t(r)]) {
        throw std::runtime_error("rank " + std::to_string(r) + " of " + std::to_string(n) + " of part " +
                                 std::to_string(p + 1) + " of " + std::to_string(count) + " is missing");
      }
    }
  }
  std::map<uint32_t, Merged> ordered;
  for (const auto& ranks : grid) {
    const GgufFile& r0 = *ranks[0];
    const GgufValue& idx = r0.get_array(split_keys::kSourceIndex);
    const GgufValue& cuts = r0.get_array(tp_keys::kCuts);
    const size_t nt = r0.tensors().size();
    if (idx.items.size() != nt || cuts.items.size() != nt) {
      throw std::runtime_error(r0.path() + ": its baton.split / baton.tp tensor lists do not match its tensors");
    }
    for (const GgufFile* f : ranks) {
      if (f->tensors().size() != nt) throw std::runtime_error(f->path() + ": its tensors differ from " + r0.path());
    }
    for (size_t i = 0; i < nt; ++i) {
      const TpCut cut = TpCut(cuts.items[i].as_int());
      if (cut == TpCut::HeadFromEmbedding) continue;  // a tied head: the source has only token_embd
      Merged m;
      m.cut = cut;
      m.info = r0.tensors()[i];
      if (cut != TpCut::Replicated && cut != TpCut::Rows && cut != TpCut::Columns && cut != TpCut::ExpertRows) {
        throw std::runtime_error(r0.path() + ": unknown cut of tensor '" + m.info.name + "'");
      }
      if (cut == TpCut::ExpertRows && m.info.n_dims != 3) {
        throw std::runtime_error(r0.path() + ": tensor '" + m.info.name + "' is cut by expert rows but is not 3-D");
      }
      const uint32_t dim = cut == TpCut::Columns ? 0 : cut == TpCut::ExpertRows ? 1 : m.info.n_dims - 1;
      int64_t sum = 0;
      for (const GgufFile* f : ranks) {
        const GgufTensorInfo& t = f->tensors()[i];
        if (t.name != m.info.name || t.type != m.info.type || t.n_dims != m.info.n_dims) {
          throw std::runtime_error(f->path() + ": tensor " + std::to_string(i) + " differs from " + r0.path());
        }
        sum += t.ne[dim];
        m.ranks.push_back(TensorRef{f, &t});
      }
      if (cut != TpCut::Replicated) m.info.ne[dim] = sum;
      m.info.nbytes = elem_bytes(m.info.type, m.info.n_elements());
      ordered.emplace(uint32_t(idx.items[i].as_int()), std::move(m));
    }
  }
  uint32_t expect = 0;
  std::vector<const GgufTensorInfo*> infos;
  for (const auto& [i, m] : ordered) {
    if (i != expect++) throw std::runtime_error("source tensor " + std::to_string(expect - 1) + " is in no rank file");
    infos.push_back(&m.info);
  }
  if (hash_tensor_table(infos) != source) {
    throw std::runtime_error("the merged tensor table does not hash to the source's (rank files damaged?)");
  }
  // The source's metadata: changed keys get their source values back in
  // place, added and baton.* keys go.
  const GgufFile& meta = *grid[0][0];
  std::set<std::string> added;
  for (const GgufValue& k : meta.get_array(tp_keys::kAddedKeys).items) added.insert(k.as_str());
  GgufWriter w;
  for (const auto& [key, value] : meta.metadata()) {
    if (starts_with(key, kSplitPrefix) || starts_with(key, tp_keys::kPrefix) || added.count(key)) continue;
    const GgufValue* orig = meta.find(tp_keys::kSourcePrefix + key);
    w.set(key, orig ? *orig : value);
  }
  uint64_t total = 0, done = 0;
  for (const auto& [i, m] : ordered) total += m.info.nbytes;
  for (const auto& [i, m] : ordered) {
    const Merged* mp = &m;
    w.add_tensor_chunked(m.info.name, m.info.type, std::vector<int64_t>(m.info.ne, m.info.ne + m.info.n_dims),
                         [&, mp](uint64_t off, uint8_t* dst, uint64_t len) {
                           read_merged(*mp, off, dst, len);
                           done += len;
                           if (progress) progress(done, total);
                         });
  }
  w.write(out_path);
}

}  // namespace baton
