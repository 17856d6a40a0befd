// How every `baton` command reads its arguments: Boost.Program_options with
// -h/--help. It lives here, beside engine/base/command_error.h, because engine/ is
// below every command folder (coordinator/, gguf_split/, worker/) and commands
// must not include cli/. Header only, so the engine library does not link
// Program_options; the command folders that include it do.
#pragma once

#include <boost/program_options.hpp>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>
#include <string_view>

namespace baton {

// BATON_PARSE_ONLY=1: a command parses and checks its options (and reads a
// --config file), then exits 0 before it opens any other file, resolves a
// host or does its work. tests/test_cli_documented_commands.cpp runs every
// command that README.md, docs/ and configs/ show this way, so that none of
// them goes stale.
inline bool parse_only() {
  const char* v = std::getenv("BATON_PARSE_ONLY");
  return v && std::string_view(v) == "1";
}

// What one command accepts besides argv.
struct CommandLine {
  const boost::program_options::options_description& options;  // the ones --help lists
  std::string_view help_head = "";                               // --help prints head, options, tail
  std::string_view help_tail = "\n";
  // Options --help does not list, filled from the positional arguments.
  const boost::program_options::options_description* hidden = nullptr;
  const boost::program_options::positional_options_description* positional = nullptr;
};

namespace command_line_detail {

// Spellings people bring from llama.cpp and vLLM, taken as another name of a
// Baton option wherever the command has that option and no option of the
// alias's own name ("-c" stays bench --serve's --concurrency).
struct Alias {
  std::string_view alias;  // "-c" or "--ctx-size"
  std::string_view name;   // the long name it stands for
};
inline constexpr Alias kAliases[] = {
    {"-c", "ctx"},
    {"--ctx-size", "ctx"},
    {"--max-model-len", "ctx"},
    {"--batch-size", "batch"},
    {"--temperature", "temp"},
    {"--served-model-name", "model-id"},
    {"--alias", "model-id"},
    {"-np", "parallel"},
    {"--max-num-seqs", "parallel"},
    {"--pipeline-parallel-size", "workers"},
};

// Switches of other servers that ask for what Baton always does: taken and
// dropped (a value of on/off/auto after them too), wherever the command runs
// models.
struct Accepted {
  std::string_view option;
  std::string_view why;
};
inline constexpr Accepted kAccepted[] = {
    {"--jinja", "chat templates always run as Jinja"},
    {"--flash-attn", "attention always runs fused"},
    {"-fa", "attention always runs fused"},
};

// Options of other servers that have no counterpart under another name: the
// refusal says what Baton does instead.
struct Foreign {
  std::string_view option;
  std::string_view instead;
};
inline constexpr Foreign kForeign[] = {
    {"-ngl", "every layer of a stage goes to the GPU with --backend cuda (auto picks it when one is usable)"},
    {"--n-gpu-layers", "every layer of a stage goes to the GPU with --backend cuda (auto picks it when one is usable)"},
    {"--gpu-layers", "every layer of a stage goes to the GPU with --backend cuda (auto picks it when one is usable)"},
    {"-tp", "Baton splits a model by layers: --workers K (a pipeline of K stages)"},
    {"--tensor-parallel-size", "Baton splits a model by layers: --workers K (a pipeline of K stages)"},
    {"-ctk", "Baton keeps the KV cache unquantized (DeepSeek V4's may be packed: baton plan --kv packed); "
             "baton plan shows its bytes"},
    {"-ctv", "Baton keeps the KV cache unquantized (DeepSeek V4's may be packed: baton plan --kv packed); "
             "baton plan shows its bytes"},
    {"--cache-type-k", "Baton keeps the KV cache unquantized; baton plan shows its bytes"},
    {"--cache-type-v", "Baton keeps the KV cache unquantized; baton plan shows its bytes"},
};

inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

inline const boost::program_options::option_description* find_long(
    const boost::program_options::options_description& all, std::string_view name) {
  return all.find_nothrow(std::string(name), /*approx=*/false);
}

// "unknown option '--x' (did you mean --y?)": the option whose name is
// nearest by edit distance, or the one that begins with the typed name (what
// prefix guessing would have taken silently), when one is near enough.
inline std::string unknown_option(const boost::program_options::options_description& all, const std::string& token) {
  for (const Foreign& f : kForeign) {
    if (token == f.option) return "unknown option '" + token + "': " + std::string(f.instead);
  }
  const std::string typed = token.substr(token.find_first_not_of('-'));
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& o : all.options()) {
    const std::string& name = o->long_name();
    if (name.empty() || name == "help") continue;
    size_t d = edit_distance(typed, name);
    if (typed.size() >= 3 && name.rfind(typed, 0) == 0) d = std::min<size_t>(d, 1);
    if (d < best_d) best_d = d, best = name;
  }
  std::string msg = "unknown option '" + token + "'";
  if (!best.empty() && best_d <= std::max<size_t>(2, typed.size() / 3)) return msg + " (did you mean --" + best + "?)";
  return msg + " (see --help)";
}

// argv as the parser reads it: aliases by their Baton names; a value that
// begins with '-' (`-n -1`, `--temp -0.5`, `-p "-x"`) attached to its option
// (`--n-predict=-1`), which the parser would take for an option; and every
// option checked by its exact name. There is no prefix guessing: `--api-key
// K` is not --api-key-file, and `-ngl 99` is not `-n gl`.
inline std::vector<std::string> normalize_words(int argc, char** argv,
                                                const boost::program_options::options_description& all) {
  namespace po = boost::program_options;
  std::vector<std::string> out;
  const po::option_description* wants_value = nullptr;  // the previous word's option, awaiting its value
  bool after_dashes = false;
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i];
    if (after_dashes || w.size() < 2 || w[0] != '-') {
      wants_value = nullptr;
      out.push_back(std::move(w));
      continue;
    }
    if (wants_value) {  // the value of the previous option, even when it begins with '-'
      out.back() = "--" + wants_value->long_name() + "=" + w;
      wants_value = nullptr;
      continue;
    }
    if (w == "--") {
      after_dashes = true;
      out.push_back(std::move(w));
      continue;
    }
    if (const std::string bare = w.substr(0, w.find('=')); !find_long(all, bare.substr(bare.find_first_not_of('-')))) {
      const bool accepted = std::any_of(std::begin(kAccepted), std::end(kAccepted),
                                        [&](const Accepted& a) { return a.option == bare; });
      // Only where the command runs models (it has --ctx).
      if (accepted && find_long(all, "ctx")) {
        if (w.find('=') == std::string::npos && i + 1 < argc) {
          const std::string next = argv[i + 1];
          if (next == "on" || next == "off" || next == "auto") ++i;
        }
        continue;
      }
    }
    const bool is_long = w[1] == '-';
    const size_t eq = w.find('=');
    std::string spelled = is_long ? w.substr(0, eq) : w.substr(0, 2);
    // -XY... is a short option with its value attached (-n40, -m/a.gguf),
    // unless it goes on with letters: a multi-letter option of another tool
    // (-ngl), which must not read as -n gl.
    if (!is_long && w.size() > 2 && std::isalpha(static_cast<unsigned char>(w[1])) &&
        std::isalpha(static_cast<unsigned char>(w[2]))) {
      spelled = w;
    }
    // "=VALUE" of a long option, the attached value of a short one
    const std::string attached = w.substr(std::min(w.size(), is_long ? (eq == std::string::npos ? w.size() : eq + 1)
                                                                     : spelled.size()));
    const bool value_attached = is_long ? eq != std::string::npos : !attached.empty();
    const po::option_description* o =
        is_long ? find_long(all, spelled.substr(2)) : all.find_nothrow(spelled, false);
    if (!o) {
      for (const Alias& a : kAliases) {
        if (a.alias != spelled) continue;
        o = find_long(all, a.name);
        if (o) w = "--" + o->long_name() + (value_attached ? "=" + attached : "");
        break;
      }
    }
    if (!o) throw std::invalid_argument(unknown_option(all, spelled));
    if (!value_attached && o->semantic()->min_tokens() > 0) wants_value = o;
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace command_line_detail

// "also accepted" lines for the aliases that apply to these options.
inline std::string alias_help(const boost::program_options::options_description& all) {
  std::string text;
  for (const auto& a : command_line_detail::kAliases) {
    if (!command_line_detail::find_long(all, a.name)) continue;
    const std::string alias_name(a.alias.substr(a.alias.find_first_not_of('-')));
    if (a.alias.size() > 2 && command_line_detail::find_long(all, alias_name)) continue;
    if (a.alias.size() == 2 && all.find_nothrow(std::string(a.alias), false)) continue;
    text += "  " + std::string(a.alias) + " = --" + std::string(a.name) + "\n";
  }
  if (command_line_detail::find_long(all, "ctx")) {
    for (const auto& a : command_line_detail::kAccepted) {
      text += "  " + std::string(a.option) + ": taken and ignored (" + std::string(a.why) + ")\n";
    }
  }
  return text.empty() ? text : "\nalso accepted (the spellings of llama.cpp and vLLM):\n" + text;
}

// The parsed arguments, or nullopt after the help went to stdout. --help is
// looked at before notify(), so that it works without the required options.
// Every command parses through here: options by their exact names (no
// prefix guessing), the aliases above, and one line naming the nearest real
// option for an unknown one.
inline std::optional<boost::program_options::variables_map> parse_command_line(int argc, char** argv,
                                                                               const CommandLine& cl) {
  namespace po = boost::program_options;
  po::options_description all;
  all.add(cl.options);
  if (cl.hidden) all.add(*cl.hidden);
  const std::vector<std::string> args = command_line_detail::normalize_words(argc, argv, all);
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::command_line_parser parser(args);
  parser.options(all).style(style);
  if (cl.positional) parser.positional(*cl.positional);
  // Words no option or positional slot takes are refused, not dropped (a
  // model path given where the command reads none would be ignored), and
  // the message names the first of them.
  auto stray_words = [&] {
    po::command_line_parser plain(args);
    plain.options(all).style(style);
    std::vector<std::string> words;
    for (const po::option& o : plain.run().options) {
      if (o.string_key.empty() && !o.original_tokens.empty()) words.push_back(o.original_tokens.front());
    }
    return words;
  };
  auto refuse = [](const std::string& word) {
    throw std::invalid_argument("unexpected argument '" + word + "' (see --help)");
  };
  std::optional<po::parsed_options> run;
  try {
    run.emplace(parser.run());
  } catch (const po::too_many_positional_options_error&) {
    const std::vector<std::string> words = stray_words();
    const size_t taken = cl.positional ? cl.positional->max_total_count() : 0;
    refuse(words.size() > taken ? words[taken] : words.empty() ? std::string("?") : words.back());
  } catch (const po::unknown_option& e) {
    throw std::invalid_argument(command_line_detail::unknown_option(all, e.get_option_name()));
  }
  const po::parsed_options& parsed = *run;
  for (const po::option& o : parsed.options) {
    if (o.string_key.empty() && !o.original_tokens.empty()) refuse(o.original_tokens.front());
  }
  po::variables_map vm;
  po::store(parsed, vm);
  if (vm.count("help")) {
    std::cout << cl.help_head << cl.options << alias_help(all) << cl.help_tail;
    return std::nullopt;
  }
  po::notify(vm);
  return vm;
}

}  // namespace baton
