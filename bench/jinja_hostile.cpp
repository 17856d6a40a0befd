// Time and peak memory of the hostile chat templates of docs/RELIABILITY.md
// ("Hostile chat templates"), each in a child process of its own so that
// its peak resident memory and CPU time are its own (wait4's rusage; CPU
// time is the steadier figure on a shared machine):
//
//   cmake --build BUILD --target jinja_hostile_bench
//   BUILD/jinja_hostile_bench [--deadline-ms N] [--repeat N] [--only TEXT]
//   BUILD/jinja_hostile_bench --stack
//
// Without --deadline-ms the engine's default limits apply (no deadline); the
// server passes one. --repeat renders each template N times in its child
// (a leak shows as memory growing with N); --only keeps the templates whose
// name contains TEXT. --stack finds, for templates
// that nest right up to kMaxDepth, the smallest thread stack each parses
// and renders on (bisecting, one child per try): build it in a sanitizer
// build to see the figure under ASan.
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/template.h"

namespace {

using baton::JinjaTemplate;
using Clock = std::chrono::steady_clock;

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  for (size_t k = 0; k < n; ++k) out += s;
  return out;
}

struct Shape {
  const char* name;
  std::string source;
};

std::vector<Shape> shapes() {
  const size_t n = 200'000;
  const std::string wrap = "{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}";
  const std::string big = "{% set x = ['x' * 1000000] * 60000 %}";
  return {
      {"1+1+... 20,000 terms", "{{ 1" + repeat("+1", 20'000) + " }}"},
      {".a x 200,000", "{{ x" + repeat(".a", n) + " }}"},
      {"|upper x 200,000", "{{ x" + repeat("|upper", n) + " }}"},
      {"~ x 200,000", "{{ x" + repeat(" ~ x", n) + " }}"},
      {"or x 200,000", "{{ x" + repeat(" or x", n) + " }}"},
      {"[0] x 200,000", "{{ x" + repeat("[0]", n) + " }}"},
      {"(1) x 200,000", "{{ x" + repeat("(1)", n) + " }}"},
      {"1 if false else x 200,000", "{{ " + repeat("1 if false else ", n) + "1 }}"},
      {"macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"},
      {"[ns.x] x 100,000 (value nesting)", wrap + "{{ ns.x }}"},
      {"s|length over 60 MB x 100,000",
       "{% set s = 'x' * 60000000 %}{% for i in range(100000) %}{% if s | length > 0 %}{% endif %}{% endfor %}"},
      {"s|length over 50 MB x 100,000",
       "{% set s = 'x' * 50000000 %}{% for i in range(100000) %}{% if s | length > 0 %}{% endif %}{% endfor %}"},
      {"range(100000)|unique", "{{ range(100000) | unique | list | length }}"},
      {"i in l, 100,000 x 100,000",
       "{% set l = range(100000) | list %}{% for i in l %}{% if -1 in l %}{% endif %}{% endfor %}"},
      {"5M steps of 300 nodes",
       "{% for i in range(100000) %}{% for j in range(50) %}{{ (" + repeat("1,", 300) + ") | length }}{% endfor %}"
       "{% endfor %}"},
      {"5M loop iterations", "{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}"},
      {"5M calls of an empty macro",
       "{% macro f() %}{% endmacro %}{% for i in range(100000) %}{% for j in range(100) %}{{ f() }}{% endfor %}"
       "{% endfor %}"},
      {"5M sets of a 20-key dict",
       "{% for i in range(100000) %}{% for j in range(100) %}{% set d = {" + [] {
         std::string keys;
         for (int k = 0; k < 20; ++k) keys += (k ? ", 'k" : "'k") + std::to_string(k) + "': " + std::to_string(k);
         return keys;
       }() + "} %}{% endfor %}{% endfor %}"},
      {"upper/lower of 1 MB x 100,000",
       "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ (s | upper | lower)[:1] }}{% endfor %}"},
      {"find/count/replace in 1 MB x 100,000",
       "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s.find('y') }}{{ s.count('x') }}"
       "{{ s.replace('x', 'y')[:1] }}{% endfor %}"},
      {"['x'*1e6]*60000 printed", big + "{{ x }}"},
      {"['x'*1e6]*60000 | join", big + "{{ x | join }}"},
      {"['x'*1e6]*60000 | tojson", big + "{{ x | tojson }}"},
      {"['x'*1e6]*60000 | map('upper')", big + "{{ x | map('upper') | list | length }}"},
      {"'x' * 1e11", "{{ 'x' * 100000000000 }}"},
      {"replace x -> 'y'*1e5", "{{ ('x' * 1000) | replace('x', 'y' * 100000) }}"},
      {"split(',') of 60 MB", "{{ ('x,' * 30000000).split(',') | length }}"},
      {"list of 30 MB string", "{{ ('x' * 30000000) | list | length }}"},
      {"format 8 x 10 MB", "{{ '{0}{0}{0}{0}{0}{0}{0}{0}'.format('x' * 10000000) }}"},
      {"tojson(indent=1e8)", "{{ ([[[1]]] * 1000) | tojson(indent=100000000) }}"},
      {"ns.s ~ ns.s x 40", "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"},
      {"ns.l + ns.l x 40", "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}"},
      {"output 100 x 1 MB", "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}"},
      {"namespace holding itself (50 MB)",
       "{% set ns = namespace(a='x' * 50000000) %}{% set ns.self = ns %}"},
      {"raise_exception 10 MB", "{{ raise_exception('x' * 10000000) }}"},
  };
}

// Templates that nest right up to the depth limit, at load or while rendering.
std::vector<Shape> deep_shapes() {
  const size_t d = baton::jinja::kMaxDepth, n = d - 5;
  const std::string wrap = "{% set ns = namespace(x=[], y=[]) %}{% for i in range(" + std::to_string(d - 1) +
                           ") %}{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}";
  return {
      {"f(f(f(...))) at load", "{{ " + repeat("f(", d) + repeat(")", d) + " }}"},
      {"((((...)))) at load", "{{ " + repeat("(", d) + "1" + repeat(")", d) + " }}"},
      {"nested if at load", repeat("{% if true %}", d + 10)},
      {"1+1+... rendered", "{{ 1" + repeat("+1", n - 1) + " }}"},
      {"a if b else ... rendered", "{{ " + repeat("1 if false else ", n) + "2 }}"},
      {"x.a.a... rendered", "{{ x" + repeat(".a", n) + " }}"},
      {"nested if rendered", repeat("{% if true %}", n - 5) + "in" + repeat("{% endif %}", n - 5)},
      {"nested for rendered", repeat("{% for i in [1] %}", n - 5) + "in" + repeat("{% endfor %}", n - 5)},
      {"macro recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"},
      {"macro recursion through blocks",
       "{% macro f(n) %}{% for i in [1] %}{% if true %}{% set x %}{{ ((f(n + 1) ~ 'x') | upper) + 'y' }}{% endset %}"
       "{% endif %}{% endfor %}{% endmacro %}{{ f(0) }}"},
      {"call block recursion", "{% macro f(n) %}{% call f(n) %}{{ caller() }}{% endcall %}{% endmacro %}{{ f(0) }}"},
      {"list nested to the limit, printed", wrap + "{{ ns.x }}"},
      {"list nested to the limit, tojson", wrap + "{{ ns.x | tojson }}"},
      {"list nested to the limit, ==", wrap + "{{ ns.x == ns.y }}"},
  };
}

const std::string* g_source = nullptr;

void* parse_and_render(void*) {
  try {
    JinjaTemplate::parse(*g_source).render(nlohmann::ordered_json{{"x", {{"a", "b"}}}}, 0);
  } catch (const std::exception&) {
  }
  return nullptr;
}

// Whether the source parses and renders on a thread with `bytes` of stack
// (in a child: an overflow kills only the child).
bool fits(const std::string& source, size_t bytes) {
  const pid_t pid = fork();
  if (pid == 0) {
    g_source = &source;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, bytes);
    pthread_t thread;
    if (pthread_create(&thread, &attr, parse_and_render, nullptr) != 0) _exit(2);
    pthread_join(thread, nullptr);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int stack_table() {
  std::printf("| template (depth limit %d) | smallest stack (KiB) |\n|---|---|\n", baton::jinja::kMaxDepth);
  std::fflush(stdout);
  // The children's overflow reports would drown the table.
  if (!std::freopen("/dev/null", "w", stderr)) return 1;
  for (const Shape& s : deep_shapes()) {
    size_t lo = 16 << 10, hi = 64 << 20;
    if (!fits(s.source, hi)) {
      std::printf("| %s | more than %zu |\n", s.name, hi >> 10);
      continue;
    }
    while (hi - lo > (8 << 10)) {
      const size_t mid = (lo + hi) / 2;
      (fits(s.source, mid) ? hi : lo) = mid;
    }
    std::printf("| %s | %zu |\n", s.name, hi >> 10);
    std::fflush(stdout);
  }
  return 0;
}

// In the child: renders `repeat` times, prints the outcome on one line.
void run(const Shape& s, int deadline_ms, int repeat_count) {
  baton::jinja::RenderLimits limits;
  std::string outcome = "rendered";
  const auto t0 = Clock::now();
  try {
    const JinjaTemplate t = JinjaTemplate::parse(s.source);
    for (int k = 0; k < repeat_count; ++k) {
      if (deadline_ms > 0) limits.deadline = Clock::now() + std::chrono::milliseconds(deadline_ms);
      const std::string out = t.render(nlohmann::ordered_json::object(), 0, limits);
      outcome = "rendered " + std::to_string(out.size()) + " bytes";
    }
  } catch (const baton::jinja::TemplateError& e) {
    outcome = std::string("TemplateError: ") + e.what();
  } catch (const baton::jinja::RenderError& e) {
    outcome = std::string("RenderError: ") + e.what();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (outcome.size() > 90) outcome = outcome.substr(0, 87) + "...";
  std::string name = s.name;  // a table cell: its pipes escaped
  for (size_t at = 0; (at = name.find('|', at)) != std::string::npos; at += 2) name.insert(at, "\\");
  std::printf("| %s | %.2f | %%CPU%% | %%RSS%% | %s |\n", name.c_str(), secs, outcome.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && !std::strcmp(argv[1], "--stack")) return stack_table();
  int deadline_ms = 0, repeat_count = 1;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--deadline-ms")) deadline_ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeat")) repeat_count = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
  }
  std::printf("| template | seconds | CPU seconds | peak RSS (MiB) | outcome |\n|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const Shape& s : shapes()) {
    if (std::string(s.name).find(only) == std::string::npos) continue;
    int fds[2];
    if (pipe(fds) != 0) return 1;
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      run(s, deadline_ms, repeat_count);
      std::fflush(stdout);
      _exit(0);
    }
    close(fds[1]);
    std::string line;
    char buf[4096];
    ssize_t got;
    while ((got = read(fds[0], buf, sizeof buf)) > 0) line.append(buf, size_t(got));
    close(fds[0]);
    int status = 0;
    rusage ru{};
    wait4(pid, &status, 0, &ru);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) line = std::string("| ") + s.name + " | - | %CPU% | %RSS% | CRASHED |\n";
    const double cpu = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    char cpu_text[32];
    std::snprintf(cpu_text, sizeof cpu_text, "%.2f", cpu);
    if (size_t at = line.find("%CPU%"); at != std::string::npos) line.replace(at, 5, cpu_text);
    if (size_t at = line.find("%RSS%"); at != std::string::npos) line.replace(at, 5, std::to_string(ru.ru_maxrss / 1024));
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
  }
}
