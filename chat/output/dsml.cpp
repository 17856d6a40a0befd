// ChatOutputParser's DeepSeek DSML steps (V3.2 and V4 templates):
//   <｜DSML｜tool_calls>
//   <｜DSML｜invoke name="get_weather">
//   <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
//   <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
//   </｜DSML｜invoke>
//   </｜DSML｜tool_calls>
// become one call whose arguments are {"city": "Paris", "days": 3}, streamed
// parameter by parameter.
#include <nlohmann/json.hpp>

#include "chat/output/parser.h"
#include "chat/output/parser_impl.h"

namespace baton {

using namespace chat_text;

void ChatOutputParser::close_dsml_call() {
  emit_arguments(dsml_params_ > 0 ? "}" : "{}");
  ++dsml_calls_;
}

bool ChatOutputParser::step_dsml_block(bool at_end) {
  const size_t n = buf_.size();
  const size_t i = skip_ws(buf_, prefix_);
  auto broken = [&] {
    if (dsml_calls_ == 0) {
      reject();
    } else {
      mode_ = Mode::content;
    }
    return true;
  };
  if (i == n && !at_end) return false;
  if (starts_with(buf_, i, kDsmlInvoke)) {
    const size_t from = i + kDsmlInvoke.size();
    const size_t q = buf_.find('"', from);
    if (q == std::string::npos || q + 1 >= n) {
      if (!at_end && n - from <= kMaxName + 1) return false;
      return broken();
    }
    const std::string name = buf_.substr(from, q - from);
    if (buf_[q + 1] != '>' || !name_ok(name)) return broken();
    begin_call(name);
    consume(q + 2);
    dsml_params_ = 0;
    mode_ = Mode::dsml_invoke;
    return true;
  }
  if (dsml_calls_ > 0 && starts_with(buf_, i, dsml_close_)) {
    consume(i + dsml_close_.size());
    mode_ = Mode::content;
    return true;
  }
  if (!at_end && (prefix_of(buf_, i, kDsmlInvoke) || (dsml_calls_ > 0 && prefix_of(buf_, i, dsml_close_)))) {
    return false;
  }
  return broken();
}

bool ChatOutputParser::step_dsml_invoke(bool at_end) {
  consume(skip_ws(buf_, 0));  // whitespace between elements
  const size_t n = buf_.size();
  auto broken = [&] {
    close_dsml_call();
    mode_ = Mode::content;
    return true;
  };
  if (n == 0) {
    if (!at_end) return false;
    close_dsml_call();
    mode_ = Mode::content;
    return false;
  }
  if (starts_with(buf_, 0, kDsmlInvokeClose)) {
    consume(kDsmlInvokeClose.size());
    close_dsml_call();
    prefix_ = 0;
    mode_ = Mode::dsml_block;
    return true;
  }
  if (starts_with(buf_, 0, kDsmlParam)) {
    const size_t from = kDsmlParam.size();
    const size_t q = buf_.find('"', from);
    if (q == std::string::npos) {
      if (!at_end && n - from <= kMaxName) return false;
      return broken();
    }
    const std::string key = buf_.substr(from, q - from);
    if (!name_ok(key)) return broken();
    size_t k = q + 1;
    int is_string = -1;  // no attribute: a JSON value when it parses, else a string
    if (starts_with(buf_, k, ">")) {
      k += 1;
    } else if (starts_with(buf_, k, kStringTrue)) {
      k += kStringTrue.size();
      is_string = 1;
    } else if (starts_with(buf_, k, kStringFalse)) {
      k += kStringFalse.size();
      is_string = 0;
    } else if (!at_end && (k == n || prefix_of(buf_, k, kStringTrue) || prefix_of(buf_, k, kStringFalse))) {
      return false;
    } else {
      return broken();
    }
    std::string head = dsml_params_ > 0 ? ", " : "{";
    head += json_quote(key);
    head += ": ";
    if (is_string == 1) head += '"';
    emit_arguments(head);
    ++dsml_params_;
    consume(k);
    mode_ = is_string == 1 ? Mode::dsml_string : Mode::dsml_value;
    return true;
  }
  if (!at_end && (prefix_of(buf_, 0, kDsmlInvokeClose) || prefix_of(buf_, 0, kDsmlParam))) return false;
  return broken();
}

bool ChatOutputParser::step_dsml_string(bool at_end) {
  const size_t p = buf_.find(kDsmlParamClose);
  if (p != std::string::npos) {
    emit_arguments(json_escape(std::string_view(buf_).substr(0, p)) + '"');
    consume(p + kDsmlParamClose.size());
    mode_ = Mode::dsml_invoke;
    return true;
  }
  const size_t keep = at_end ? buf_.size() : utf8_whole(buf_, partial_start(buf_, kDsmlParamClose));
  emit_arguments(json_escape(std::string_view(buf_).substr(0, keep)));
  consume(keep);
  if (at_end) {
    emit_arguments("\"");
    close_dsml_call();
    mode_ = Mode::content;
  }
  return false;
}

bool ChatOutputParser::step_dsml_value(bool at_end) {
  const size_t p = buf_.find(kDsmlParamClose);
  if (p == std::string::npos && !at_end) return false;
  const size_t len = p == std::string::npos ? buf_.size() : p;
  const std::string_view v = trim_ws(std::string_view(buf_).substr(0, len));
  emit_arguments(nlohmann::json::accept(v) ? std::string(v) : json_quote(v));
  if (p == std::string::npos) {
    consume(len);
    close_dsml_call();
    mode_ = Mode::content;
    return false;
  }
  consume(p + kDsmlParamClose.size());
  mode_ = Mode::dsml_invoke;
  return true;
}

}  // namespace baton
