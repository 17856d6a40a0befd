#include "engine/tp/slice.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <string_view>

#include "engine/model/files.h"  // tensor_place

namespace baton {
namespace {

bool is_llama_family(const std::string& arch) { return arch == "llama" || arch == "qwen2" || arch == "qwen3"; }

std::string shape_text(const GgufTensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

[[noreturn]] void refuse(const GgufTensorInfo& t, int n, const std::string& why) {
  throw std::runtime_error(fmt::format("cannot cut tensor '{}' {} {} for {} tensor-parallel ranks: {}", t.name,
                                       shape_text(t), dtype_name(t.type), n, why));
}

// The tensor as it is (name, dtype, shape), to be cut as `cut` says.
TpSlice slice_of(const GgufTensorInfo& t, TpCut cut) {
  TpSlice s;
  s.name = t.name;
  s.cut = cut;
  s.type = t.type;
  s.n_dims = t.n_dims;
  for (int i = 0; i < 4; ++i) s.ne[i] = t.ne[i];
  return s;
}

// The rank's slice along the outermost dimension: whole rows, any dtype
// (a 1-D tensor's elements must stay whole blocks).
TpSlice rows(const GgufTensorInfo& t, int n, int64_t begin, int64_t count) {
  TpSlice s = slice_of(t, TpCut::Rows);
  const uint32_t outer = t.n_dims - 1;
  if (begin < 0 || count < 1 || begin + count > t.ne[outer]) {
    refuse(t, n, fmt::format("rows [{}, {}) are outside its {} rows", begin, begin + count, t.ne[outer]));
  }
  const uint32_t blk = dtype_info(t.type).block_elems;
  if (outer == 0 && (begin % blk != 0 || count % blk != 0)) {
    refuse(t, n, fmt::format("elements [{}, {}) are not on {}-element block boundaries", begin, begin + count, blk));
  }
  s.ne[outer] = count;
  s.begin = begin;
  s.count = count;
  s.nbytes = t.nbytes / uint64_t(t.ne[outer]) * uint64_t(count);
  return s;
}

// The rank's slice of ne[0] in every row: whole quantization blocks only.
TpSlice columns(const GgufTensorInfo& t, int n, int64_t begin, int64_t count) {
  if (t.n_dims < 2) refuse(t, n, "a column cut needs a matrix");
  if (begin < 0 || count < 1 || begin + count > t.ne[0]) {
    refuse(t, n, fmt::format("columns [{}, {}) are outside its {} columns", begin, begin + count, t.ne[0]));
  }
  const DTypeInfo& info = dtype_info(t.type);
  if (begin % info.block_elems != 0 || count % info.block_elems != 0) {
    refuse(t, n, fmt::format("the column cut at {} (width {}) is not on a {}-element {} block boundary", begin,
                             count, info.block_elems, info.name));
  }
  TpSlice s = slice_of(t, TpCut::Columns);
  s.ne[0] = count;
  s.begin = begin;
  s.count = count;
  s.nbytes = t.nbytes / uint64_t(t.ne[0] / info.block_elems) * uint64_t(count / info.block_elems);
  return s;
}

// The rank's rows [begin, begin+count) of ne[1] in each of the ne[2]
// matrices of a stacked 3-D tensor (every expert keeps its slice).
TpSlice expert_rows(const GgufTensorInfo& t, int n, int64_t begin, int64_t count) {
  if (t.n_dims != 3) refuse(t, n, "an expert-row cut needs a stack of matrices");
  if (begin < 0 || count < 1 || begin + count > t.ne[1]) {
    refuse(t, n, fmt::format("rows [{}, {}) are outside its {} rows per expert", begin, begin + count, t.ne[1]));
  }
  TpSlice s = slice_of(t, TpCut::ExpertRows);
  s.ne[1] = count;
  s.begin = begin;
  s.count = count;
  s.nbytes = t.nbytes / uint64_t(t.ne[1]) * uint64_t(count);
  return s;
}

TpSlice replicated(const GgufTensorInfo& t) {
  TpSlice s = slice_of(t, TpCut::Replicated);
  s.begin = 0;
  s.count = t.ne[t.n_dims - 1];
  s.nbytes = t.nbytes;
  return s;
}

void check_divides(const GgufTensorInfo& t, int n, int64_t what, const char* name) {
  if (what % n != 0) refuse(t, n, fmt::format("{} = {} is not a multiple of {}", name, what, n));
}

// deepseek4's layer tensors (docs/TENSOR_PARALLEL.md, "deepseek4"): rank r
// takes output groups [r G/N, (r+1) G/N) and with them their heads (group g
// holds heads [g H/G, (g+1) H/G)), the heads' rows of q_b and their sinks;
// output_b's columns of those groups give a partial sum. Every routed and
// shared expert keeps 1/N of its width. The rest is computed whole by every rank.
TpSlice ds4_layer_slice(const TpDims& d, const GgufTensorInfo& t, std::string_view suffix, int n, int rank) {
  const auto is = [&](std::string_view what) { return suffix == what; };
  const int64_t hd = d.head_dim_k;
  if (is("attn_q_b.weight") || is("attn_sinks.weight") || is("attn_output_a.weight") ||
      is("attn_output_b.weight")) {
    check_divides(t, n, d.o_groups, "output_group_count");
    const int64_t h = d.n_head / n, g = d.o_groups / n;
    if (is("attn_q_b.weight")) return rows(t, n, rank * h * hd, h * hd);
    if (is("attn_sinks.weight")) return rows(t, n, rank * h, h);
    if (is("attn_output_a.weight")) return rows(t, n, rank * g * d.o_lora_rank, g * d.o_lora_rank);
    return columns(t, n, rank * g * d.o_lora_rank, g * d.o_lora_rank);
  }
  if (is("ffn_gate_exps.weight") || is("ffn_up_exps.weight") || is("ffn_down_exps.weight")) {
    check_divides(t, n, d.n_ff, "expert_feed_forward_length");
    const int64_t f = d.n_ff / n;
    return suffix[4] == 'd' ? columns(t, n, rank * f, f) : expert_rows(t, n, rank * f, f);
  }
  if (is("ffn_gate_shexp.weight") || is("ffn_up_shexp.weight") || is("ffn_down_shexp.weight")) {
    check_divides(t, n, d.n_ff, "expert_feed_forward_length");
    const int64_t f = d.n_ff_shared / n;
    return suffix[4] == 'd' ? columns(t, n, rank * f, f) : rows(t, n, rank * f, f);
  }
  // Hyper-connections, norms, q_a, the latent KV, the router and its hash
  // table, the compressors and the indexer.
  static constexpr std::string_view kWhole[] = {
      "hc_attn_fn.weight", "hc_attn_scale.weight", "hc_attn_base.weight", "hc_ffn_fn.weight",
      "hc_ffn_scale.weight", "hc_ffn_base.weight", "attn_norm.weight", "attn_q_a.weight",
      "attn_q_a_norm.weight", "attn_kv.weight", "attn_kv_a_norm.weight", "ffn_norm.weight",
      "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "exp_probs_b.bias", "attn_compressor_ape.weight",
      "attn_compressor_kv.weight", "attn_compressor_gate.weight", "attn_compressor_norm.weight",
      "indexer.attn_q_b.weight", "indexer.proj.weight", "indexer_compressor_ape.weight",
      "indexer_compressor_kv.weight", "indexer_compressor_gate.weight", "indexer_compressor_norm.weight"};
  for (std::string_view w : kWhole) {
    if (suffix == w) return replicated(t);
  }
  refuse(t, n, "no tensor-parallel cut is known for it");
}

}  // namespace

const char* tp_cut_name(TpCut c) {
  switch (c) {
    case TpCut::Replicated: return "replicated";
    case TpCut::Rows: return "rows";
    case TpCut::Columns: return "columns";
    case TpCut::HeadFromEmbedding: return "head from embedding";
    case TpCut::ExpertRows: return "rows of each expert";
  }
  return "?";
}

TpDims read_tp_dims(const GgufFile& meta) {
  TpDims d;
  d.arch = meta.get_str("general.architecture");
  if (!is_llama_family(d.arch) && !d.deepseek4()) {
    throw std::runtime_error("tensor-parallel files exist for the llama family (llama, qwen2, qwen3) and deepseek4 "
                             "only; this model's architecture is '" + d.arch + "'");
  }
  const std::string a = d.arch + ".";
  d.n_embd = meta.get_int(a + "embedding_length");
  d.n_head = int(meta.get_int(a + "attention.head_count"));
  if (d.deepseek4()) {
    d.n_ff = meta.get_int(a + "expert_feed_forward_length");
    d.n_head_kv = 1;  // the one latent KV row: every rank computes it whole
    d.o_groups = int(meta.get_int(a + "attention.output_group_count"));
    d.o_lora_rank = meta.get_int(a + "attention.output_lora_rank");
    d.n_ff_shared = d.n_ff * std::max<int64_t>(1, meta.get_int(a + "expert_shared_count", 0));
    if (d.o_groups < 1 || d.o_lora_rank < 1 || d.n_head < 1 || d.n_head % d.o_groups != 0) {
      throw std::runtime_error(fmt::format("deepseek4: malformed attention dimensions (heads {}, output groups {})",
                                           d.n_head, d.o_groups));
    }
  } else {
    d.n_ff = meta.get_int(a + "feed_forward_length");
    d.n_head_kv = int(meta.get_int(a + "attention.head_count_kv", d.n_head));
  }
  if (d.n_embd < 1 || d.n_ff < 1 || d.n_head < 1 || d.n_head_kv < 1 || d.n_head % d.n_head_kv != 0) {
    throw std::runtime_error(fmt::format("{}: malformed dimensions (embedding {}, ffn {}, heads {}, kv heads {})",
                                         d.arch, d.n_embd, d.n_ff, d.n_head, d.n_head_kv));
  }
  d.head_dim_k = int(meta.get_int(a + "attention.key_length", d.n_embd / d.n_head));
  d.head_dim_v = int(meta.get_int(a + "attention.value_length", d.n_embd / d.n_head));
  if (meta.has(a + "vocab_size")) {
    d.n_vocab = meta.get_int(a + "vocab_size");
  } else if (const GgufTensorInfo* e = meta.find_tensor("token_embd.weight")) {
    d.n_vocab = e->ne[1];
  } else if (const GgufTensorInfo* o = meta.find_tensor("output.weight")) {
    d.n_vocab = o->ne[1];
  } else if (const GgufValue* tokens = meta.find("tokenizer.ggml.tokens")) {
    d.n_vocab = int64_t(tokens->items.size());
  }
  return d;
}

std::pair<int64_t, int64_t> tp_vocab_range(int64_t n_vocab, int n, int rank) {
  const int64_t chunk = (n_vocab + n - 1) / n;
  const int64_t begin = std::min(n_vocab, chunk * rank);
  return {begin, std::min(chunk, n_vocab - begin)};
}

TpSlice tp_slice_tensor(const TpDims& d, const GgufTensorInfo& t, int n, int rank) {
  if (n < 2) refuse(t, n, "tensor parallelism needs at least 2 ranks");
  const TensorPlace place = tensor_place(t.name);
  if (place.kind != TensorPlace::kLayer) {
    if (t.name == "output.weight") {
      const auto [begin, count] = tp_vocab_range(t.ne[1], n, rank);
      if (count < 1) refuse(t, n, "rank " + std::to_string(rank) + " would get no vocabulary rows");
      return rows(t, n, begin, count);
    }
    // token_embd (the embedding stays whole), output_norm, rope_freqs: small or per position.
    return replicated(t);
  }
  // "blk.N.SUFFIX"
  const std::string_view name(t.name);
  const std::string_view suffix = name.substr(name.find('.', 4) + 1);
  if (d.deepseek4()) return ds4_layer_slice(d, t, suffix, n, rank);
  const auto is = [&](std::string_view what) { return suffix == what; };
  const int64_t dk = d.head_dim_k, dv = d.head_dim_v;
  if (is("attn_norm.weight") || is("ffn_norm.weight") || is("attn_q_norm.weight") || is("attn_k_norm.weight") ||
      is("rope_freqs.weight")) {
    return replicated(t);  // per embedding or per head_dim: every rank needs all of it
  }
  if (is("attn_q.weight") || is("attn_q.bias")) {
    check_divides(t, n, d.n_head_kv, "head_count_kv");
    const int64_t h = d.n_head / n;
    return rows(t, n, rank * h * dk, h * dk);
  }
  if (is("attn_k.weight") || is("attn_k.bias") || is("attn_v.weight") || is("attn_v.bias")) {
    check_divides(t, n, d.n_head_kv, "head_count_kv");
    const int64_t h = d.n_head_kv / n, hd = suffix[5] == 'k' ? dk : dv;
    return rows(t, n, rank * h * hd, h * hd);
  }
  if (is("attn_output.weight")) {
    check_divides(t, n, d.n_head_kv, "head_count_kv");
    const int64_t h = d.n_head / n;
    return columns(t, n, rank * h * dv, h * dv);
  }
  if (is("ffn_gate.weight") || is("ffn_up.weight")) {
    check_divides(t, n, d.n_ff, "feed_forward_length");
    const int64_t f = d.n_ff / n;
    return rows(t, n, rank * f, f);
  }
  if (is("ffn_down.weight")) {
    check_divides(t, n, d.n_ff, "feed_forward_length");
    const int64_t f = d.n_ff / n;
    return columns(t, n, rank * f, f);
  }
  refuse(t, n, "no tensor-parallel cut is known for it");
}

TpSlice tp_tied_head_slice(const TpDims& d, const GgufTensorInfo& token_embd, int n, int rank) {
  (void)d;
  const auto [begin, count] = tp_vocab_range(token_embd.ne[1], n, rank);
  if (count < 1) refuse(token_embd, n, "rank " + std::to_string(rank) + " would get no vocabulary rows");
  TpSlice s = rows(token_embd, n, begin, count);
  s.name = "output.weight";
  s.cut = TpCut::HeadFromEmbedding;
  return s;
}

void tp_check_model(const TpDims& d, const std::vector<GgufTensorInfo>& tensors, int n) {
  if (n < 2) throw std::runtime_error("tensor parallelism needs at least 2 ranks (got " + std::to_string(n) + ")");
  // Tensor by tensor first, so that a refusal names the tensor that cannot be cut.
  bool has_output = false;
  const GgufTensorInfo* embd = nullptr;
  for (const GgufTensorInfo& t : tensors) {
    for (int r = 0; r < n; ++r) tp_slice_tensor(d, t, n, r);
    has_output = has_output || t.name == "output.weight";
    if (t.name == "token_embd.weight") embd = &t;
  }
  if (!has_output && embd) {
    for (int r = 0; r < n; ++r) tp_tied_head_slice(d, *embd, n, r);
  }
  if (d.deepseek4()) {
    if (d.o_groups % n != 0) {
      throw std::runtime_error(fmt::format("{} tensor-parallel ranks do not divide the {} output groups", n, d.o_groups));
    }
  } else if (d.n_head_kv % n != 0 || d.n_head % n != 0) {
    throw std::runtime_error(fmt::format("{} tensor-parallel ranks do not divide the {} KV heads ({} query heads)", n,
                                         d.n_head_kv, d.n_head));
  }
  if (d.n_ff % n != 0) {
    throw std::runtime_error(fmt::format("{} tensor-parallel ranks do not divide the FFN width {}", n, d.n_ff));
  }
}

std::vector<TpKeyChange> tp_key_changes(const GgufFile& meta, const TpDims& d, int n) {
  const std::string a = d.arch + ".";
  // deepseek4: the heads and output groups of the rank and the width of each
  // of its experts (the latent KV is whole: head_count_kv stays).
  const std::string head = a + "attention.head_count",
                    head_kv = d.deepseek4() ? a + "attention.output_group_count" : a + "attention.head_count_kv",
                    ff = a + (d.deepseek4() ? "expert_feed_forward_length" : "feed_forward_length"),
                    key_len = a + "attention.key_length", value_len = a + "attention.value_length";
  // The divided counts keep the source's integer type; head_dim would change
  // with head_count (its default is n_embd / n_head), so it is written out.
  auto divided = [&](const std::string& key) {
    GgufValue v = meta.find(key) ? *meta.find(key) : GgufValue::of_u32(0);
    if (!v.is_integer()) throw std::runtime_error(key + " is not an integer (per-layer arrays are not supported)");
    v.num.u = uint64_t(v.as_int() / n);
    return v;
  };
  std::vector<TpKeyChange> out;
  for (const auto& [key, value] : meta.metadata()) {
    if (key == head || key == head_kv || key == ff) out.push_back({key, divided(key), false});
  }
  if (!meta.has(key_len)) out.push_back({key_len, GgufValue::of_u32(uint32_t(d.head_dim_k)), true});
  if (!meta.has(value_len)) out.push_back({value_len, GgufValue::of_u32(uint32_t(d.head_dim_v)), true});
  // A later stage has no token_embd and its output.weight holds a slice of
  // the vocabulary: without the key its vocabulary would read as that slice.
  const std::string vocab = a + "vocab_size";
  if (!meta.has(vocab) && d.n_vocab > 0) out.push_back({vocab, GgufValue::of_u32(uint32_t(d.n_vocab)), true});
  return out;
}

std::string tp_rank_file_name(const std::string& stem, int n, int rank) {
  return stem + ".tp" + std::to_string(n) + "-r" + std::to_string(rank) + ".gguf";
}

}  // namespace baton
