// What the fusion pass makes of a graph: an ordered list of steps, each a kernel or a library
// call or a view, over the values of the graph.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace lazyfuse {

enum class StepKind : uint8_t {
  Elementwise,  // one fused kernel over `shape`: generators, elementwise ops, casts, copies
  Reduction,    // sum/mean/max/min, of a stored value or of a fused elementwise prologue
  Matmul,       // a library call (OpenBLAS, cuBLAS)
  View,         // no work: new sizes and strides over the operand's storage
  Transfer,     // a copy between devices
};

struct Step {
  StepKind kind = StepKind::Elementwise;
  // Members in topological order. A scalar constant may be a member of several steps: it is
  // recomputed, never stored.
  std::vector<ValueId> nodes;
  // Values read from storage: params or outputs of earlier steps.
  std::vector<ValueId> inputs;
  // Members whose values are stored: graph outputs and values later steps read.
  std::vector<ValueId> outputs;
  // The iteration space: an elementwise kernel's shape; a reduction's operand's shape.
  Shape shape;
  Device device = Device::cpu();
  // A hash of the kernel's structure that leaves sizes out (ops, dtypes, ranks, attributes,
  // operand wiring): the name of the kernel and the key of compiled-code caches.
  uint64_t kernel_key = 0;

  std::string kernel_name() const;  // "k_3f9a1c0b"
};

struct FusionOptions {
  bool enabled = true;  // off: one step per node (benchmarks measure what fusion buys)
  // Caps that cut a group; see fusion.cc's header note.
  int max_nodes = 128;
  int max_inputs = 16;
};

struct Schedule {
  Graph graph;
  std::vector<Step> steps;

  // Steps that compute: fused kernels, reductions and library calls (views and transfers are
  // not kernels).
  int num_kernels() const;
};

// A reduction step's members by role. A step holds one reduction or, as a row step, a chain of
// keepdim reductions over the same rows, each reading values computed from the step's inputs
// and the results of those before it (softmax's max, then its sum). The prologue is what the
// reductions read; the epilogue the members that read a result and that no reduction needs
// (softmax's normalisation), computed in a last pass over each row. Lists in topological order.
struct ReductionParts {
  ValueId reduction = -1;           // the last of `reductions`
  std::vector<ValueId> reductions;  // in order
  std::vector<ValueId> prologue;
  std::vector<ValueId> epilogue;
  // One block program per row (a pass per reduction, then the epilogue), rather than a
  // reduction of a computed operand.
  bool is_row_program() const { return reductions.size() > 1 || !epilogue.empty(); }
};
ReductionParts reduction_parts(const Graph& graph, const Step& step);

// A reduction step as steps of one reduction each, in order, every one with the members it
// needs (what earlier parts computed becomes an input); members that a later part reads or
// the step stores are stored by an elementwise step before their reduction instead of computed
// twice; last, an elementwise step for what the step stores and no part did (absent when
// nothing is left). Backends without a row program run these.
std::vector<Step> split_reduction_step(const Graph& graph, const Step& step);

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
