// What the fusion pass makes of a graph: an ordered list of steps, each a kernel or a library
// call or a view, over the values of the graph.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/half_rounding.h"

namespace lazyfuse {

// What a step is: the kind of kernel (or library call, or no work) a backend runs for it.
// Fusion decides it (ir/passes/fusion.cc) and every backend switches on it; a kind reads its
// members' roles (below), never their positions.
enum class StepKind : uint8_t {
  Elementwise,  // one fused kernel over `shape`: generators, elementwise ops, casts, copies
  // One reduction, of a stored value or of the elementwise prologue fused before it, storing
  // only its result; over trailing dims, all dims, or (of a stored value) any.
  Reduction,
  // Reductions of the same rows (softmax's max, then its sum), the row values between them
  // and the epilogue after them: one program per row, a pass per reduction and a last pass for
  // the epilogue (Note [The fusion algorithm], phases 4-6).
  Row,
  // One reduction over leading dims, its prologue computed, and stored where the step stores
  // it, as the columns are walked (phase 7).
  Column,
  Matmul,      // a library call (OpenBLAS, cuBLAS), with its bias and activation epilogue
  View,        // no work: new sizes and strides over the operand's storage
  Transfer,    // a copy between devices
  Index,       // gather, scatter_add or cat: one node over stored operands (a library step)
  Collective,  // an exchange among a job's processes (runtime/distributed/process_group.h)
  // Independent kernels (`members`) launched as one (Note [Horizontal fusion] in
  // ir/passes/horizontal_fusion.cc): an optimizer's update of every parameter in one launch.
  Group,
  // Attention nodes over the same operands (Note [Attention] in ir/attention.cc): a forward
  // with its logsumexp, or the gradients of q, k and v; one kernel, no scores in memory.
  Attention,
};
// "elementwise", "row", ...: how the fused IR names a kind (print_schedule, parse_graph), and
// the kind of a name (nullopt for none).
const char* step_kind_name(StepKind kind);
std::optional<StepKind> step_kind_named(std::string_view name);
inline std::ostream& operator<<(std::ostream& os, StepKind kind) {
  return os << step_kind_name(kind);
}
// Reduction, Row or Column.
inline bool is_reduction_kind(StepKind kind) {
  return kind == StepKind::Reduction || kind == StepKind::Row || kind == StepKind::Column;
}

// What a member does in its step, recorded by fusion beside the member and read by the
// backends and the printer.
enum class Role : uint8_t {
  Work,       // an elementwise step's member; the one node of a view, transfer, index or collective
  Prologue,   // a reduction kind's member over the step's space that a reduction reads
  Reduction,  // a reduction
  RowValue,   // a row step's member with one value per row, computed between the passes
  Epilogue,   // a row step's member over the space that no reduction reads: the last pass
  Product,    // a matmul step's product
  Bias,       // a matmul step's add of a bias vector to each row of the product
  Activation,  // a matmul step's relu after the bias
};
const char* role_name(Role role);  // "prologue", "row value", ...

struct Step {
  StepKind kind = StepKind::Elementwise;
  // Members in topological order. A scalar constant may be a member of several steps: it is
  // recomputed, never stored.
  std::vector<ValueId> nodes;
  // Each member's role, beside `nodes` (a scalar constant's is that of the members it serves:
  // Work, Prologue or Epilogue).
  std::vector<Role> roles;
  // Values read from storage: params or outputs of earlier steps.
  std::vector<ValueId> inputs;
  // Members whose values are stored: graph outputs and values later steps read.
  std::vector<ValueId> outputs;
  // The iteration space: an elementwise kernel's shape; a reduction kind's operand's shape; a
  // group's first member's.
  Shape shape;
  Device device = Device::cpu();
  // A hash of the kernel's structure that leaves sizes out (ops, dtypes, ranks, attributes,
  // operand wiring): the name of the kernel and the key of compiled-code caches.
  uint64_t kernel_key = 0;
  // Its half-type values rounded after every op rather than where stored (Note [Half precision
  // in fused kernels]).
  bool round_each_op = true;
  // A group's kernels, each an Elementwise, Reduction or Column step, none reading what another
  // computes. The group's nodes, inputs and outputs are theirs, concatenated in member order.
  std::vector<Step> members;

  // The members of `role`, in order.
  std::vector<ValueId> with_role(Role role) const;
  // The first member of `role`; -1 where there is none.
  ValueId first_with_role(Role role) const;
  // The role of member `member`.
  Role role_of(ValueId member) const;
  std::string kernel_name() const;  // "k_3f9a1c0b", a group's "g_3f9a1c0b"
};

// The step's kernel_key: for a group, a hash of its members' keys in order.
uint64_t step_kernel_key(const Graph& graph, const Step& step);

// `steps` in an order where every step comes after the steps computing its inputs (Kahn's
// algorithm, the step with the smallest last member first, so the order follows the user's
// program; a collective before the rest as soon as it is ready, so that it overlaps the steps
// that do not read it). Throws VerifierError when the steps depend on each other in a cycle.
std::vector<Step> order_steps(const Graph& graph, std::vector<Step> steps);

// The fusion pass's switches and caps, in one place (ir/passes/fusion.cc's note says why each
// exists); the code generators rely on max_row (codegen/cuda/cuda_codegen.h's row kernel).
struct FusionOptions {
  bool enabled = true;  // off: one step per node (benchmarks measure what fusion buys)
  HalfRounding half_rounding = HalfRounding::AtStores;
  // Caps that cut an elementwise group.
  int max_nodes = 128;
  int max_inputs = 16;
  // The longest row (elements) a row step takes: its kernel walks each row once per reduction
  // and once more for the epilogue, from cache.
  int64_t max_row = 32768;
  // The longest column (elements) a column step with work after its reductions takes (softmax
  // over dim 0): a GPU block walks a tile of whole columns once per reduction and once more, so
  // the kernel has a block per 32 columns however long they are.
  int64_t max_column = 4096;
};

struct Schedule {
  Graph graph;
  std::vector<Step> steps;

  // Steps that compute: fused kernels, reductions and library calls (views and transfers are
  // not kernels).
  int num_kernels() const;
};

// The graph in step order, each kernel as a region that defines no values of its own (printer.cc;
// parse_graph reads it back as the same Graph):
//   kernel @k_3f9a1c0b(%0, %1) -> (%5) {
//     %2 = const {value = 2.0} : f32[] @cpu
//     ...
//     %5 = mul %4, %1 : f32[3] @cpu
//   }
// A step of one matmul, view, transfer or reduction prints as its plain node.
std::string print_schedule(const Schedule& schedule, const PrintOptions& options = {});

}  // namespace lazyfuse
