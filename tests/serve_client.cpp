#include "tests/serve_client.h"
#include "tests/json_schema_check.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/test_util.h"

namespace baton::serve_test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string stories() { return test::model_path("stories260K.gguf"); }

ServeProcess::ServeProcess(std::vector<std::string> extra, bool wait_ready) {
  err_path_ = dir_.file("stderr.txt");
  std::vector<std::string> argv = {test::baton_binary(), "serve", "--host", "127.0.0.1", "--port", "0",
                                   "--threads", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  const test::Spawned child = test::spawn_piped(argv, err_path_);
  pid_ = child.pid;
  out_fd_ = child.stdout_fd;
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

std::string ServeProcess::stderr_text() const {
  try {
    auto b = test::read_file(err_path_);
    return std::string(b.begin(), b.end());
  } catch (...) {
    return "";
  }
}

int ServeProcess::stop() {
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

bool ServeProcess::read_line(std::string& line, std::chrono::seconds timeout) {
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

int connect_to(int port, std::chrono::seconds recv_timeout) {
  const int fd = connect_from("127.0.0.1", port, recv_timeout);
  if (fd < 0) throw std::runtime_error("connect failed");
  return fd;
}

int connect_from(const std::string& source_ip, int port, std::chrono::seconds recv_timeout) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in src{};
  src.sin_family = AF_INET;
  if (source_ip != "127.0.0.1") {
    if (inet_pton(AF_INET, source_ip.c_str(), &src.sin_addr) != 1 ||
        bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
      close(fd);
      throw std::runtime_error("cannot bind to " + source_ip);
    }
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
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

size_t response_length(const std::string& raw) {
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return std::string::npos;
  const Response head = parse_response(raw.substr(0, head_end + 4));
  auto it = head.headers.find("transfer-encoding");
  if (it != head.headers.end() && it->second == "chunked") {
    for (size_t at = head_end + 4;;) {
      const size_t nl = raw.find("\r\n", at);
      if (nl == std::string::npos) return std::string::npos;
      const size_t n = std::stoul(raw.substr(at, nl - at), nullptr, 16);
      if (nl + 2 + n + 2 > raw.size()) return std::string::npos;
      at = nl + 2 + n + 2;
      if (n == 0) return at;
    }
  }
  it = head.headers.find("content-length");
  const size_t len = it == head.headers.end() ? 0 : std::stoul(it->second);
  return raw.size() >= head_end + 4 + len ? head_end + 4 + len : std::string::npos;
}

Response read_response(int fd, std::string& buf) {
  char chunk[16384];
  for (;;) {
    const size_t len = response_length(buf);
    if (len != std::string::npos) {
      Response r = parse_response(buf.substr(0, len));
      buf.erase(0, len);
      return r;
    }
    const ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return parse_response(buf);
    buf.append(chunk, size_t(n));
  }
}

std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                         const std::vector<std::string>& headers) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST") {
    req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return req + "\r\n" + body;
}

Response http(int port, const std::string& method, const std::string& path, const std::string& body,
              const std::vector<std::string>& headers) {
  int fd = connect_to(port);
  send_all(fd, request_text(method, path, body, headers));
  std::string raw = read_all(fd);
  close(fd);
  return parse_response(raw);
}

Response post(int port, const std::string& path, const json& body, const std::vector<std::string>& headers) {
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
void expect_error(const Response& r, int status, const std::string& code, const std::string& param) {
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

fs::path serve_scripts() { return test::source_path("tests/serve"); }

bool have_node() { return test::run_command({"/usr/bin/env", "node", "--version"}).exit_code == 0; }

// The acceptance run is the pipeline of two local workers; the in-process
// engine is checked the same way.
void check_ignore_eos(int port) {
  // stories260K ends its stories with BOS, almost never with EOS (2): a bias
  // of +20 makes the greedy EOS come at the 20th token of this prompt.
  const int max_tokens = 40;
  json req = {{"model", kModel},      {"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
              {"temperature", 0},     {"logit_bias", {{"2", 20}}},     {"logprobs", 0}};
  Response early = post(port, "/v1/completions", req);
  ASSERT_EQ(early.status, 200) << early.body;
  const json e = early.j();
  EXPECT_EQ(e["choices"][0]["finish_reason"], "stop");
  const int n_early = e["usage"]["completion_tokens"];
  EXPECT_GT(n_early, 2);
  EXPECT_LT(n_early, max_tokens);

  req["ignore_eos"] = true;
  Response full = post(port, "/v1/completions", req);
  ASSERT_EQ(full.status, 200) << full.body;
  const json f = full.j();
  EXPECT_EQ(f["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(f["usage"]["completion_tokens"], max_tokens);
  const json& tokens = f["choices"][0]["logprobs"]["tokens"];
  ASSERT_EQ(tokens.size(), size_t(max_tokens));
  // The same tokens up to the EOS, which is now generated (its text is empty).
  EXPECT_EQ(tokens[n_early], "");
  const std::string early_text = e["choices"][0]["text"];
  EXPECT_EQ(f["choices"][0]["text"].get<std::string>().rfind(early_text, 0), 0u) << f.dump();

  // Streamed: the usage says the same.
  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  Response s = post(port, "/v1/completions", req);
  ASSERT_EQ(s.status, 200) << s.body;
  auto events = sse_events(s.body);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(json::parse(events[events.size() - 2])["usage"]["completion_tokens"], max_tokens);

  // A chat: the family's end-of-turn tokens no longer end it either.
  json chat = {{"model", kModel},
               {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
               {"max_tokens", max_tokens},
               {"temperature", 0},
               {"logit_bias", {{"2", 100}}},
               {"ignore_eos", true}};
  Response c = post(port, "/v1/chat/completions", chat);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.j()["usage"]["completion_tokens"], max_tokens);
  EXPECT_EQ(c.j()["choices"][0]["finish_reason"], "length");

  for (const json& bad : {json("yes"), json(1), json::array({true})}) {
    json r = {{"model", kModel}, {"prompt", "Hi"}, {"ignore_eos", bad}};
    expect_error(post(port, "/v1/completions", r), 400, "invalid_type", "ignore_eos");
    json rc = chat;
    rc["ignore_eos"] = bad;
    expect_error(post(port, "/v1/chat/completions", rc), 400, "invalid_type", "ignore_eos");
  }
}

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
  for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) {
    EXPECT_EQ(out["chat_stream"]["usage"][k], out["chat"]["usage"][k]) << k;
  }
  // Each prompt is sent twice in a row: the second time the prefix cache
  // holds all of it but the last token, which is computed for its logits.
  EXPECT_EQ(out["completion"]["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(out["completion_stream"]["usage"]["prompt_tokens_details"]["cached_tokens"],
            out["completion"]["usage"]["prompt_tokens"].get<int>() - 1);
  EXPECT_EQ(out["chat_stream"]["usage"]["prompt_tokens_details"]["cached_tokens"],
            out["chat"]["usage"]["prompt_tokens"].get<int>() - 1);
  EXPECT_EQ(out["models"], json::array({kModel}));
  EXPECT_EQ(out["bad_model_status"], 404);
  // Structured output through the official client: JSON that follows the schema.
  const std::string content = out["structured"]["content"].get<std::string>();
  EXPECT_EQ(out["structured"]["finish_reason"], "stop") << content;
  const auto doc = nlohmann::ordered_json::parse(content, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << content;
  const auto schema = nlohmann::ordered_json::parse(out["structured"]["schema"].dump());
  EXPECT_EQ(test::schema_violation(doc, schema, schema), "") << content;
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

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

// A stream whose client leaves after its first event (resetting the
// connection when `reset`); false when no stream began.
bool leave_a_stream(int port, json req, const std::string& path, bool reset) {
  const int fd = connect_to(port);
  send_all(fd, request_text("POST", path, req.dump()));
  std::string got;
  char buf[4096];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, size_t(n));
  }
  if (reset) {
    linger l{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  close(fd);
  return got.rfind("HTTP/1.1 200", 0) == 0;
}

// BATON_SERVE_LOAD_CLIENTS / BATON_SERVE_LOAD_SECONDS scale it up
// (tests/serve/load_test.sh --full: 64 clients for 2 minutes). One request
// in 16 is a client that leaves its stream after the first event: its
// generation is cancelled (or ends on its own), it is counted once, and no
// slot stays busy.
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
  std::atomic<int64_t> requests{0}, failures{0}, tokens{0}, prompt_tokens{0}, chunks{0}, leavers{0};
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
        if (rng() % 16 == 0) {
          req["max_tokens"] = 200 + rng() % 200;
          if (!leave_a_stream(port, req, chat ? "/v1/chat/completions" : "/v1/completions", rng() % 2)) {
            fail("a leaving client got no stream");
          }
          leavers.fetch_add(1);
          continue;
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
  // What the clients received is what the server counted; the tokens of
  // the leavers' generations only the server knows.
  const double server_tokens = metric(port, "baton_completion_tokens_total");
  const double server_prompt_tokens = metric(port, "baton_prompt_tokens_total");
  if (leavers.load() == 0) {
    EXPECT_EQ(server_tokens, double(tokens.load()));
    EXPECT_EQ(server_prompt_tokens, double(prompt_tokens.load()));
  } else {
    EXPECT_GE(server_tokens, double(tokens.load()));
    EXPECT_GT(server_prompt_tokens, double(prompt_tokens.load()));
  }
  // Every request counted once, the leavers' too (their stream had begun: 200).
  const double ok = metric(port, "baton_http_responses_total{endpoint=\"chat\",code=\"200\"}") +
                    metric(port, "baton_http_responses_total{endpoint=\"completions\",code=\"200\"}");
  EXPECT_EQ(ok, double(requests.load() + leavers.load()));
  const double cancelled = std::max(0.0, metric(port, "baton_generations_total{finish=\"cancelled\"}"));
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"stop\"}") +
                metric(port, "baton_generations_total{finish=\"length\"}") + cancelled,
            double(requests.load() + leavers.load()));
  EXPECT_LE(cancelled, double(leavers.load()));
  EXPECT_EQ(metric(port, "baton_generations_total{finish=\"error\"}"), 0);
  EXPECT_EQ(metric(port, "baton_streams_open"), 0);
  std::printf("[load] %d clients, %d s: %lld streams, %lld tokens, %lld chunks, %lld failed, %lld left early "
              "(%.0f cancelled); RSS %.1f -> %.1f MiB (%+.2f%%)\n",
              clients, seconds, (long long)requests.load(), (long long)tokens.load(), (long long)chunks.load(),
              (long long)failures.load(), (long long)leavers.load(), cancelled, double(rss_early.load()) / (1 << 20),
              double(rss_end) / (1 << 20), growth * 100);
  EXPECT_EQ(server.stop(), 0) << server.stderr_text();
}

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

}  // namespace baton::serve_test
