// lazyfuse dot: the graph as Graphviz DOT, fused kernels as clusters, devices as colours;
// rendered to SVG or PNG through Graphviz's dot when it is installed.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/passes/passes.h"
#include "tools/commands.h"

namespace lazyfuse::tools {
namespace {

const char* colour(const Device& device) {
  if (device.is_cpu()) return "#e8e8e8";
  static const char* gpu[] = {"#cfe3ff", "#d4f5d4", "#ffe6c7", "#f3d6f5"};
  return gpu[std::max(device.index(), 0) % 4];
}

std::string label(const Graph& graph, ValueId id) {
  const Node& node = graph.nodes[id];
  std::string text = absl::StrCat("%", id, " ", op_name(node.op), "\\n", node.type_str());
  return absl::StrReplaceAll(text, {{"\"", "\\\""}});
}

}  // namespace

int dot(const std::string& path, bool fused, const std::string& output) {
  Graph graph = load_graph(path);
  PipelineOptions options;
  if (!fused) options.fusion.enabled = false;
  Schedule schedule = run_pipeline(std::move(graph), options);
  const Graph& g = schedule.graph;
  std::ostringstream out;
  out << "digraph \"" << g.name
      << "\" {\n  rankdir=TB;\n  node [shape=box, style=\"rounded,filled\", "
         "fontname=\"monospace\"];\n";
  auto emit_node = [&](ValueId id, const std::string& indent) {
    out << indent << "n" << id << " [label=\"" << label(g, id) << "\", fillcolor=\""
        << colour(g.nodes[id].device) << "\"];\n";
  };
  for (int i = 0; i < g.num_params(); ++i) emit_node(i, "  ");
  std::vector<bool> emitted(g.nodes.size(), false);
  for (size_t s = 0; s < schedule.steps.size(); ++s) {
    const Step& step = schedule.steps[s];
    const bool cluster = fused && step.nodes.size() > 1;
    if (cluster)
      out << "  subgraph cluster_" << s << " {\n    label=\"kernel " << step_kind_name(step.kind)
          << " @" << step.kernel_name() << "\";\n    style=dashed;\n";
    for (ValueId v : step.nodes) {
      if (emitted[v]) continue;  // a scalar constant computed in several kernels is drawn once
      emitted[v] = true;
      emit_node(v, cluster ? "    " : "  ");
    }
    if (cluster) out << "  }\n";
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (ValueId in : g.nodes[i].inputs) out << "  n" << in << " -> n" << i << ";\n";
  for (ValueId v : g.outputs)
    out << "  out" << v << " [label=\"return %" << v << "\", shape=plaintext];\n  n" << v
        << " -> out" << v << ";\n";
  out << "}\n";
  if (output.empty()) {
    std::cout << out.str();
    return 0;
  }
  const std::string extension = output.substr(output.find_last_of('.') + 1);
  if (extension == "dot" || extension == "gv") {
    std::ofstream(output) << out.str();
    return 0;
  }
  if (extension != "svg" && extension != "png")
    throw Error("-o takes a .svg, .png or .dot file, not '" + output + "'");
  if (std::system("command -v dot > /dev/null 2>&1") != 0)
    throw UnsupportedError(
        "rendering needs Graphviz's dot (apt-get install graphviz); -o FILE.dot writes the DOT "
        "text");
  const std::string command = absl::StrCat("dot -T", extension, " -o '", output, "'");
  FILE* pipe = popen(command.c_str(), "w");
  if (pipe == nullptr) throw Error("cannot run " + command);
  std::fputs(out.str().c_str(), pipe);
  if (pclose(pipe) != 0) throw Error("dot failed to render " + output);
  std::cout << "wrote " << output << "\n";
  return 0;
}

}  // namespace lazyfuse::tools
