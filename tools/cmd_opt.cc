// lazyfuse opt: parse IR text, run passes, print IR, in the manner of mlir-opt.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "tools/commands.h"

namespace lazyfuse::tools {

Graph load_graph(const std::string& path) {
  std::ostringstream text;
  if (path == "-") {
    text << std::cin.rdbuf();
  } else {
    std::ifstream file(path);
    if (!file) throw Error("cannot open '" + path + "'");
    text << file.rdbuf();
  }
  try {
    return parse_graph(text.str());
  } catch (const ParseError& e) {
    throw ParseError((path == "-" ? std::string("<stdin>") : path) + ":" + e.what(), e.line(),
                     e.column());
  }
}

int opt(const std::string& path, const std::optional<std::string>& passes, bool print_after_all,
        const std::vector<std::string>& print_after) {
  Graph graph = load_graph(path);
  PipelineOptions options;
  if (passes) {
    // `--passes=` gives an empty list: parse, verify and print, as mlir-opt does without passes.
    options.only.emplace();
    std::stringstream list(*passes);
    for (std::string pass; std::getline(list, pass, ',');) options.only->push_back(pass);
  }
  const bool any_after = print_after_all || !print_after.empty();
  options.after_pass = [&](std::string_view pass, const std::string& ir) {
    if (print_after_all ||
        std::find(print_after.begin(), print_after.end(), pass) != print_after.end())
      std::cout << "// -----// IR Dump After " << pass << " //----- //\n" << ir;
  };
  Schedule schedule = run_pipeline(std::move(graph), options);
  if (!any_after) {
    std::cout << (runs_fusion(options) ? print_schedule(schedule) : print_graph(schedule.graph));
  }
  return 0;
}

}  // namespace lazyfuse::tools
