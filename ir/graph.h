// The IR: a graph of tagged nodes in SSA form. Node i defines value %i; a node's inputs are
// earlier values; params (values that already hold buffers) come first.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lazyfuse/ir/device.h"
#include "lazyfuse/ir/dtype.h"
#include "lazyfuse/ir/op.h"
#include "lazyfuse/ir/shape.h"

namespace lazyfuse {

using ValueId = int32_t;

// Where the user's code made a node. `file` points at storage that lives as long as the
// process (a compiler's literal, or a name interned by the parser).
struct SourceLoc {
  const char* file = nullptr;
  uint32_t line = 0;
  uint32_t column = 0;

  static SourceLoc from(const std::source_location& where) {
    return {where.file_name(), where.line(), where.column()};
  }
  bool known() const { return file != nullptr && line != 0; }
  std::string str() const;  // "walkthrough.cc:42", or "<unknown>"
};

// An attribute value: an integer, a float, a bool or a list of integers.
using AttrValue = std::variant<int64_t, double, bool, std::vector<int64_t>>;

// Named attributes, kept sorted by key so that printing and hashing are deterministic.
// Keys are interned: every key is one of kAttrKeys.
class Attrs {
 public:
  void set(std::string_view key, AttrValue value);
  bool has(std::string_view key) const;
  const AttrValue& get(std::string_view key) const;  // throws VerifierError when absent
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;  // accepts an integer too
  bool get_bool(std::string_view key) const;
  const std::vector<int64_t>& get_ints(std::string_view key) const;

  const std::vector<std::pair<std::string_view, AttrValue>>& entries() const { return entries_; }
  bool empty() const { return entries_.empty(); }
  friend bool operator==(const Attrs&, const Attrs&) = default;

 private:
  std::vector<std::pair<std::string_view, AttrValue>> entries_;
};

// The attribute keys the ops use: const {value}; arange {start, step}; rand/randn {seed,
// offset}; reductions {dims, keepdim}; permute {dims}; narrow {dim, start}; gather, scatter_add
// and cat {dim}; collectives {reduce_op, dim, world, root}; attention {scale, causal, softcap,
// mask, bias, dropout, seed, offset}.
inline constexpr std::string_view kAttrKeys[] = {
    "bias",      "causal", "dim",   "dims", "dropout", "keepdim", "mask", "offset", "period",
    "reduce_op", "root",   "scale", "seed", "softcap", "start",   "step", "value",  "world"};

struct Node {
  Op op = Op::Param;
  DType dtype = DType::Float32;
  Shape shape;
  Device device = Device::cpu();
  std::vector<ValueId> inputs;
  Attrs attrs;
  SourceLoc where;

  std::string type_str() const;  // "f32[2,3] @cpu"
};

// A constant of one element: fused kernels compute it in place rather than read it.
inline bool is_scalar_constant(const Node& node) {
  return node.op == Op::Const && numel(node.shape) == 1;
}

struct Graph {
  std::string name = "main";
  std::vector<Node> nodes;
  std::vector<ValueId> outputs;

  int num_params() const;
  ValueId add(Node node) {
    nodes.push_back(std::move(node));
    return static_cast<ValueId>(nodes.size() - 1);
  }
};

// A structural hash per node: op, dtype, shape, device, attributes and the hashes of its
// inputs; a param hashes its position. Never a buffer address, so equal computations on
// different data hash alike.
std::vector<uint64_t> structural_hashes(const Graph& graph);
uint64_t hash_attrs(const Attrs& attrs);

// For each value, the nodes that use it (in order, repeated when used twice).
std::vector<std::vector<ValueId>> users_of(const Graph& graph);

// IR text (printer.cc and parser.cc).
struct PrintOptions {
  bool locations = false;  // append loc("file":line:col) to nodes whose origin is known
};
std::string print_graph(const Graph& graph, const PrintOptions& options = {});
// One body line without indentation or newline: "%3 = add %0, %2 : f32[3] @cpu".
std::string print_node(const Graph& graph, ValueId id, const PrintOptions& options = {});
// Parses what print_graph prints. Throws ParseError ("LINE:COL: message").
Graph parse_graph(std::string_view text);

}  // namespace lazyfuse
