// How every `baton` command reads its arguments: Boost.Program_options with
// -h/--help. It lives here, beside engine/command_error.h, because engine/ is
// below every command folder (coordinator/, gguf_split/, worker/) and commands
// must not include cli/. Header only, so the engine library does not link
// Program_options; the command folders that include it do.
#pragma once

#include <boost/program_options.hpp>

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

// The parsed arguments, or nullopt after the help went to stdout. --help is
// looked at before notify(), so that it works without the required options.
inline std::optional<boost::program_options::variables_map> parse_command_line(int argc, char** argv,
                                                                               const CommandLine& cl) {
  namespace po = boost::program_options;
  po::options_description all;
  all.add(cl.options);
  if (cl.hidden) all.add(*cl.hidden);
  po::command_line_parser parser(argc, argv);
  parser.options(all);
  if (cl.positional) parser.positional(*cl.positional);
  // Words no option or positional slot takes are refused, not dropped (a
  // model path given where the command reads none would be ignored), and
  // the message names the first of them.
  auto stray_words = [&] {
    po::command_line_parser plain(argc, argv);
    plain.options(all);
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
  }
  const po::parsed_options& parsed = *run;
  for (const po::option& o : parsed.options) {
    if (o.string_key.empty() && !o.original_tokens.empty()) refuse(o.original_tokens.front());
  }
  po::variables_map vm;
  po::store(parsed, vm);
  if (vm.count("help")) {
    std::cout << cl.help_head << cl.options << cl.help_tail;
    return std::nullopt;
  }
  po::notify(vm);
  return vm;
}

}  // namespace baton
