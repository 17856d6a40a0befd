// What the `baton serve` suites share: the server as a child process on an
// ephemeral loopback port, a raw HTTP client over sockets, the official
// client and load runs, and the local workers' pids and memory.
// test_cli_serve.cpp (the server) and test_cli_serve_cluster.cpp (the server
// over worker processes) use it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace baton::serve_test {

using json = nlohmann::json;

inline const std::string kModel = "stories260K";
std::string stories();  // the stories260K fixture

// `baton serve` on an ephemeral loopback port; stderr goes to a file.
class ServeProcess {
 public:
  explicit ServeProcess(std::vector<std::string> extra, bool wait_ready = true);
  ~ServeProcess() { stop(); }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  std::string stderr_text() const;
  // SIGTERM and wait; the exit status (-1 when killed by a signal or stuck).
  int stop();

 private:
  bool read_line(std::string& line, std::chrono::seconds timeout);

  test::TempDir dir_;
  std::string err_path_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int port_ = 0;
  int exit_code_ = -1;
  std::string out_buf_;
};

// ---- a raw HTTP client ----

int connect_to(int port, std::chrono::seconds recv_timeout = std::chrono::seconds(60));
// The same from another loopback source address (127.x.y.z), so that one test
// can play several clients; -1 when the connection fails.
int connect_from(const std::string& source_ip, int port, std::chrono::seconds recv_timeout = std::chrono::seconds(20));
bool send_all(int fd, const std::string& data);
std::string read_all(int fd);

struct Response {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  bool chunked = false;
  bool complete = false;  // the body ended as the headers said
  json j() const { return json::parse(body); }
};

Response parse_response(const std::string& raw);
// The length of the first whole response in `raw` (Content-Length or chunked
// body), or std::string::npos while it is incomplete.
size_t response_length(const std::string& raw);
// The next response on a kept-alive connection; `buf` carries what was read
// beyond it. complete is false when the connection ended first (status 0 when
// nothing came).
Response read_response(int fd, std::string& buf);
std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                         const std::vector<std::string>& headers = {});
Response http(int port, const std::string& method, const std::string& path, const std::string& body = "",
              const std::vector<std::string>& headers = {});
Response post(int port, const std::string& path, const json& body, const std::vector<std::string>& headers = {});
// The "data: ..." payloads of an SSE body, in order.
std::vector<std::string> sse_events(const std::string& body);
// Every error is {"error": {"message", "type", "param", "code"}}.
void expect_error(const Response& r, int status, const std::string& code, const std::string& param = "");
// A metric's value from /metrics text ("name{labels}" exactly as printed).
double metric(int port, const std::string& series);
json health(int port);
// Waits until the engine holds no sequence and no queued request.
bool wait_idle(int port, std::chrono::seconds timeout);
// Waits until /health's status is `want`.
bool wait_status(int port, const std::string& want, std::chrono::seconds timeout);
// `baton run --json` of the stories model, greedy.
json run_json(const std::string& prompt, int n);
// A streaming request that generates until cancelled; the socket after the
// first content chunk arrived.
int start_long_stream(int port, int max_tokens);

// ---- whole runs ----

// ignore_eos against a server of the stories model: a request whose EOS comes
// early (logit_bias on it) stops there without the field and runs to exactly
// max_tokens with it, plain, streamed and as a chat; bad types get 400.
void check_ignore_eos(int port);

// tests/serve/ (the Node scripts and their node_modules), and whether node runs.
std::filesystem::path serve_scripts();
bool have_node();

// The official openai npm client (tests/serve/) against a server started with `extra`.
void check_official_client(const std::vector<std::string>& extra);
int env_int(const char* name, int def);
// Clients streaming for `seconds`; their counts must match /metrics.
void run_load_test(const std::vector<std::string>& extra, int clients, int seconds);
// The pid of local worker i: the last "baton: started worker-i (pid P)" line.
pid_t worker_pid(const ServeProcess& server, int i);

}  // namespace baton::serve_test
