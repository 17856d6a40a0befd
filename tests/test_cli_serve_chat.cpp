// `baton chat --url` against a `baton serve` of the stories260K fixture (chatml
// by name: the fixture has no template), through a pseudo-terminal: answers
// stream over SSE, /reset forgets the conversation, /exit quits, the API key
// comes from --api-key or $BATON_API_KEY. Ctrl-C is tried against a stand-in
// server that streams one token every 50 ms and notes when the client hangs up.
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include <string>
#include <vector>

#include "tests/pty_process.h"
#include "tests/serve_client.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using namespace serve_test;

std::string url(const ServeProcess& s) { return "http://127.0.0.1:" + std::to_string(s.port()); }

TEST(ServeChat, TurnsResetAndExitWithTheKeyFromTheEnvironment) {
  ServeProcess s({stories(), "--chat-template", "chatml", "--api-key", "sesame"});
  setenv("BATON_API_KEY", "sesame", 1);
  test::PtyProcess c({test::baton_binary(), "chat", "--url", url(s), "--temp", "0", "-n", "16"});
  unsetenv("BATON_API_KEY");
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.expect("> ", 0)) << c.out() << s.stderr_text();
  const std::string line = "Tell me a story";
  const std::string first = test::pty_turn(c, line);
  EXPECT_FALSE(first.empty()) << c.out();
  const std::string second = test::pty_turn(c, line);  // with the first exchange before it
  EXPECT_FALSE(second.empty()) << c.out();
  const size_t before = c.out().size();
  c.send("/reset\n");
  ASSERT_TRUE(c.expect("[conversation reset]\n> ", before)) << c.out();
  EXPECT_EQ(test::pty_turn(c, line), first);
  c.send("/exit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

TEST(ServeChat, AWrongKeyIsRefusedAtStart) {
  ServeProcess s({stories(), "--chat-template", "chatml", "--api-key", "sesame"});
  const auto r = test::run_command({test::baton_binary(), "chat", "--url", url(s), "--api-key", "wrong"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("401"), std::string::npos) << r.err;
  const auto n = test::run_command({test::baton_binary(), "chat", "--url", "http://127.0.0.1:1"});
  EXPECT_EQ(n.exit_code, 1) << n.out << n.err;
  EXPECT_NE(n.err.find("cannot reach http://127.0.0.1:1"), std::string::npos) << n.err;
  const auto t = test::run_command({test::baton_binary(), "chat", "--url", "https://example.com"});
  EXPECT_NE(t.err.find("https is not supported"), std::string::npos) << t.err;
}

TEST(ServeChat, CtrlCClosesTheRequest) {
  const int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(ls, 4), 0);
  socklen_t len = sizeof a;
  getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len);
  std::atomic<bool> hung_up{false};
  std::thread server([&] {
    for (int i = 0; i < 2; ++i) {
      const int c = accept(ls, nullptr, nullptr);
      if (c < 0) return;
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = recv(c, buf, sizeof buf, 0);
        if (n <= 0) break;
        req.append(buf, size_t(n));
      }
      if (i == 0) {
        const std::string body = R"({"object":"list","data":[{"id":"slow","object":"model"}]})";
        const std::string r = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
        send(c, r.data(), r.size(), MSG_NOSIGNAL);
      } else {
        std::string r = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";
        send(c, r.data(), r.size(), MSG_NOSIGNAL);
        for (int k = 0; k < 2000; ++k) {  // 100 s at most
          const std::string ev = R"(data: {"choices":[{"index":0,"delta":{"content":"la "}}]})" "\n\n";
          if (send(c, ev.data(), ev.size(), MSG_NOSIGNAL) < 0) {
            hung_up = true;
            break;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
      }
      close(c);
    }
  });
  test::PtyProcess c({test::baton_binary(), "chat", "--url", "http://127.0.0.1:" + std::to_string(ntohs(a.sin_port))});
  ASSERT_TRUE(c.started());
  EXPECT_TRUE(c.expect("> ", 0)) << c.out();
  c.send("Tell me a story\n");
  const auto first = c.expect("la la ", 0);
  EXPECT_TRUE(first) << c.out();
  c.send("\x03");
  EXPECT_TRUE(c.expect("[interrupted]\n> ", first.value_or(0))) << c.out();
  for (int i = 0; i < 100 && !hung_up; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(hung_up);
  c.send("/exit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
  server.join();
  close(ls);
}


}  // namespace
}  // namespace baton
