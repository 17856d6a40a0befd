// `baton chat --url` against a `baton serve` of the stories260K fixture (chatml
// by name: the fixture has no template), through a pseudo-terminal: answers
// stream over SSE, /reset forgets the conversation, /exit quits, the API key
// comes from --api-key or $BATON_API_KEY, and Ctrl-C closes the request so
// that the server stops generating.
#include <stdlib.h>

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

// 50 ms a step and at least 1000 tokens: Ctrl-C stops the answer, and the
// server, its request closed, goes idle.
TEST(ServeChat, CtrlCClosesTheRequest) {
  ServeProcess s({stories(), "--chat-template", "chatml", "--step-delay-ms", "50"});
  test::PtyProcess c({test::baton_binary(), "chat", "--url", url(s), "--min-tokens", "1000"});
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.expect("> ", 0)) << c.out() << s.stderr_text();
  const std::string line = "Tell me a story";
  c.send(line + "\n");
  const auto echo = c.expect(line + "\n", 0);
  ASSERT_TRUE(echo) << c.out();
  ASSERT_TRUE(c.grow_past(*echo + line.size() + 3, std::chrono::seconds(60))) << c.out();
  const auto sent = test::Clock::now();
  c.send("\x03");
  ASSERT_TRUE(c.expect("[interrupted]\n> ", *echo)) << c.out();
  EXPECT_LT(test::Clock::now() - sent, std::chrono::seconds(10));
  EXPECT_TRUE(wait_idle(s.port(), std::chrono::seconds(20))) << s.stderr_text();
  c.send("/exit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

}  // namespace
}  // namespace baton
