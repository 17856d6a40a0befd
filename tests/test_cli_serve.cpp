// `baton serve` end to end: the built binary on an ephemeral loopback port,
// driven with raw HTTP over sockets. Greedy output equals `baton run`'s,
// streams are well formed, every bad input gets its OpenAI-style 4xx, API
// keys, the bounded queue (429), cancellation on disconnect, the official
// `openai` npm client (tests/serve/), and a short load test whose counts must
// match /metrics. The pure pieces (text assembly, logprobs, request parsing)
// are checked directly first.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/generation.h"
#include "coordinator/openai_api.h"
#include "engine/gguf.h"
#include "engine/tokenizer.h"
#include "net/auth.h"
#include "net/codec.h"
#include "net/protocol.h"
#include "tests/test_util.h"

namespace baton {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

const std::string kModel = "stories260K";

std::string stories() { return test::model_path("stories260K.gguf"); }

// ---- the pure pieces ----

TEST(ServeText, AssemblerHoldsBackStopPrefixesAndSplitCharacters) {
  TextAssembler t({"\nUser:", "END"});
  EXPECT_EQ(t.push("Hello"), "Hello");
  EXPECT_EQ(t.push(" wor"), " wor");
  EXPECT_EQ(t.push("ld\nUs"), "ld");  // "\nUs" may begin "\nUser:"
  EXPECT_EQ(t.push("ed"), "\nUsed");  // it did not
  EXPECT_EQ(t.push("E"), "");
  EXPECT_EQ(t.push("N"), "");
  EXPECT_EQ(t.push("Dless"), "");  // "END" found: nothing after it, ever
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.push("more"), "");
  EXPECT_EQ(t.flush(), "");

  TextAssembler u({});
  const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes, split over tokens
  EXPECT_EQ(u.push("a" + euro.substr(0, 1)), "a");
  EXPECT_EQ(u.push(euro.substr(1, 1)), "");
  EXPECT_EQ(u.push(euro.substr(2)), euro);
  EXPECT_EQ(u.push("\xE2\x82"), "");
  EXPECT_EQ(u.flush(), "\xEF\xBF\xBD\xEF\xBF\xBD");  // an unfinished character at the end
  EXPECT_EQ(sanitize_utf8("ok\xFF\xC0\x80z"), "ok\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // a UTF-16 surrogate
}

TEST(ServeText, AssemblerMatchesStopStringsAcrossRandomSplits) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::string alphabet = "ab\xC3\xA9XY";  // includes a two-byte character
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const size_t len = 1 + rng() % 40;
    while (text.size() < len) {
      size_t k = rng() % 5;
      text += k == 2 ? std::string("\xC3\xA9") : std::string(1, alphabet[k < 2 ? k : k + 1]);
    }
    const std::string stop = rng() % 2 ? "aXb" : "\xC3\xA9Y";
    TextAssembler t({stop});
    std::string out;
    for (size_t at = 0; at < text.size() && !t.stopped();) {
      size_t n = 1 + rng() % 4;
      out += t.push(text.substr(at, n));
      at += n;
    }
    if (!t.stopped()) out += t.flush();
    const size_t pos = text.find(stop);
    EXPECT_EQ(out, pos == std::string::npos ? text : text.substr(0, pos)) << "round " << round;
  }
}

TEST(ServeText, LogprobsAreALogSoftmaxWithSortedAlternatives) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> logits(1000);
  for (float& x : logits) x = nd(rng);
  GeneratedToken g;
  compute_logprobs(logits.data(), int64_t(logits.size()), 17, 5, g);
  double sum = 0;
  float max = logits[0];
  for (float x : logits) max = std::max(max, x);
  for (float x : logits) sum += std::exp(double(x) - max);
  EXPECT_NEAR(g.logprob, logits[17] - max - std::log(sum), 1e-4);
  ASSERT_EQ(g.top.size(), 5u);
  EXPECT_NEAR(g.top[0].logprob, -std::log(sum), 1e-4);
  EXPECT_EQ(logits[size_t(g.top[0].id)], max);
  for (size_t i = 1; i < g.top.size(); ++i) EXPECT_GE(g.top[i - 1].logprob, g.top[i].logprob);
}

