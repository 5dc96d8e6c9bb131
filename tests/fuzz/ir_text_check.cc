// The IR text fuzzer's property (ir_text_check.h).
#include "tests/fuzz/ir_text_check.h"

#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/verifier.h"

namespace lazyfuse::fuzz {
namespace {

// The verifier's verdict: "" for a valid graph, else its message.
std::string verdict(const Graph& graph) {
  try {
    verify(graph);
    // What the passes compute first on every verified graph.
    structural_hashes(graph);
    users_of(graph);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

std::string check_ir_text(std::string_view text) {
  Graph graph;
  try {
    graph = parse_graph(text);
  } catch (const Error&) {
    return "";
  }
  const std::string first = verdict(graph);
  for (bool locations : {false, true}) {
    const PrintOptions options{.locations = locations};
    const std::string printed = print_graph(graph, options);
    Graph again;
    try {
      again = parse_graph(printed);
    } catch (const Error& e) {
      return "the printed graph does not parse: " + std::string(e.what()) + "\n" + printed;
    }
    const std::string reprinted = print_graph(again, options);
    if (reprinted != printed)
      return "print, parse and print again changed the text:\n" + printed + "-----\n" + reprinted;
    // Without locations the message names no origin, so only the verdict itself must agree.
    const std::string second = verdict(again);
    if (locations ? second != first : second.empty() != first.empty())
      return "the verifier judges the printed graph differently: '" + first + "' then '" + second +
             "'\n" + printed;
  }
  return "";
}

std::optional<Graph> parsed_and_verified(std::string_view text) {
  try {
    Graph graph = parse_graph(text);
    verify(graph);
    return graph;
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace lazyfuse::fuzz
