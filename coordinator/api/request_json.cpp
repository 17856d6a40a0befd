#include "coordinator/api/request_json.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace baton {

using json = nlohmann::json;

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace request_json {

namespace {

// A first pass over the body that builds nothing: it stops at the first
// container nested deeper than kMaxJsonDepth or the first value past
// max_values, so that the tree built afterwards stays a small multiple of the
// body (nlohmann's tree costs tens of bytes per value and per level, whatever
// the value's own size).
class ShapeCheck : public nlohmann::json_sax<json> {
 public:
  explicit ShapeCheck(int64_t max_values) : max_values_(max_values) {}
  bool too_deep = false, too_many = false;

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return enter(); }
  bool key(string_t&) override { return value(); }
  bool end_object() override { return leave(); }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return leave(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool value() {
    too_many = ++values_ > max_values_;
    return !too_many;
  }
  bool enter() {
    too_deep = ++depth_ > kMaxJsonDepth;
    return !too_deep && value();
  }
  bool leave() {
    --depth_;
    return true;
  }
  const int64_t max_values_;
  int64_t values_ = 0;
  int depth_ = 0;
};

}  // namespace

json parse_body(std::string_view body, int64_t n_ctx) {
  const int64_t max_values = max_json_values(n_ctx);
  ShapeCheck check(max_values);
  if (!json::sax_parse(body.begin(), body.end(), &check)) {
    if (check.too_deep) {
      throw invalid(fmt::format("The JSON body nests arrays and objects deeper than {} levels.", kMaxJsonDepth), "",
                    "invalid_json");
    }
    if (check.too_many) {
      throw invalid(fmt::format("The JSON body holds more than {} values (keys included).", max_values), "",
                    "invalid_json");
    }
  }
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    throw invalid("We could not parse the JSON body of your request. The body must be a JSON object (with valid "
                  "UTF-8).",
                  "", "invalid_json");
  }
  if (!j.is_object()) throw invalid("The request body must be a JSON object.", "", "invalid_json");
  return j;
}

double number_param(const json& body, const char* key, double def, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number()) throw wrong_type(key, "a number", *v);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) {
    throw invalid(fmt::format("'{}' must be between {} and {}; got {}.", key, lo, hi, x), key);
  }
  return x;
}

bool is_integral(const json& v) {
  if (v.is_number_integer()) return true;
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9.0e15;
}

int64_t int_param(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!is_integral(*v)) throw wrong_type(key, "an integer", *v);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    throw invalid(fmt::format("'{}' must be between {} and {}.", key, lo, hi), key);
  }
  const int64_t x = v->is_number_float() ? int64_t(v->get<double>()) : v->get<int64_t>();
  if (x < lo || x > hi) throw invalid(fmt::format("'{}' must be between {} and {}; got {}.", key, lo, hi, x), key);
  return x;
}

bool bool_param(const json& body, const char* key, bool def) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_boolean()) throw wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<int64_t> max_tokens_param(const json& body, const char* key) {
  if (!field(body, key)) return std::nullopt;
  return int_param(body, key, 0, 1, std::numeric_limits<int32_t>::max());
}

std::vector<std::string> stop_strings(const json& v, const char* param) {
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > kMaxStops) throw invalid(fmt::format("'{}' takes at most {} strings.", param, kMaxStops), param);
    for (const json& item : v) {
      if (!item.is_string()) throw wrong_type(param, "a string or an array of strings", item);
      stops.push_back(item.get<std::string>());
    }
  } else {
    throw wrong_type(param, "a string or an array of strings", v);
  }
  std::vector<std::string> out;
  for (auto& st : stops) {
    if (st.size() > kMaxStopBytes) {
      throw invalid(fmt::format("A stop string is at most {} bytes.", kMaxStopBytes), param);
    }
    if (!st.empty()) out.push_back(std::move(st));
  }
  return out;
}

void check_model(const json& body, const ModelInfo& model) {
  const json* v = field(body, "model");
  if (!v) {
    throw invalid("You must provide a model parameter.", "model", "missing_required_parameter");
  }
  if (!v->is_string()) throw wrong_type("model", "a string", *v);
  if (v->get<std::string>() != model.id) {
    throw ApiError(404,
                   fmt::format("The model '{}' does not exist. This server serves '{}'.",
                               sanitize_utf8(v->get<std::string>().substr(0, 200)), model.id),
                   "invalid_request_error", "model", "model_not_found", "model_not_found");
  }
}

void fit_context(GenerationRequest& gen, const ModelInfo& model, std::optional<int64_t> max_tokens,
                 int64_t default_max, const char* param, const char* prompt_param) {
  const int64_t n_prompt = int64_t(gen.prompt.size());
  if (n_prompt >= model.n_ctx) {
    throw ApiError(400,
                   fmt::format("This model's maximum context length is {} tokens. However, your prompt has {} tokens, "
                               "which leaves no room for a completion.",
                               model.n_ctx, n_prompt),
                   "invalid_request_error", prompt_param, "context_length_exceeded", "context_length");
  }
  if (max_tokens) {
    if (n_prompt + *max_tokens > model.n_ctx) {
      throw ApiError(400,
                     fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                 "({} in the prompt, {} for the completion). Please reduce the prompt or the "
                                 "completion length.",
                                 model.n_ctx, n_prompt + *max_tokens, n_prompt, *max_tokens),
                     "invalid_request_error", param, "context_length_exceeded", "context_length");
    }
    gen.max_tokens = *max_tokens;
  } else {
    gen.max_tokens = std::min(default_max, model.n_ctx - n_prompt);
  }
}

void add_chat_stops(GenerationRequest& gen, const ModelInfo& model, const JinjaTemplate* tmpl) {
  // The family's end-of-turn tokens and strings are the model's way to end
  // generation: ignore_eos drops them along with the tokenizer's EOS. Text
  // stops are the Plain family's; a template's turns end on tokens.
  if (gen.ignore_eos) return;
  if (!tmpl)
    for (const auto& s : model.chat_stop_strings) gen.stop.push_back(s);
  gen.stop_tokens = model.chat_stop_tokens;
}

}  // namespace request_json
}  // namespace baton