TEST(ServeText, ConstantTimeCompare) {
  EXPECT_TRUE(constant_time_equal("sk-abc", "sk-abc"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-abd"));
  EXPECT_FALSE(constant_time_equal("sk-abc", "sk-ab"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
}

ModelInfo stories_info() {
  GgufFile f = GgufFile::open(stories());
  ModelInfo m;
  m.id = kModel;
  m.n_ctx = 128;
  m.n_vocab = 512;
  m.tokenizer = Tokenizer::from_gguf(f);
  m.chat_family = detect_chat_family(f);
  m.chat_stop_tokens = chat_stop_tokens(m.chat_family, *m.tokenizer);
  m.chat_stop_strings = chat_stop_strings(m.chat_family);
  return m;
}

TEST(ServeApi, ParsesRequestsIntoGenerationRequests) {
  ModelInfo m = stories_info();
  ApiRequest c = parse_completion_request(
      R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":7,"temperature":0,"top_k":5,"min_p":0.1,
          "top_p":0.5,"seed":42,"stop":["x","yz"],"logprobs":2,"stream":true,"stream_options":{"include_usage":true},
          "logit_bias":{"2":-100}})",
      m);
  EXPECT_EQ(c.gen.prompt, (std::vector<int32_t>{1, 403, 407, 261, 378}));
  EXPECT_EQ(c.gen.max_tokens, 7);
  EXPECT_EQ(c.gen.sampling.temperature, 0.f);
  EXPECT_EQ(c.gen.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(c.gen.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(c.gen.sampling.top_p, 0.5f);
  EXPECT_EQ(c.gen.sampling.seed, 42u);
  EXPECT_EQ(c.gen.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(c.gen.top_logprobs, 2);
  EXPECT_TRUE(c.stream && c.include_usage && c.logprobs);
  ASSERT_EQ(c.gen.logit_bias.size(), 1u);
  EXPECT_EQ(c.gen.logit_bias[0].first, 2);

  // Defaults: OpenAI's temperature 1 / top_p 1, 16 tokens for completions,
  // the rest of the context for chat, no logprobs.
  ApiRequest d = parse_completion_request(R"({"model":"stories260K","prompt":[1,403]})", m);
  EXPECT_EQ(d.gen.prompt, (std::vector<int32_t>{1, 403}));
  EXPECT_EQ(d.gen.max_tokens, 16);
  EXPECT_EQ(d.gen.sampling.temperature, 1.f);
  EXPECT_EQ(d.gen.top_logprobs, -1);
  ApiRequest chat = parse_chat_request(R"({"model":"stories260K","messages":[{"role":"user","content":"Hi"}]})", m);
  EXPECT_EQ(chat.gen.max_tokens, 128 - int64_t(chat.gen.prompt.size()));
  EXPECT_FALSE(chat.gen.stop_tokens.empty());
  EXPECT_EQ(chat.gen.stop, m.chat_stop_strings);
}

// ---- the server process ----

// `baton serve` on an ephemeral loopback port; stderr goes to a file.
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> extra, bool wait_ready = true) {
    err_path_ = dir_.file("stderr.txt");
    std::vector<std::string> argv = {test::baton_binary(), "serve", "--host", "127.0.0.1", "--port", "0",
                                     "--threads", "1"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    int out[2];
    if (pipe(out) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(out[1], 1);
      dup2(err, 2);
      close(out[0]);
      close(out[1]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    out_fd_ = out[0];
    const std::string listening = "baton serve: listening on http://127.0.0.1:";
    std::string line;
    while (read_line(line, 60s)) {
      if (line.rfind(listening, 0) == 0) {
        port_ = std::stoi(line.substr(listening.size()));
        if (!wait_ready) return;
      } else if (line.find("baton serve: ready") != std::string::npos) {
        return;
      }
    }
    throw std::runtime_error("baton serve did not start: " + stderr_text());
  }
  ~ServeProcess() { stop(); }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string stderr_text() const {
    try {
      auto b = test::read_file(err_path_);
      return std::string(b.begin(), b.end());
    } catch (...) {
      return "";
    }
  }
  // SIGTERM and wait; the exit status (-1 when killed by a signal or stuck).
  int stop() {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 300; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      std::this_thread::sleep_for(50ms);
      if (i == 299) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    pid_ = -1;
    close(out_fd_);
    return exit_code_;
  }

 private:
  bool read_line(std::string& line, std::chrono::seconds timeout) {
    line.clear();
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (size_t nl = out_buf_.find('\n'); nl != std::string::npos) {
        line = out_buf_.substr(0, nl);
        out_buf_.erase(0, nl + 1);
        return true;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, int(left.count())) <= 0) return false;
      char buf[4096];
      ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) return false;
      out_buf_.append(buf, size_t(n));
    }
  }

  test::TempDir dir_;
  std::string err_path_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  int exit_code_ = -1;
  std::string out_buf_;
};

// ---- a raw HTTP client ----

int connect_to(int port, std::chrono::seconds recv_timeout = 60s) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    throw std::runtime_error("connect failed");
  }
  timeval tv{recv_timeout.count(), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool send_all(int fd, const std::string& data) {
  size_t at = 0;
  while (at < data.size()) {
    ssize_t n = send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += size_t(n);
  }
  return true;
}

std::string read_all(int fd) {
  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  bool chunked = false;
  bool complete = false;  // the body ended as the headers said
  json j() const { return json::parse(body); }
};

Response parse_response(const std::string& raw) {
  Response r;
  size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || head_end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  std::istringstream head(raw.substr(0, head_end));
  std::string line;
  std::getline(head, line);
  while (std::getline(head, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (char& c : name) c = char(std::tolower(static_cast<unsigned char>(c)));
    size_t v = line.find_first_not_of(' ', colon + 1);
    r.headers[name] = v == std::string::npos ? "" : line.substr(v);
  }
  std::string rest = raw.substr(head_end + 4);
  if (r.headers["transfer-encoding"] == "chunked") {
    r.chunked = true;
    size_t at = 0;
    for (;;) {
      size_t nl = rest.find("\r\n", at);
      if (nl == std::string::npos) break;
      size_t n = std::stoul(rest.substr(at, nl - at), nullptr, 16);
      if (n == 0) {
        r.complete = rest.compare(nl, 4, "\r\n\r\n") == 0;
        break;
      }
      if (nl + 2 + n + 2 > rest.size()) break;
      r.body += rest.substr(nl + 2, n);
      at = nl + 2 + n + 2;
    }
  } else {
    size_t len = r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : rest.size();
    r.body = rest.substr(0, len);
    r.complete = rest.size() >= len;
  }
  return r;
}

std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                         const std::vector<std::string>& headers = {}) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return req + "\r\n" + body;
}

Response http(int port, const std::string& method, const std::string& path, const std::string& body = "",
              const std::vector<std::string>& headers = {}) {
  int fd = connect_to(port);
  send_all(fd, request_text(method, path, body, headers));
  std::string raw = read_all(fd);
  close(fd);
  return parse_response(raw);
}

Response post(int port, const std::string& path, const json& body, const std::vector<std::string>& headers = {}) {
  return http(port, "POST", path, body.dump(), headers);
}

// The "data: ..." payloads of an SSE body, in order.
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) {
      out.push_back("<unterminated>" + body.substr(at));
      break;
    }
    std::string ev = body.substr(at, end - at);
    out.push_back(ev.rfind("data: ", 0) == 0 ? ev.substr(6) : "<malformed>" + ev);
    at = end + 2;
  }
  return out;
}

// Every error is {"error": {"message", "type", "param", "code"}}.
void expect_error(const Response& r, int status, const std::string& code, const std::string& param = "") {
  EXPECT_EQ(r.status, status) << r.body;
  json j;
  try {
    j = r.j();
  } catch (const std::exception&) {
    ADD_FAILURE() << "not JSON: " << r.body;
    return;
  }
  ASSERT_TRUE(j.contains("error")) << r.body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty()) << r.body;
  EXPECT_TRUE(e["type"].is_string()) << r.body;
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r.body;
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << r.body;
  }
  if (!param.empty()) {
    EXPECT_EQ(e["param"], param) << r.body;
  }
}

