// The IR text printer: SSA, MLIR-like, one node per line. parser.cc reads exactly this back, so
// every choice here (float spelling, quoting, where a loc goes) has a twin there.
//
//   graph @main(%0: f32[3] @cpu, %1: f32[3] @cuda:0) {
//     %2 = const {value = 2.0} : f32[] @cpu
//     %3 = add %0, %2 : f32[3] @cpu loc("model.cc":12:7)
//     return %3
//   }
//
// A schedule (print_schedule) prints the same graph in the order of its steps, each kernel as a
// region around its member nodes, with the step's kind and, past an elementwise kernel, each
// member's role as a comment (Note [Definition order] in parser.cc says why the numbers may
// then come out of order):
//
//   kernel elementwise @k_3f9a1c0b(%0, %1) -> (%5) {
//     %2 = const {value = 2.0} : f32[] @cpu
//     %3 = add %0, %2 : f32[3] @cpu
//     ...
//   }
//   kernel row @k_77d0e2a5(%5) -> (%9) {
//     %6 = max %5 {dims = [1], keepdim = true} : f32[8, 1] @cpu  // reduction
//     ...
//   }
//
// A Group step's members print as their kernels, after a comment (the parser skips it) that
// says they share one launch:
//
//   // one launch, @g_5d2e8a41: the 2 kernels below
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/schedule.h"

namespace lazyfuse {
namespace {

// Plain std::string appends rather than absl::StrCat: the installed abseil's StrCat does not
// take std::string_view (its absl::string_view is a distinct class), and op names and
// attribute keys are std::string_views.
void append_value_name(std::string* out, int64_t id) {
  out->push_back('%');
  out->append(std::to_string(id));
}

// The shortest spelling that reads back as the same double, and always one that the parser
// sees as a float rather than an integer ("2" would come back as int64 2).
std::string format_double(double value) {
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, end);
  // 'n' covers "inf" and "nan"; 'e' the exponent form.
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

struct AttrValuePrinter {
  std::string* out;
  void operator()(int64_t value) const { out->append(std::to_string(value)); }
  void operator()(double value) const { out->append(format_double(value)); }
  void operator()(bool value) const { out->append(value ? "true" : "false"); }
  void operator()(const std::vector<int64_t>& values) const {
    out->push_back('[');
    for (size_t k = 0; k < values.size(); ++k) {
      if (k > 0) out->append(", ");
      out->append(std::to_string(values[k]));
    }
    out->push_back(']');
  }
};

// A string literal with the escapes the parser undoes; file names rarely need any, but a
// Windows path's backslashes must survive the round trip.
void append_quoted(std::string* out, std::string_view text) {
  out->push_back('"');
  for (char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          constexpr char kHex[] = "0123456789abcdef";
          out->append("\\x");
          out->push_back(kHex[(static_cast<unsigned char>(c) >> 4) & 0xf]);
          out->push_back(kHex[static_cast<unsigned char>(c) & 0xf]);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

bool is_bare_name(std::string_view name) {
  if (name.empty()) return false;
  auto is_alpha = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  if (!is_alpha(name[0])) return false;
  for (char c : name) {
    if (!is_alpha(c) && !(c >= '0' && c <= '9') && c != '.' && c != '$') return false;
  }
  return true;
}

void append_type_and_loc(std::string* out, const Node& node, const PrintOptions& options) {
  out->append(node.type_str());
  if (options.locations && node.where.known()) {
    out->append(" loc(");
    append_quoted(out, node.where.file);
    out->append(":" + std::to_string(node.where.line) + ":" + std::to_string(node.where.column) +
                ")");
  }
}

// "graph @main(%0: f32[3] @cpu, ...) {\n", shared by print_graph and print_schedule.
void append_graph_header(std::string* out, const Graph& graph, const PrintOptions& options) {
  out->append("graph @");
  // Names that are not identifiers are quoted, so that any name reads back.
  if (is_bare_name(graph.name)) {
    out->append(graph.name);
  } else {
    append_quoted(out, graph.name);
  }
  out->append("(");
  int num_params = graph.num_params();
  for (int i = 0; i < num_params; ++i) {
    if (i > 0) out->append(", ");
    append_value_name(out, i);
    out->append(": ");
    append_type_and_loc(out, graph.nodes[i], options);
  }
  out->append(") {\n");
}

void append_value_list(std::string* out, const std::vector<ValueId>& ids) {
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k > 0) out->append(", ");
    append_value_name(out, ids[k]);
  }
}

void append_return(std::string* out, const Graph& graph) {
  out->append("  return");
  if (!graph.outputs.empty()) out->push_back(' ');
  append_value_list(out, graph.outputs);
  out->append("\n}\n");
}

}  // namespace

std::string print_node(const Graph& graph, ValueId id, const PrintOptions& options) {
  const Node& node = graph.nodes[id];
  std::string out;
  append_value_name(&out, id);
  out += " = ";
  out += op_name(node.op);
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    out += k == 0 ? " " : ", ";
    append_value_name(&out, node.inputs[k]);
  }
  if (!node.attrs.empty()) {
    out += " {";
    bool first = true;
    for (const auto& [key, value] : node.attrs.entries()) {
      if (!first) out += ", ";
      out += key;
      out += " = ";
      std::visit(AttrValuePrinter{&out}, value);
      first = false;
    }
    out += "}";
  }
  out += " : ";
  append_type_and_loc(&out, node, options);
  return out;
}

