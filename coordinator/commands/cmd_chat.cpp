// `baton chat`: an interactive chat with a model in this process. Each turn
// goes through the same path as a POST /v1/chat/completions (the messages
// rendered by the chat template, the request's sampling fields, the output
// split into reasoning and answer), submitted to a LocalEngine whose events
// are printed as they come. The terminal stays in its own (canonical) line
// mode: the line editing is the terminal's.
//
// Signals: SIGINT sets a flag (no SA_RESTART, so a read of the next line
// returns EINTR). While a reply streams, the flag cancels it; at the prompt
// it drops the line typed so far. The engine's threads start with SIGINT
// blocked, and the prompt also looks at the flag every 100 ms, so a signal
// that another thread took still drops the line.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "chat/jinja_prompt.h"
#include "chat/output/parser.h"
#include "chat/templates/builtin.h"
#include "coordinator/commands/chat_remote.h"
#include "coordinator/api/metrics.h"
#include "coordinator/api/openai_request.h"
#include "coordinator/cluster/local_engine.h"
#include "coordinator/commands/commands.h"
#include "coordinator/commands/model_choice.h"
#include "engine/base/command_error.h"
#include "engine/base/command_line.h"
#include "engine/runtime/backend.h"
#include "engine/sampling/sampler.h"

namespace baton {
namespace {

namespace po = boost::program_options;
using json = nlohmann::json;

const char* kUsage =
    "usage: baton chat [[-m] MODEL] [--chat-template FILE|NAME] [--system TEXT] [sampling options]\n"
    "       baton chat --url http://HOST:PORT [--api-key KEY] [-m MODEL] [--system TEXT] [sampling options]\n\n"
    "Chat with a model in the terminal. Each line you type is a user message; the model's\n"
    "answer streams as it is generated, rendered with the model's chat template (or\n"
    "--chat-template). Reasoning, for models that write it, is shown apart (dimmed on a\n"
    "terminal, else between <thinking> lines). With --url the model runs in a server\n"
    "(`baton serve` or any OpenAI-compatible one): each turn is a streamed\n"
    "POST /v1/chat/completions, and -m names the served model (default: its first).\n\n"
    "  /reset   forget the conversation (the --system message stays)\n"
    "  /exit    quit (so does Ctrl-D on an empty line)\n"
    "  Ctrl-C   stop the answer being written (at the prompt: drop the line)\n\n";

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

struct ChatOptions {
  std::string model, chat_template, system, backend = "auto", url, api_key;
  LocalEngineConfig engine;
  std::optional<int64_t> max_tokens;
  json sampling = json::object();  // request fields the options set
};

std::optional<ChatOptions> parse(int argc, char** argv) {
  ChatOptions o;
  o.engine.stage.n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  po::options_description desc("options");
  // clang-format off
  desc.add_options()
      ("help,h", "print this help and exit")
      ("model,m", po::value<std::string>(&o.model),
       ("GGUF model file (default: $BATON_MODEL, else " + std::string(kDefaultModelRel) + ")").c_str())
      ("chat-template", po::value<std::string>(&o.chat_template),
       ("Jinja chat template instead of the model's own: a file, or a built-in name: " +
        builtin_chat_template_names()).c_str())
      ("url", po::value<std::string>(&o.url), "chat with the server at http://HOST:PORT instead of a model in this process")
      ("api-key", po::value<std::string>(&o.api_key), "with --url: the server's API key (default: $BATON_API_KEY)")
      ("system", po::value<std::string>(&o.system), "a system message that opens the conversation")
      ("max-tokens,n", po::value<int64_t>(), "most tokens of one answer (default: the rest of the context)")
      ("temp", po::value<double>(), "temperature (default 0.8; 0 = greedy)")
      ("top-p", po::value<double>(), "top_p (default 0.95)")
      ("top-k", po::value<int64_t>(), "top_k (default 40)")
      ("min-p", po::value<double>(), "min_p (default 0.05)")
      ("seed", po::value<uint64_t>(), "seed of the first answer (each answer takes the next; default: random)")
      ("repeat-penalty", po::value<double>(), "repetition_penalty (default 1, off)")
      ("repeat-last-n", po::value<int64_t>(), "repeat_last_n (default 64)")
      ("presence-penalty", po::value<double>(), "presence_penalty (default 0)")
      ("frequency-penalty", po::value<double>(), "frequency_penalty (default 0)")
      ("min-tokens", po::value<int64_t>(), "min_tokens: the end of an answer waits for this many tokens (default 0)")
      ("ctx,c", po::value<int64_t>(&o.engine.stage.n_ctx)->default_value(0),
       "context of the conversation in tokens (0: the model's, at most 4096)")
      ("threads,t", po::value<int>(&o.engine.stage.n_threads), "CPU threads (default: all cores)")
      ("backend", po::value<std::string>(&o.backend)->default_value("auto"), "auto, cpu or cuda")
      ("step-delay-ms", po::value<int>(&o.engine.step_delay_ms)->default_value(0),
       "sleep this long before every step (models a slow machine; for tests)");
  // clang-format on
  po::positional_options_description positional;
  positional.add("model", 1);
  const auto parsed = parse_command_line(argc, argv, {.options = desc, .help_head = kUsage, .positional = &positional});
  if (!parsed) return std::nullopt;
  const po::variables_map& vm = *parsed;
  // The llama.cpp defaults `baton run` has; each is checked as a request field is.
  o.sampling = {{"temperature", 0.8}, {"top_p", 0.95}, {"top_k", 40}, {"min_p", 0.05}};
  // Checked here against the request fields' ranges (whose flags are these
  // options' names), so that a bad value fails at start, not at the first turn.
  auto take = [](const char*, const SamplingRange& range, double x) {
    if (std::string why = sampling_range_problem(range, x); !why.empty()) throw std::invalid_argument(why);
  };
  for (const auto& [flag, range] : {std::pair{"temp", kTemperatureRange}, std::pair{"top-p", kTopPRange},
                                    std::pair{"min-p", kMinPRange}, std::pair{"repeat-penalty", kRepeatPenaltyRange},
                                    std::pair{"presence-penalty", kPresencePenaltyRange},
                                    std::pair{"frequency-penalty", kFrequencyPenaltyRange}}) {
    if (!vm.count(flag)) continue;
    take(flag, range, vm[flag].as<double>());
    o.sampling[range.field] = vm[flag].as<double>();
  }
  for (const auto& [flag, range] : {std::pair{"top-k", kTopKRange}, std::pair{"repeat-last-n", kRepeatLastNRange},
                                    std::pair{"min-tokens", kMinTokensRange}}) {
    if (!vm.count(flag)) continue;
    take(flag, range, double(vm[flag].as<int64_t>()));
    o.sampling[range.field] = vm[flag].as<int64_t>();
  }
  if (vm.count("seed")) o.sampling["seed"] = vm["seed"].as<uint64_t>();
  if (vm.count("max-tokens")) {
    o.max_tokens = vm["max-tokens"].as<int64_t>();
    if (*o.max_tokens < 1) throw std::invalid_argument("--max-tokens must be >= 1");
  }
  if (o.engine.step_delay_ms < 0) throw std::invalid_argument("--step-delay-ms must be >= 0");
  if (o.engine.stage.n_threads < 1) throw std::invalid_argument("--threads must be >= 1");
  if (o.engine.stage.n_ctx < 0) throw std::invalid_argument("--ctx must be >= 0");
  if (!o.url.empty()) {
    // The server renders with its own template and runs its own engine.
    for (const char* local : {"chat-template", "threads", "backend"}) {
      if (vm.count(local) && !vm[local].defaulted()) throw std::invalid_argument(std::string("--") + local + " is the server's with --url");
    }
    if (o.api_key.empty()) {
      if (const char* k = std::getenv("BATON_API_KEY")) o.api_key = k;
    }
    return o;
  }
  if (!o.api_key.empty()) throw std::invalid_argument("--api-key goes with --url");
  if (!o.chat_template.empty() && !parse_only()) check_chat_template_choice(o.chat_template);
  if (o.model.empty()) o.model = default_model();
  if (o.model.empty()) throw std::invalid_argument("give the model with -m MODEL (see --help)");
  return o;
}

// Events of the running answer, from the engine's thread to the main one.
struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<GenerationEvent> events;
};

// Reads one line from fd 0. nullopt at the end of input; "" with
// g_interrupted set when Ctrl-C dropped the line.
std::optional<std::string> read_line() {
  std::string line;
  for (;;) {
    if (g_interrupted) return std::string();
    // A thread the engine started after the mask was set could take the
    // signal, leaving this read asleep: wait for input in short slices.
    pollfd in{0, POLLIN, 0};
    const int ready = poll(&in, 1, 100);
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;
    char c = 0;
    const ssize_t n = read(0, &c, 1);
    if (n < 0 && errno == EINTR) {
      if (g_interrupted) return std::string();
      continue;
    }
    if (n <= 0) return line.empty() ? std::nullopt : std::optional<std::string>(line);
    if (c == '\n') return line;
    line += c;
  }
}

class Chat {
 public:
  Chat(const ChatOptions& o, GenerationService& engine, std::shared_ptr<const JinjaTemplate> tmpl)
      : opt_(o), engine_(engine), tmpl_(std::move(tmpl)) {
    reset();
  }