// A metric's value from /metrics text ("name{labels}" exactly as printed).
double metric(int port, const std::string& series) {
  Response r = http(port, "GET", "/metrics");
  std::istringstream in(r.body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  return -1;
}

json health(int port) { return http(port, "GET", "/health").j(); }

// Waits until the engine holds no sequence and no queued request.
bool wait_idle(int port, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    json h = health(port);
    if (h["slots"]["busy"] == 0 && h["queue"]["depth"] == 0) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

json run_json(const std::string& prompt, int n) {
  auto r = test::run_command({test::baton_binary(), "run", "-m", stories(), "-p", prompt, "-n", std::to_string(n),
                              "--temp", "0", "--json", "--threads", "1"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return json::parse(r.out);
}

// ---- end to end ----

TEST(Serve, GreedyCompletionEqualsBatonRunAndStreamsAgree) {
  ServeProcess server({"-m", stories()});
  const int port = server.port();
  for (const std::string prompt : {"Once upon a time", "Tom and his dog"}) {
    SCOPED_TRACE(prompt);
    json run = run_json(prompt, 48);
    const std::string want = run["text"];
    json req = {{"model", kModel}, {"prompt", prompt}, {"max_tokens", 48}, {"temperature", 0}};
    Response r = post(port, "/v1/completions", req);
    ASSERT_EQ(r.status, 200) << r.body;
    json j = r.j();
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["model"], kModel);
    EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(j["choices"][0]["text"], want);
    EXPECT_EQ(j["choices"][0]["finish_reason"], run["stop"] == "length" ? "length" : "stop");
    EXPECT_EQ(j["usage"]["prompt_tokens"], run["n_prompt"]);
    EXPECT_EQ(j["usage"]["completion_tokens"], run["n_gen"]);
    EXPECT_EQ(j["usage"]["total_tokens"], run["n_prompt"].get<int>() + run["n_gen"].get<int>());

    // The same request streamed: chunks of the same text, then [DONE].
    req["stream"] = true;
    req["stream_options"] = {{"include_usage", true}};
    Response s = post(port, "/v1/completions", req);
    ASSERT_EQ(s.status, 200);
    EXPECT_TRUE(s.chunked && s.complete);
    EXPECT_EQ(s.headers["content-type"], "text/event-stream");
    auto events = sse_events(s.body);
    ASSERT_GE(events.size(), 3u);
    EXPECT_EQ(events.back(), "[DONE]");
    std::string text, finish;
    json usage;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      json c = json::parse(events[i]);
      EXPECT_EQ(c["id"].get<std::string>().rfind("cmpl-", 0), 0u);
      EXPECT_EQ(c["object"], "text_completion");
      EXPECT_EQ(c["model"], kModel);
      ASSERT_TRUE(c.contains("usage"));
      if (c["choices"].empty()) {
        usage = c["usage"];
        EXPECT_EQ(i + 2, events.size()) << "usage comes last";
        continue;
      }
      EXPECT_TRUE(c["usage"].is_null());
      text += c["choices"][0]["text"].get<std::string>();
      if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, want);
    EXPECT_EQ(finish, j["choices"][0]["finish_reason"]);
    EXPECT_EQ(usage, j["usage"]);
  }

  // Logprobs: greedy picks the most likely token, so each chosen logprob is
  // the first alternative's.
  Response lp = post(port, "/v1/completions",
                     {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0},
                      {"logprobs", 3}});
  ASSERT_EQ(lp.status, 200) << lp.body;
  json l = lp.j()["choices"][0]["logprobs"];
  ASSERT_EQ(l["tokens"].size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    ASSERT_EQ(l["top_logprobs"][i].size(), 3u);
    double best = -1e9;
    for (auto& [k, v] : l["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_NEAR(l["token_logprobs"][i].get<double>(), best, 1e-5);
    EXPECT_LE(l["token_logprobs"][i].get<double>(), 0.0);
  }
  std::string joined;
  for (auto& t : l["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, lp.j()["choices"][0]["text"]);
}

TEST(Serve, ChatStreamsTheSameAsNonStreamingAndSeedsRepeat) {
  ServeProcess server({"-m", stories()});
  const int port = server.port();
  json req = {{"model", kModel},
              {"messages", {{{"role", "system"}, {"content", "You tell stories."}},
                            {{"role", "user"}, {"content", "Tell me about a cat."}}}},
              {"max_tokens", 40},
              {"temperature", 0.9},
              {"seed", 1234},
              {"logprobs", true},
              {"top_logprobs", 2}};
  Response a = post(port, "/v1/chat/completions", req);
  ASSERT_EQ(a.status, 200) << a.body;
  json ja = a.j();
  EXPECT_EQ(ja["object"], "chat.completion");
  EXPECT_EQ(ja["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(ja["choices"][0]["message"]["role"], "assistant");
  const std::string text = ja["choices"][0]["message"]["content"];
  EXPECT_FALSE(text.empty());
  const json& content = ja["choices"][0]["logprobs"]["content"];
  EXPECT_EQ(int(content.size()), ja["usage"]["completion_tokens"].get<int>());
  for (const json& t : content) {
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
    EXPECT_TRUE(t["bytes"].is_array());
  }
  // The same seed gives the same text; another seed other text.
  Response again = post(port, "/v1/chat/completions", req);
  EXPECT_EQ(again.j()["choices"][0]["message"]["content"], text);
  json other = req;
  other["seed"] = 999;
  EXPECT_NE(post(port, "/v1/chat/completions", other).j()["choices"][0]["message"]["content"], text);

  req["stream"] = true;
  Response s = post(port, "/v1/chat/completions", req);
  ASSERT_EQ(s.status, 200);
  auto events = sse_events(s.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string streamed;
  size_t n_logprobs = 0;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["id"], first["id"]) << "one id per stream";
    const json& ch = c["choices"][0];
    if (ch["delta"].contains("content")) streamed += ch["delta"]["content"].get<std::string>();
    if (!ch["logprobs"].is_null()) n_logprobs += ch["logprobs"]["content"].size();
    if (!ch["finish_reason"].is_null()) {
      finish = ch["finish_reason"];
      EXPECT_EQ(i + 2, events.size());
    }
  }
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(n_logprobs, content.size());
  EXPECT_EQ(finish, ja["choices"][0]["finish_reason"]);

  Response models = http(port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.j()["data"][0]["id"], kModel);
  EXPECT_EQ(http(port, "GET", "/v1/models/" + kModel).j()["id"], kModel);
  expect_error(http(port, "GET", "/v1/models/gpt-4"), 404, "model_not_found");
}

TEST(Serve, HealthAndMetricsDescribeTheRoute) {
  ServeProcess server({"-m", stories(), "--parallel", "3", "--queue", "5", "--ctx", "256"});
  const int port = server.port();
  Response h = http(port, "GET", "/health");
  ASSERT_EQ(h.status, 200);
  json j = h.j();
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["model"], kModel);
  EXPECT_EQ(j["n_ctx"], 256);
  EXPECT_EQ(j["slots"]["total"], 3);
  EXPECT_EQ(j["queue"]["capacity"], 5);
  ASSERT_EQ(j["stages"].size(), 1u);
  const json& st = j["stages"][0];
  EXPECT_EQ(st["state"], "loaded");
  EXPECT_EQ(st["layers"], json::array({0, 4}));
  EXPECT_EQ(st["progress"], 1.0);
  EXPECT_TRUE(st["embedding"].get<bool>() && st["head"].get<bool>());
  EXPECT_GT(st["memory"]["planned"]["weights"].get<uint64_t>(), 1000000u);
  EXPECT_GT(st["memory"]["planned"]["kv cache"].get<uint64_t>(), 0u);
  EXPECT_EQ(st["memory"]["used"], st["memory"]["planned_total"]);
  EXPECT_GT(st["memory"]["rss"].get<uint64_t>(), 0u);

  Response done = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 5}});
  ASSERT_EQ(done.status, 200);
  const json usage = done.j()["usage"];
  Response m = http(port, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(m.headers["content-type"].rfind("text/plain", 0), 0u);
  for (const char* series : {"baton_http_responses_total{endpoint=\"completions\",code=\"200\"} 1",
                             "baton_slots_total 3", "baton_queue_capacity 5",
                             "baton_time_to_first_token_seconds_count 1", "baton_up 1",
                             "baton_stage_forward_seconds_count{stage=\"0\",phase=\"prefill\"} 1",
                             "baton_memory_bytes{node=\"local\",layers=\"0-4\",kind=\"planned\"}"}) {
    EXPECT_NE(m.body.find(series), std::string::npos) << series << "\n" << m.body;
  }
  EXPECT_EQ(metric(port, "baton_prompt_tokens_total"), usage["prompt_tokens"].get<double>());
  EXPECT_EQ(metric(port, "baton_completion_tokens_total"), usage["completion_tokens"].get<double>());
  EXPECT_GT(usage["completion_tokens"].get<int>(), 0);
  EXPECT_GT(metric(port, "baton_decode_tokens_per_second"), 0);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, BadInputGetsOpenAiErrorsAndNeverCrashes) {
  ServeProcess server({"-m", stories(), "--ctx", "64", "--max-body", "65536", "--request-timeout", "1"});
  const int port = server.port();
  const std::string chat = "/v1/chat/completions", comp = "/v1/completions";
  const json msgs = json::array({{{"role", "user"}, {"content", "Hi"}}});
  auto with = [&](json base, const std::string& key, json value) {
    base[key] = std::move(value);
    return base;
  };
  const json good_chat = {{"model", kModel}, {"messages", msgs}, {"max_tokens", 4}};
  const json good_comp = {{"model", kModel}, {"prompt", "Once"}, {"max_tokens", 4}};
  ASSERT_EQ(post(port, chat, good_chat).status, 200);
  ASSERT_EQ(post(port, comp, good_comp).status, 200);

  // Malformed bodies.
  expect_error(http(port, "POST", chat, "{\"model\": "), 400, "invalid_json");
  expect_error(http(port, "POST", comp, "[1, 2, 3]"), 400, "invalid_json");
  expect_error(http(port, "POST", comp, ""), 400, "invalid_json");
  expect_error(http(port, "POST", comp, "{\"model\":\"stories260K\",\"prompt\":\"\xff\xfe\"}"), 400, "invalid_json");
  // Wrong types and values.
  expect_error(post(port, chat, with(good_chat, "temperature", "hot")), 400, "invalid_type", "temperature");
  expect_error(post(port, chat, with(good_chat, "temperature", 3.5)), 400, "invalid_value", "temperature");
  expect_error(post(port, comp, with(good_comp, "max_tokens", "5")), 400, "invalid_type", "max_tokens");
  expect_error(post(port, comp, with(good_comp, "max_tokens", 0)), 400, "invalid_value", "max_tokens");
  expect_error(post(port, comp, with(good_comp, "max_tokens", 2.5)), 400, "invalid_type", "max_tokens");
  expect_error(post(port, comp, with(good_comp, "top_p", -0.1)), 400, "invalid_value", "top_p");
  expect_error(post(port, comp, with(good_comp, "top_k", true)), 400, "invalid_type", "top_k");
  expect_error(post(port, comp, with(good_comp, "stream", "yes")), 400, "invalid_type", "stream");
  expect_error(post(port, comp, with(good_comp, "stop", 5)), 400, "invalid_type", "stop");
  expect_error(post(port, comp, with(good_comp, "seed", "x")), 400, "invalid_type", "seed");
  expect_error(post(port, comp, with(good_comp, "logprobs", 9)), 400, "invalid_value", "logprobs");
  expect_error(post(port, chat, with(good_chat, "logprobs", 3)), 400, "invalid_type", "logprobs");
  expect_error(post(port, chat, with(good_chat, "top_logprobs", 2)), 400, "", "top_logprobs");
  expect_error(post(port, comp, with(good_comp, "logit_bias", {{"abc", 1}})), 400, "", "logit_bias");
  expect_error(post(port, comp, with(good_comp, "logit_bias", {{"99999", 1}})), 400, "", "logit_bias");
  expect_error(post(port, comp, with(good_comp, "n", 2)), 400, "unsupported_parameter", "n");
  expect_error(post(port, comp, with(good_comp, "presence_penalty", 0.5)), 400, "unsupported_parameter");
  expect_error(post(port, chat, with(good_chat, "tools", json::array({{{"type", "function"}}}))), 400,
               "unsupported_parameter", "tools");
  expect_error(post(port, comp, with(good_comp, "prompt", json::array({1, 99999}))), 400, "", "prompt");
  expect_error(post(port, comp, with(good_comp, "prompt", json::array({"a", "b"}))), 400, "", "prompt");
  expect_error(post(port, comp, with(good_comp, "prompt", 42)), 400, "invalid_type", "prompt");
  // Messages.
  expect_error(post(port, chat, with(good_chat, "messages", "hi")), 400, "invalid_type", "messages");
  expect_error(post(port, chat, with(good_chat, "messages", json::array())), 400, "", "messages");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"role", "tool"}, {"content", "x"}}}))), 400,
               "unsupported_parameter");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"content", "x"}}}))), 400, "");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"role", "user"}, {"content", 7}}}))), 400,
               "invalid_type");
  json no_messages = good_chat;
  no_messages.erase("messages");
  expect_error(post(port, chat, no_messages), 400, "missing_required_parameter", "messages");
  // The model.
  json no_model = good_comp;
  no_model.erase("model");
  expect_error(post(port, comp, no_model), 400, "missing_required_parameter", "model");
  expect_error(post(port, comp, with(good_comp, "model", "gpt-4o")), 404, "model_not_found", "model");
  expect_error(post(port, chat, with(good_chat, "model", 12)), 400, "invalid_type", "model");
  // The context (64 tokens): a long prompt, and max_tokens beyond what is left.
  std::string long_prompt;
  for (int i = 0; i < 80; ++i) long_prompt += "once upon a time ";
  expect_error(post(port, comp, with(good_comp, "prompt", long_prompt)), 400, "context_length_exceeded");
  expect_error(post(port, chat, with(good_chat, "messages", json::array({{{"role", "user"}, {"content", long_prompt}}}))),
               400, "context_length_exceeded");
  expect_error(post(port, comp, with(good_comp, "max_tokens", 64)), 400, "context_length_exceeded", "max_tokens");
  // A text that cannot fit whatever its tokens is refused without tokenizing
  // it (tokenizing costs time that grows faster than the text).
  {
    auto t0 = std::chrono::steady_clock::now();
    expect_error(post(port, comp, with(good_comp, "prompt", std::string(60000, 'x'))), 400, "context_length_exceeded",
                 "prompt");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  }
  expect_error(post(port, chat, with(good_chat, "max_completion_tokens", 1000)), 400, "context_length_exceeded",
               "max_completion_tokens");
  // Routes and methods.
  expect_error(http(port, "GET", comp), 405, "method_not_allowed");
  expect_error(http(port, "DELETE", "/v1/models"), 405, "method_not_allowed");
  expect_error(http(port, "GET", "/v1/embeddings"), 404, "unknown_url");
  expect_error(http(port, "GET", "/"), 404, "unknown_url");

  // Oversized bodies: refused from the Content-Length alone, and when sent.
  {
    int fd = connect_to(port);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: 100000000\r\n\r\n");
    expect_error(parse_response(read_all(fd)), 413, "too_large");
    close(fd);
  }
  expect_error(post(port, comp, with(good_comp, "prompt", std::string(70000, 'a'))), 413, "too_large");
  // A header block over the limit.
  expect_error(http(port, "GET", "/health", "", {"X-Big: " + std::string(20000, 'x')}), 431, "header_too_large");
  // Not HTTP at all.
  {
    int fd = connect_to(port);
    send_all(fd, "HELLO THERE\r\n\r\n");
    expect_error(parse_response(read_all(fd)), 400, "bad_http");
    close(fd);
  }
  // Slow loris: half a request, then silence past the 1 s deadline: 408 and
  // the connection is closed by the server.
  {
    int fd = connect_to(port, 10s);
    send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n");
    auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(300ms);
    send_all(fd, "X-Drip: 1\r\n");  // dripping bytes does not extend the deadline
    Response r = parse_response(read_all(fd));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    expect_error(r, 408, "timeout");
    EXPECT_LT(waited, 5.0);
    close(fd);
  }
  // A connection that sends nothing is closed after the deadline.
  {
    int fd = connect_to(port, 10s);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(read_all(fd), "");
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    close(fd);
  }

  // Still serving, and the refusals were counted.
  ASSERT_EQ(post(port, comp, good_comp).status, 200);
  EXPECT_GE(metric(port, "baton_errors_total{kind=\"bad_request\"}"), 25);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"model_not_found\"}"), 1);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"context_length\"}"), 5);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"too_large\"}"), 2);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"timeout\"}"), 1);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, ApiKeyIsRequiredComparedAndNeverLogged) {
  test::TempDir dir;
  const std::string key = "sk-baton-test-5f3c9a";
  const std::string file = dir.file("key.txt");
  test::write_file(file, std::vector<uint8_t>(key.begin(), key.end()));
  {
    std::string with_nl = key + "\n";
    test::write_file(file, std::vector<uint8_t>(with_nl.begin(), with_nl.end()));
  }
  ServeProcess server({"-m", stories(), "--api-key-file", file});
  const int port = server.port();
  const json req = {{"model", kModel}, {"prompt", "Once"}, {"max_tokens", 3}};
  Response none = post(port, "/v1/completions", req);
  expect_error(none, 401, "invalid_api_key");
  EXPECT_EQ(none.headers["www-authenticate"], "Bearer");
  expect_error(post(port, "/v1/completions", req, {"Authorization: Bearer sk-wrong"}), 401, "invalid_api_key");
  expect_error(post(port, "/v1/completions", req, {"Authorization: Bearer " + key + "x"}), 401, "invalid_api_key");
  expect_error(post(port, "/v1/completions", req, {"Authorization: " + key}), 401, "invalid_api_key");
  expect_error(http(port, "GET", "/v1/models"), 401, "invalid_api_key");
  EXPECT_EQ(post(port, "/v1/completions", req, {"Authorization: Bearer " + key}).status, 200);
  EXPECT_EQ(http(port, "GET", "/v1/models", "", {"authorization: bearer " + key}).status, 200);
  EXPECT_EQ(http(port, "GET", "/health").status, 200);  // probes need no key
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"unauthorized\"}"), 5);
  EXPECT_EQ(server.stop(), 0);
  EXPECT_EQ(server.stderr_text().find(key), std::string::npos) << server.stderr_text();

  // An empty key file is refused at start.
  test::write_file(dir.file("empty.txt"), {'\n'});
  auto r = test::run_command({test::baton_binary(), "serve", "-m", stories(), "--api-key-file", dir.file("empty.txt"),
                              "--port", "0"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;
}

// A streaming request that generates until cancelled (EOS banned, long
// max_tokens); returns the socket after the first content chunk arrived.
int start_long_stream(int port, int max_tokens) {
  json req = {{"model", kModel},
              {"prompt", "Once upon a time"},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"stream", true},
              {"logit_bias", {{"2", -100}}}};
  int fd = connect_to(port);
  send_all(fd, request_text("POST", "/v1/completions", req.dump()));
  std::string got;
  char buf[4096];
  while (got.find("\"text\":\"") == std::string::npos) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  EXPECT_NE(got.find("HTTP/1.1 200"), std::string::npos) << got;
  return fd;
}

