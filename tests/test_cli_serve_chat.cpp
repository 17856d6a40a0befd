// `baton chat --url` against a `baton serve` of the stories260K fixture (chatml
// by name: the fixture has no template), through a pseudo-terminal: answers
// stream over SSE, /reset forgets the conversation, /exit quits, the API key
// comes from --api-key or $BATON_API_KEY. (Ctrl-C during a remote answer
// has no test yet: serve has no per-step delay to make an answer long.)
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

}  // namespace
}  // namespace baton