  void reset() {
    messages_ = json::array();
    if (!opt_.system.empty()) messages_.push_back({{"role", "system"}, {"content", opt_.system}});
  }

  // One turn: the user's line, the streamed answer. False when the request
  // was refused (the line is dropped from the conversation).
  bool turn(const std::string& line) {
    messages_.push_back({{"role", "user"}, {"content", line}});
    json body = opt_.sampling;
    body["model"] = engine_.model().id;
    body["messages"] = messages_;
    if (opt_.max_tokens) body["max_tokens"] = *opt_.max_tokens;
    if (body.contains("seed")) body["seed"] = body["seed"].get<uint64_t>() + turns_;
    ApiRequest req;
    try {
      req = parse_chat_request(body.dump(), engine_.model(), tmpl_.get());
    } catch (const ApiError& e) {
      std::fprintf(stderr, "baton chat: %s\n", e.what());
      messages_.erase(messages_.end() - 1);
      return false;
    }
    ++turns_;
    auto queue = std::make_shared<EventQueue>();
    g_interrupted = false;
    const uint64_t id = engine_.submit(std::move(req.gen), [queue](GenerationEvent&& ev) {
      std::lock_guard lock(queue->mu);
      queue->events.push_back(std::move(ev));
      queue->cv.notify_one();
    });
    ReplyPrinter out(isatty(1));
    auto show = [&out](const ChatOutputDelta& d) {
      out.reasoning(d.reasoning);
      out.content(d.content);
      for (const auto& call : d.tool_calls) out.tool_call(call.name, call.arguments);
    };
    ChatOutputParser parser(req.output);
    bool cancelled = false, finished = false;
    std::string error;
    while (!finished) {
      std::deque<GenerationEvent> got;
      {
        std::unique_lock lock(queue->mu);
        queue->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return !queue->events.empty(); });
        got.swap(queue->events);
      }
      if (g_interrupted && !cancelled) {
        engine_.cancel(id);
        cancelled = true;
      }
      for (GenerationEvent& ev : got) {
        show(parser.push(ev.text));
        if (ev.finish) {
          finished = true;
          if (*ev.finish == FinishReason::error) error = ev.error;
        }
      }
    }
    show(parser.finish());
    out.end_reasoning();
    std::fputs("\n", stdout);
    if (cancelled) std::fputs("[interrupted]\n", stdout);
    std::fflush(stdout);
    if (!error.empty()) std::fprintf(stderr, "baton chat: %s\n", error.c_str());
    g_interrupted = false;
    // The answer as far as it came is the assistant's turn.
    messages_.push_back({{"role", "assistant"}, {"content", parser.output().content}});
    return true;
  }

 private:
  const ChatOptions& opt_;
  GenerationService& engine_;
  std::shared_ptr<const JinjaTemplate> tmpl_;
  json messages_;
  uint64_t turns_ = 0;
};