TEST(Serve, FullQueueAnswers429AndDisconnectsFreeTheSlots) {
  ServeProcess server({"-m", stories(), "--parallel", "1", "--queue", "1", "--ctx", "2048"});
  const int port = server.port();
  // A holds the only slot; B waits in the only queue place; C is refused.
  int a = start_long_stream(port, 2000);
  int b = connect_to(port);
  send_all(b, request_text("POST", "/v1/completions",
                           json{{"model", kModel}, {"prompt", "Hello"}, {"max_tokens", 1000}, {"logit_bias", {{"2", -100}}}}
                               .dump()));
  // B is queued once /health says so.
  bool queued = false;
  for (int i = 0; i < 200 && !queued; ++i) {
    queued = health(port)["queue"]["depth"] == 1;
    if (!queued) std::this_thread::sleep_for(5ms);
  }
  ASSERT_TRUE(queued);
  Response c = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  expect_error(c, 429, "rate_limit_exceeded");
  EXPECT_EQ(c.headers["retry-after"], "1");
  EXPECT_EQ(c.j()["error"]["type"], "rate_limit_error");
  json h = health(port);
  EXPECT_EQ(h["slots"]["busy"], 1);
  EXPECT_EQ(h["queue"]["depth"], 1);

  // A streaming client goes away: its sequence is cancelled and B takes the slot.
  close(a);
  bool b_running = false;
  for (int i = 0; i < 400 && !b_running; ++i) {
    json hh = health(port);
    b_running = hh["queue"]["depth"] == 0 && hh["slots"]["busy"] == 1;
    if (!b_running) std::this_thread::sleep_for(10ms);
  }
  EXPECT_TRUE(b_running);
  // A non-streaming client goes away while its answer is being generated.
  close(b);
  EXPECT_TRUE(wait_idle(port, 10s));
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"cancelled\"}"), 2);
  EXPECT_EQ(metric(port, "baton_slots_busy"), 0);
  EXPECT_EQ(metric(port, "baton_errors_total{kind=\"queue_full\"}"), 1);
  EXPECT_EQ(metric(port, "baton_streams_open"), 0);
  // The freed slot serves the next request.
  EXPECT_EQ(post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}}).status, 200);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, CommandLineRefusals) {
  auto serve = [](std::vector<std::string> args) {
    args.insert(args.begin(), {test::baton_binary(), "serve"});
    return test::run_command(args);
  };
  auto workers = serve({"-m", stories(), "--workers", "0"});
  EXPECT_EQ(workers.exit_code, 1);
  EXPECT_NE(workers.err.find("--workers must be in 1..64"), std::string::npos) << workers.err;
  auto too_many = serve({"-m", stories(), "--workers", "6", "--port", "0"});
  EXPECT_EQ(too_many.exit_code, 1);
  EXPECT_NE(too_many.err.find("6 workers for 5 layers"), std::string::npos) << too_many.err;
  auto config = serve({"--config", "/nonexistent/cluster.toml"});
  EXPECT_EQ(config.exit_code, 1);
  EXPECT_NE(config.err.find("cannot read the config file /nonexistent/cluster.toml"), std::string::npos) << config.err;
  auto none = serve({});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("-m MODEL"), std::string::npos) << none.err;
  auto missing = serve({"-m", "/nonexistent/model.gguf", "--port", "0"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("model.gguf"), std::string::npos) << missing.err;
  auto help = serve({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* s : {"--model", "--config", "--workers", "--host", "--port", "--api-key-file", "--ctx",
                        "--parallel", "--queue", "--threads", "--max-body", "--request-timeout", "/v1/chat/completions",
                        "/health", "/metrics", "429", "listening on"}) {
    EXPECT_NE(help.out.find(s), std::string::npos) << s;
  }
}

// ---- the official openai npm client ----

fs::path serve_scripts() { return fs::path(__FILE__).parent_path() / "serve"; }

bool have_node() { return test::run_command({"/usr/bin/env", "node", "--version"}).exit_code == 0; }

// The acceptance run is the pipeline of two local workers; the in-process
// engine is checked the same way.
void check_official_client(const std::vector<std::string>& extra) {
  if (!have_node()) GTEST_SKIP() << "node is not installed";
  ASSERT_TRUE(fs::exists(serve_scripts() / "node_modules" / "openai" / "package.json"))
      << "run 'npm ci' in " << serve_scripts() << " (scripts/test.sh does)";
  std::vector<std::string> args = {"-m", stories(), "--quiet"};
  args.insert(args.end(), extra.begin(), extra.end());
  ServeProcess server(args);
  json run = run_json("Once upon a time", 30);
  auto r = test::run_command({"/usr/bin/env", "node", (serve_scripts() / "openai_client.mjs").string(),
                              "--base-url", "http://127.0.0.1:" + std::to_string(server.port()) + "/v1", "--model",
                              kModel, "--prompt", "Once upon a time", "--max-tokens", "30"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json out = json::parse(r.out);
  EXPECT_EQ(out["completion"]["text"], run["text"]);
  EXPECT_EQ(out["completion_stream"]["text"], run["text"]);
  EXPECT_EQ(out["completion"]["usage"]["completion_tokens"], run["n_gen"]);
  EXPECT_EQ(out["chat"]["text"], out["chat_stream"]["text"]);
  EXPECT_FALSE(out["chat"]["text"].get<std::string>().empty());
  EXPECT_EQ(out["chat_stream"]["usage"], out["chat"]["usage"]);
  EXPECT_EQ(out["models"], json::array({kModel}));
  EXPECT_EQ(out["bad_model_status"], 404);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, OfficialOpenAiNodeClient) { check_official_client({}); }
TEST(ServeCluster, OfficialOpenAiNodeClientOnTwoWorkers) { check_official_client({"--workers", "2"}); }

// ---- load ----

int env_int(const char* name, int def) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : def;
}

// Resident bytes of a process (VmRSS), 0 when it is gone.
uint64_t rss_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return uint64_t(std::stoull(line.substr(6))) * 1024;
  }
  return 0;
}

