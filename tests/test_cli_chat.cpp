// `baton chat` through a pseudo-terminal, as a user types at it: a turn
// streams its answer (the first bytes long before the last), the
// conversation grows until the context is full and /reset forgets it (the
// first question gets the same greedy answer again),
// /exit and Ctrl-D quit, Ctrl-C stops an answer and drops a half-typed line.
// The stories260K fixture has no chat template: chatml is chosen by name.
#include <gtest/gtest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "tests/pty_process.h"
#include "tests/test_util.h"

namespace baton {
namespace {

using Clock = std::chrono::steady_clock;
using test::PtyProcess;

std::string stories() { return test::model_path("stories260K.gguf"); }

// `baton chat` of the stories260K fixture, greedy, one thread, with `extra`.
class PtyChat : public PtyProcess {
 public:
  explicit PtyChat(const std::vector<std::string>& extra)
      : PtyProcess(with(extra)) {}

 private:
  static std::vector<std::string> with(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {test::baton_binary(), "chat", stories(), "--chat-template", "chatml",
                                     "--temp", "0", "--threads", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }
};

std::string turn(PtyChat& c, const std::string& line) { return test::pty_turn(c, line); }

// The conversation grows with every turn until it no longer fits the
// context (the API's refusal is printed and the chat goes on); /reset
// empties it, and the first question gets its first answer again.
TEST(Chat, TurnsResetAndExit) {
  PtyChat c({"-n", "16", "--ctx", "160"});
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.expect("> ", 0)) << c.out();
  EXPECT_NE(c.out().find("/reset starts over"), std::string::npos) << c.out();
  const std::string line = "Tell me a story";
  const std::string first = turn(c, line);
  EXPECT_FALSE(first.empty());
  int turns = 1;
  bool full = false;
  for (; turns < 12 && !full; ++turns) {
    const size_t from = c.out().size();
    turn(c, line);
    full = c.out().find("maximum context length", from) != std::string::npos;
  }
  EXPECT_TRUE(full) << c.out();
  EXPECT_GE(turns, 3) << "the second turn did not fit: " << c.out();
  const size_t before = c.out().size();
  c.send("/reset\n");
  ASSERT_TRUE(c.expect("[conversation reset]\n> ", before)) << c.out();
  const size_t after = c.out().size();
  EXPECT_EQ(turn(c, line), first);
  EXPECT_EQ(c.out().find("maximum context length", after), std::string::npos) << c.out();
  c.send("/exit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

TEST(Chat, CtrlDOnAnEmptyLineQuits) {
  PtyChat c({"-n", "4"});
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.expect("> ", 0)) << c.out();
  c.send("\x04");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

// Each step sleeps 100 ms: 20 tokens take two seconds, and the first of
// them shows long before the prompt comes back.
TEST(Chat, AnswersStreamAsTheyAreGenerated) {
  PtyChat c({"-n", "20", "--step-delay-ms", "100", "--min-tokens", "20"});
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.expect("> ", 0)) << c.out();
  const std::string line = "Tell me a story";
  c.send(line + "\n");
  const auto echo = c.expect(line + "\n", 0);
  ASSERT_TRUE(echo) << c.out();
  ASSERT_TRUE(c.grow_past(*echo + line.size() + 1, std::chrono::seconds(60))) << c.out();
  const auto first_byte = Clock::now();
  ASSERT_TRUE(c.expect("\n> ", *echo + line.size() + 1)) << c.out();
  EXPECT_GT(Clock::now() - first_byte, std::chrono::milliseconds(800)) << c.out();
  c.send("/exit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

// A long answer (the rest of the context at 50 ms a token) is stopped by
// Ctrl-C; the chat goes on. Ctrl-C at the prompt drops what was typed.
TEST(Chat, CtrlCInterruptsTheAnswer) {
  PtyChat c({"--step-delay-ms", "50", "--min-tokens", "1000"});
  ASSERT_TRUE(c.started());
  ASSERT_TRUE(c.expect("> ", 0)) << c.out();
  const std::string line = "Tell me a story";
  c.send(line + "\n");
  const auto echo = c.expect(line + "\n", 0);
  ASSERT_TRUE(echo) << c.out();
  ASSERT_TRUE(c.grow_past(*echo + line.size() + 3, std::chrono::seconds(60))) << c.out();
  const auto sent = Clock::now();
  c.send("\x03");
  const auto stopped = c.expect("[interrupted]\n> ", *echo);
  ASSERT_TRUE(stopped) << c.out();
  EXPECT_LT(Clock::now() - sent, std::chrono::seconds(10));
  // A half-typed line, then Ctrl-C: a new prompt, and the line is gone.
  c.send("abc");
  ASSERT_TRUE(c.expect("abc", *stopped)) << c.out();
  const size_t mark = c.out().size();
  c.send("\x03");
  ASSERT_TRUE(c.expect("\n> ", mark)) << c.out();
  c.send("/exit\n");
  EXPECT_EQ(c.wait_exit(), 0) << c.out();
}

TEST(Chat, RefusesBadOptionsAtStart) {
  const auto r = test::run_command({test::baton_binary(), "chat", stories(), "--chat-template", "no-such-template"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("no-such-template"), std::string::npos) << r.err;
  const auto p = test::run_command({test::baton_binary(), "chat", stories(), "--presence-penalty", "3"});
  EXPECT_EQ(p.exit_code, 1);
  EXPECT_EQ(p.err, "baton chat: --presence-penalty must be between -2 and 2, got 3\n");
  const auto t = test::run_command({test::baton_binary(), "chat", stories(), "--temp", "-1"});
  EXPECT_EQ(t.err, "baton chat: --temp must be between 0 and 2, got -1\n");
}

}  // namespace
}  // namespace baton