// Ctrl-C sets g_interrupted; no SA_RESTART, so that a read at the prompt returns EINTR.
void catch_sigint() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGINT, &sa, nullptr);
}

// The prompt: lines, /reset, /exit, Ctrl-D; `chat` is a Chat or a RemoteChat.
template <class AnyChat>
void converse(AnyChat& chat) {
  for (;;) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    const std::optional<std::string> line = read_line();
    if (!line) break;
    if (g_interrupted) {
      g_interrupted = false;
      std::fputs("\n", stdout);
      continue;
    }
    if (*line == "/exit" || *line == "/quit") break;
    if (*line == "/reset") {
      chat.reset();
      std::fputs("[conversation reset]\n", stdout);
      continue;
    }
    if (line->find_first_not_of(" \t\r") == std::string::npos) continue;
    g_interrupted = false;
    chat.turn(*line);
    g_interrupted = false;
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);
}

int chat_remote(const ChatOptions& o) {
  RemoteChatOptions r;
  r.url = o.url;
  r.api_key = o.api_key;
  r.model = o.model;
  r.system = o.system;
  r.sampling = o.sampling;
  r.max_tokens = o.max_tokens;
  catch_sigint();
  RemoteChat chat(std::move(r), g_interrupted);
  std::fprintf(stderr, "baton chat: %s at %s. /reset starts over, /exit or Ctrl-D quits, Ctrl-C stops an answer.\n",
               chat.model().empty() ? "the default model" : chat.model().c_str(), o.url.c_str());
  converse(chat);
  return 0;
}