// The server's and its local workers' resident memory together.
uint64_t cluster_rss(const ServeProcess& server) {
  uint64_t total = rss_of(server.pid());
  const std::string err = server.stderr_text();
  std::map<std::string, pid_t> latest;  // worker name -> its last pid
  const std::regex started(R"(baton: started (worker-\d+) \(pid (\d+)\))");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), started); it != std::sregex_iterator(); ++it) {
    latest[(*it)[1].str()] = pid_t(std::stol((*it)[2].str()));
  }
  for (const auto& [name, pid] : latest) total += rss_of(pid);
  return total;
}

// BATON_SERVE_LOAD_CLIENTS / BATON_SERVE_LOAD_SECONDS scale it up
// (tests/serve/load_test.sh --full: 64 clients for 2 minutes).
void run_load_test(const std::vector<std::string>& extra, int clients, int seconds) {
  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", " + std::to_string(clients) + " clients, " +
               std::to_string(seconds) + " s");
  std::vector<std::string> args = {"-m", stories(), "--quiet", "--parallel", "4", "--queue", std::to_string(clients),
                                   "--http-threads", "2", "--ctx", "512"};
  args.insert(args.end(), extra.begin(), extra.end());
  ServeProcess server(args);
  const int port = server.port();
  const std::vector<std::string> prompts = {"Once upon a time", "Tom and his dog", "The little bird", "One day",
                                            "Lily wanted to"};
  std::atomic<int64_t> requests{0}, failures{0}, tokens{0}, prompt_tokens{0}, chunks{0};
  std::mutex fail_mu;
  std::string first_failure;
  auto fail = [&](const std::string& why) {
    failures.fetch_add(1);
    std::lock_guard lock(fail_mu);
    if (first_failure.empty()) first_failure = why;
  };
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(seconds);
  // Memory after a tenth of the run (allocators and caches warmed up) and at
  // the end: the soak's "stable memory".
  std::atomic<uint64_t> rss_early{0};
  std::thread sampler([&] {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(seconds * 100));
    rss_early = cluster_rss(server);
  });
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937_64 rng(seed + uint64_t(c));
      while (std::chrono::steady_clock::now() < deadline) {
        const bool chat = rng() % 2;
        json req = {{"model", kModel},
                    {"max_tokens", 4 + rng() % 40},
                    {"temperature", (rng() % 3) * 0.5},
                    {"seed", rng() % 1000},
                    {"stream", true},
                    {"stream_options", {{"include_usage", true}}}};
        const std::string prompt = prompts[rng() % prompts.size()];
        if (chat) {
          req["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
        } else {
          req["prompt"] = prompt;
        }
        Response r = post(port, chat ? "/v1/chat/completions" : "/v1/completions", req);
        requests.fetch_add(1);
        if (r.status != 200 || !r.complete) {
          fail("status " + std::to_string(r.status) + ": " + r.body);
          continue;
        }
        auto events = sse_events(r.body);
        if (events.empty() || events.back() != "[DONE]") {
          fail("no [DONE]: " + r.body);
          continue;
        }
        try {
          bool finished = false;
          json usage;
          for (size_t i = 0; i + 1 < events.size(); ++i) {
            json ch = json::parse(events[i]);
            chunks.fetch_add(1);
            if (ch["choices"].empty()) {
              usage = ch["usage"];
            } else if (!ch["choices"][0]["finish_reason"].is_null()) {
              finished = true;
            }
          }
          if (!finished || usage.is_null()) {
            fail("no finish_reason or usage: " + r.body);
            continue;
          }
          tokens.fetch_add(usage["completion_tokens"].get<int64_t>());
          prompt_tokens.fetch_add(usage["prompt_tokens"].get<int64_t>());
        } catch (const std::exception& e) {
          fail(std::string("bad chunk: ") + e.what());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  sampler.join();
  const uint64_t rss_end = cluster_rss(server);
  const double growth = rss_early ? double(rss_end) / double(rss_early.load()) - 1.0 : 0.0;
  EXPECT_EQ(failures.load(), 0) << first_failure;
  // Over a long run the resident memory must stay flat (under 1% growth);
  // short runs are still warming up, so only report.
  if (seconds >= 300) {
    EXPECT_LT(growth, 0.01) << rss_early.load() << " -> " << rss_end;
  }
  EXPECT_GT(requests.load(), clients);
  ASSERT_TRUE(wait_idle(port, 10s));
  // What the clients received is what the server counted.
  EXPECT_EQ(metric(port, "baton_completion_tokens_total"), double(tokens.load()));
  EXPECT_EQ(metric(port, "baton_prompt_tokens_total"), double(prompt_tokens.load()));
  const double ok = metric(port, "baton_http_responses_total{endpoint=\"chat\",code=\"200\"}") +
                    metric(port, "baton_http_responses_total{endpoint=\"completions\",code=\"200\"}");
  EXPECT_EQ(ok, double(requests.load()));
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"stop\"}") +
                metric(port, "baton_generations_total{finish=\"length\"}"),
            double(requests.load()));
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"error\"}"), 0);
  EXPECT_EQ(metric(port, "baton_streams_open"), 0);
  std::printf("[load] %d clients, %d s: %lld streams, %lld tokens, %lld chunks, %lld failed; RSS %.1f -> %.1f MiB "
              "(%+.2f%%)\n",
              clients, seconds, (long long)requests.load(), (long long)tokens.load(), (long long)chunks.load(),
              (long long)failures.load(), double(rss_early.load()) / (1 << 20), double(rss_end) / (1 << 20),
              growth * 100);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(Serve, LoadStreamsAllFinishAndMetricsMatch) {
  run_load_test({}, env_int("BATON_SERVE_LOAD_CLIENTS", 16), env_int("BATON_SERVE_LOAD_SECONDS", 10));
}