std::string print_graph(const Graph& graph, const PrintOptions& options) {
  std::string out;
  append_graph_header(&out, graph, options);
  for (size_t i = graph.num_params(); i < graph.nodes.size(); ++i) {
    out += "  ";
    out += print_node(graph, static_cast<ValueId>(i), options);
    out += "\n";
  }
  append_return(&out, graph);
  return out;
}

std::string print_schedule(const Schedule& schedule, const PrintOptions& options) {
  const Graph& graph = schedule.graph;
  std::string out;
  append_graph_header(&out, graph, options);
  // How many steps compute each value: more than one only for a scalar constant that several
  // kernels recompute. Such a constant belongs to none of them alone, and a value is defined
  // once in the text, so it prints outside the regions, before the first kernel that uses it.
  // A group's members print as the kernels they are, after a comment naming the launch they
  // share.
  std::vector<const Step*> kernels;
  for (const Step& step : schedule.steps) {
    if (step.kind != StepKind::Group) {
      kernels.push_back(&step);
      continue;
    }
    for (const Step& member : step.members) kernels.push_back(&member);
  }
  std::vector<int> steps_of(graph.nodes.size(), 0);
  for (const Step* step : kernels)
    for (ValueId v : step->nodes) ++steps_of[v];
  std::vector<bool> printed(graph.nodes.size(), false);
  auto print_line = [&](ValueId id, std::string_view indent, const char* role = nullptr) {
    out += indent;
    out += print_node(graph, id, options);
    if (role != nullptr) {
      out += "  // ";
      out += role;
    }
    out += "\n";
    printed[id] = true;
  };
  auto print_step = [&](const Step& step) {
    // A step of one matmul, view, transfer or reduction prints as that node: a region would
    // say nothing the node does not. An elementwise step is a region even alone, since it is a
    // generated kernel with a name (`lazyfuse codegen` shows it).
    if (step.kind != StepKind::Elementwise && step.nodes.size() == 1) {
      if (!printed[step.nodes[0]]) print_line(step.nodes[0], "  ");
      return;
    }
    for (ValueId v : step.nodes)
      if (steps_of[v] > 1 && !printed[v]) print_line(v, "  ");
    out += "  kernel ";
    out += step_kind_name(step.kind);
    out += " @";
    out += step.kernel_name();
    out += "(";
    append_value_list(&out, step.inputs);
    out += ") -> (";
    append_value_list(&out, step.outputs);
    out += ") {\n";
    const bool with_roles = step.kind != StepKind::Elementwise;
    for (size_t i = 0; i < step.nodes.size(); ++i)
      if (steps_of[step.nodes[i]] == 1)
        print_line(step.nodes[i], "    ", with_roles ? role_name(step.roles[i]) : nullptr);
    out += "  }\n";
  };
  for (const Step& step : schedule.steps) {
    if (step.kind != StepKind::Group) {
      print_step(step);
      continue;
    }
    out += "  // one launch, @";
    out += step.kernel_name();
    out += ": the ";
    out += std::to_string(step.members.size());
    out += " kernels below\n";
    for (const Step& member : step.members) print_step(member);
  }
  // Nodes no step computes (a scalar constant nothing uses, when dce did not run) still belong
  // to the graph; they print last, where every operand is defined.
  for (size_t i = graph.num_params(); i < graph.nodes.size(); ++i)
    if (!printed[i]) print_line(static_cast<ValueId>(i), "  ");
  append_return(&out, graph);
  return out;
}

}  // namespace lazyfuse