int chat(ChatOptions opt) {
  std::shared_ptr<const JinjaTemplate> tmpl;
  if (!opt.chat_template.empty()) tmpl = load_chat_template(opt.chat_template).tmpl;
  std::string note;
  opt.engine.backend = resolve_backend(opt.backend, &note);
  if (std::string why = backend_unavailable(opt.engine.backend); !why.empty()) throw CommandError(why, kExitRefused);
  opt.engine.model_path = opt.model;
  opt.engine.stage.n_seq = 1;

  // The engine's threads inherit a mask with SIGINT blocked; only this one takes it.
  sigset_t sigint;
  sigemptyset(&sigint);
  sigaddset(&sigint, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigint, nullptr);
  Metrics metrics;
  LocalEngine engine(opt.engine, &metrics);
  engine.wait_loaded();
  catch_sigint();
  pthread_sigmask(SIG_UNBLOCK, &sigint, nullptr);  // a Ctrl-C during the load arrives now
  if (g_interrupted) {
    engine.shutdown();
    return 130;
  }

  const ModelInfo& m = engine.model();
  if (!tmpl && !m.chat_template) {
    std::fprintf(stderr, "baton chat: the model has no chat template: its %s format is used (--chat-template NAME "
                 "chooses one)\n", chat_family_name(m.chat_family));
  }
  std::fprintf(stderr, "baton chat: %s on the %s, context %lld. /reset starts over, /exit or Ctrl-D quits, Ctrl-C "
               "stops an answer.\n", m.id.c_str(), backend_name(opt.engine.backend), (long long)m.n_ctx);
  Chat chat(opt, engine, tmpl);
  converse(chat);
  engine.shutdown();
  return 0;
}

}  // namespace

int cmd_chat(int argc, char** argv) {
  auto opt = parse(argc, argv);
  if (!opt || parse_only()) return 0;
  if (!opt->url.empty()) return chat_remote(*opt);
  return chat(std::move(*opt));
}

}  // namespace baton