// The same load through a pipeline of two worker processes
// (BATON_SERVE_LOAD_WORKERS changes the count; the soak uses it).
TEST(ServeCluster, LoadStreamsAllFinishAndMetricsMatch) {
  run_load_test({"--workers", std::to_string(env_int("BATON_SERVE_LOAD_WORKERS", 2))},
                env_int("BATON_SERVE_LOAD_CLIENTS", 16), env_int("BATON_SERVE_LOAD_SECONDS", 10));
}

// ---- the cluster: failure and healing ----

// The pid of local worker i: the last "baton: started worker-i (pid P)" line.
pid_t worker_pid(const ServeProcess& server, int i) {
  const std::string text = server.stderr_text();
  const std::string key = "baton: started worker-" + std::to_string(i) + " (pid ";
  const size_t at = text.rfind(key);
  if (at == std::string::npos) return -1;
  return pid_t(std::stol(text.substr(at + key.size())));
}

bool wait_status(int port, const std::string& want, std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (health(port)["status"] == want) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

TEST(ServeCluster, KilledWorkerFailsTheStreamWithinTwoSecondsThenTheRouteHeals) {
  // Slow workers keep the stream going long enough to kill one inside it.
  ServeProcess server({"-m", stories(), "--workers", "3", "--worker-delay-ms", "20", "--ctx", "1024"});
  const int port = server.port();
  const json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 24}, {"temperature", 0}};
  Response before = post(port, "/v1/completions", req);
  ASSERT_EQ(before.status, 200) << before.body;
  const std::string want = before.j()["choices"][0]["text"];
  json h = health(port);
  ASSERT_EQ(h["stages"].size(), 3u) << h.dump();
  for (const json& st : h["stages"]) EXPECT_EQ(st["state"], "loaded") << h.dump();

  const pid_t victim = worker_pid(server, 1);
  ASSERT_GT(victim, 0) << server.stderr_text();
  int fd = start_long_stream(port, 900);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string rest = read_all(fd);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_LT(seconds, 2.0) << rest;
  EXPECT_NE(rest.find("generation failed"), std::string::npos) << rest;
  EXPECT_NE(rest.find("worker-1"), std::string::npos) << rest;
  EXPECT_NE(rest.find("stage 1"), std::string::npos) << rest;

  // The coordinator stays up; the worker is started again, loads, and the
  // route heals without restarting anything else.
  // The coordinator stays up and says the route is incomplete until the
  // worker is back (503 for probes), naming what is missing.
  Response broken = http(port, "GET", "/health");
  ASSERT_TRUE(broken.status == 503 || broken.status == 200) << broken.status;
  if (broken.status == 503) {
    EXPECT_EQ(broken.j()["status"], "error") << broken.body;
    EXPECT_NE(broken.body.find("worker-1"), std::string::npos) << broken.body;
  }
  ASSERT_TRUE(wait_status(port, "ok", 60s)) << health(port).dump() << server.stderr_text();
  EXPECT_NE(worker_pid(server, 1), victim);
  EXPECT_NE(server.stderr_text().find("starting it again"), std::string::npos);
  Response after = post(port, "/v1/completions", req);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.j()["choices"][0]["text"], want);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

TEST(ServeCluster, StalledWorkerFailsRequestsAndIsReplaced) {
  ServeProcess server({"-m", stories(), "--workers", "2", "--worker-delay-ms", "20", "--ctx", "1024"});
  const int port = server.port();
  const pid_t victim = worker_pid(server, 0);
  ASSERT_GT(victim, 0);
  int fd = start_long_stream(port, 900);
  ASSERT_EQ(kill(victim, SIGSTOP), 0);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string rest = read_all(fd);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  // A stall is noticed by the heartbeat timeout (1.5 s).
  EXPECT_LT(seconds, 2.5) << rest;
  EXPECT_NE(rest.find("worker-0"), std::string::npos) << rest;
  // While the route is broken, requests get 503 rather than hanging.
  Response during = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_TRUE(during.status == 503 || during.status == 200) << during.status << during.body;
  // The stalled process wakes to a closed link and exits; it is replaced.
  kill(victim, SIGCONT);
  ASSERT_TRUE(wait_status(port, "ok", 60s)) << health(port).dump() << server.stderr_text();
  Response after = post(port, "/v1/completions", {{"model", kModel}, {"prompt", "Hi"}, {"max_tokens", 2}});
  EXPECT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

// Wrong secret, wrong version, a truncated frame, an oversized length and
// random bytes on the coordinator's port and on a worker's port: each closes
// only that connection; the cluster serves on, with the same tokens.
TEST(ServeCluster, HostileBytesOnCoordinatorAndWorkerPortsChangeNothing) {
  ServeProcess server({"-m", stories(), "--workers", "2"});
  const int port = server.port();
  const json req = {{"model", kModel}, {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
  Response before = post(port, "/v1/completions", req);
  ASSERT_EQ(before.status, 200) << before.body;
  std::smatch m;
  const std::string err = server.stderr_text();
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(worker-0: registered with the coordinator at 127\.0\.0\.1:(\d+), listening on 127\.0\.0\.1:(\d+))")))
      << err;
  const int ports[2] = {std::stoi(m[1].str()), std::stoi(m[2].str())};

  const uint64_t seed = test::test_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto hello = [] {
    net::Hello h;
    h.role = net::Role::worker;
    h.node_name = "intruder";
    h.nonce = net::random_nonce();
    return h;
  };
  // Sends the bytes and expects the peer to close within 10 s.
  auto closed_after = [](int p, const std::vector<uint8_t>& bytes, bool half_close) {
    int fd = connect_to(p, 10s);
    send_all(fd, std::string(bytes.begin(), bytes.end()));
    if (half_close) shutdown(fd, SHUT_WR);
    char buf[4096];
    ssize_t n = 0;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
    }
    ::close(fd);
    return n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE));
  };
  for (int p : ports) {
    SCOPED_TRACE("port " + std::to_string(p));
    std::vector<uint8_t> noise(4096);
    for (auto& b : noise) b = uint8_t(rng());
    EXPECT_TRUE(closed_after(p, noise, false));
    std::vector<uint8_t> huge = {0xf0, 0xff, 0xff, 0xff, 0x01, 0x00};  // 4 GiB HELLO
    EXPECT_TRUE(closed_after(p, huge, false));
    std::vector<uint8_t> truncated = net::Codec::encode(hello());
    truncated.resize(truncated.size() - 5);
    EXPECT_TRUE(closed_after(p, truncated, true));
    net::Hello old = hello();
    old.protocol_version = net::kProtocolVersion + 1;
    EXPECT_TRUE(closed_after(p, net::Codec::encode(old), false));
    // A full HELLO, then a proof made without the secret.
    int fd = connect_to(p, 10s);
    const std::vector<uint8_t> h = net::Codec::encode(hello());
    send_all(fd, std::string(h.begin(), h.end()));
    net::FrameDecoder dec(net::kHandshakeMaxPayload);
    net::Message msg;
    std::error_code ec;
    char buf[4096];
    bool got = false;
    while (!got) {
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      dec.feed(std::span<const uint8_t>(reinterpret_cast<uint8_t*>(buf), size_t(n)));
      got = dec.next(msg, ec);
    }
    ASSERT_TRUE(got && std::holds_alternative<net::Challenge>(msg));
    const std::vector<uint8_t> bad = net::Codec::encode(net::AuthResponse{});
    send_all(fd, std::string(bad.begin(), bad.end()));
    ssize_t n = 0;
    while ((n = recv(fd, buf, sizeof buf, 0)) > 0) {
    }
    EXPECT_LE(n, 0);
    ::close(fd);
  }
  Response after = post(port, "/v1/completions", req);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.j()["choices"][0]["text"], before.j()["choices"][0]["text"]);
  EXPECT_EQ(health(port)["status"], "ok");
  const std::string log = server.stderr_text();
  EXPECT_NE(log.find("intruder"), std::string::npos) << "the refusals are logged";
  EXPECT_EQ(server.stop(), 0) << log;
}

// The quick form of the chaos run (tests/reliability/chaos.py; the long form
// is one command in docs/RELIABILITY.md): workers killed, stalled and cut in
// a prefill while clients send requests; every request completes or fails
// clearly, and after recovery every request succeeds.
TEST(ServeCluster, ChaosQuick) {
  if (test::run_command({"/usr/bin/env", "python3", "--version"}).exit_code != 0) GTEST_SKIP() << "no python3";
  const std::string script = (fs::path(__FILE__).parent_path() / "reliability" / "chaos.py").string();
  auto r = test::run_command({"/usr/bin/env", "python3", script, "--baton", test::baton_binary(), "--model", stories(),
                              "--seconds", "15", "--clients", "3", "--recovery-requests", "5", "--seed",
                              std::to_string(test::test_seed())});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("chaos: PASS"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace baton
