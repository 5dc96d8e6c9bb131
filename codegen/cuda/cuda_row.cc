// Generating the GPU source of a Row step (ir/schedule.h): reductions over each row with the
// elementwise work before, between and after them fused in (softmax, LayerNorm, RMSNorm, their
// gradients). A warp, or a block of warps, takes a row; its lanes keep their elements of the
// row's operands in registers where they fit (choose_cuda_row_layout), reduce through shuffles,
// and make one more pass over the row to store what the step stores.
//
// A Column step with work after its reductions (softmax over dim 0) is the same kernel turned
// on its side: a block takes a tile of a warp's width of columns, a lane each, so that a warp
// reads consecutive elements; its warps (slices) walk every kCudaColumnSlices-th element of the
// columns and combine through shared memory rather than shuffles.
#include <algorithm>
#include <bit>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cuda/cuda_codegen.h"
#include "lazyfuse/codegen/cuda/cuda_emit.h"
#include "lazyfuse/codegen/gpu_dialect.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"

namespace lazyfuse {
namespace {

const char* type_name(DType dtype) { return cuda_emit::storage_type_name(dtype); }

// The members of `candidates` (in topological order) that `roots` need, through candidates
// alone, in order.
std::vector<ValueId> needed_members(const Graph& graph, const std::vector<ValueId>& candidates,
                                    const std::vector<ValueId>& roots) {
  std::vector<bool> needed(graph.nodes.size(), false), candidate(graph.nodes.size(), false);
  for (ValueId v : candidates) candidate[v] = true;
  for (ValueId v : roots) needed[v] = true;
  std::vector<ValueId> members;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    if (!needed[*it]) continue;
    members.push_back(*it);
    for (ValueId in : graph.nodes[*it].inputs) needed[in] = needed[in] || candidate[in];
  }
  std::reverse(members.begin(), members.end());
  return members;
}

// One row kernel's source, written part by part in the order generate_cuda_row_kernel calls
// them. `lanes` threads share a row: a warp, combining through shuffles, or a block of warps (one
// row a block), combining the warps' results through shared memory after that.
class RowKernel {
 public:
  RowKernel(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
            std::string& source)
      : graph_(graph),
        step_(step),
        spec_(spec),
        s_(source),
        parts_(reduction_parts(step)),
        warp_(gpu_dialect().warp_size()),
        lanes_(warp_ * spec.row_warps),
        vector_rows_(spec.row_in_registers && spec.vectorized),
        width_(vector_rows_ ? spec.vector_width : 1),
        group_(lanes_ * width_),
        registers_(spec.row_registers),
        loads_(cuda_emit::strided_loads(spec)),
        pass_loads_(loads_),
        known_(graph.nodes.size(), false),
        columns_(step.kind == StepKind::Column),
        leader_(columns_ ? "slice == 0 && in_range" : "lane == 0") {
    if (columns_ && spec.row_in_registers)
      throw VerifierError("a column step's kernel rereads its columns in every pass");
    // With the row in registers, lane element t is column lane + lanes * t, every pass unrolled
    // so that the registers are named statically. Vectorized, the lanes take the row in groups
    // of lanes * V columns, V consecutive ones each (V = vector_width, 16 bytes of the
    // narrowest operand): element t is column lanes * V (t / V) + V lane + t % V, so each lane
    // reads (and writes) its V with one access. Every row is then whole groups.
    column_ = vector_rows_ ? absl::StrCat(group_, " * (t / ", width_, ") + ", width_,
                                          " * lane + t % ", width_)
                           : absl::StrCat("lane + ", lanes_, " * t");
    // Unrolled, this folds away in all but one element of each group.
    past_row_ = vector_rows_ ? absl::StrCat("t % ", width_, " == 0 && ", group_, " * (t / ", width_,
                                            ") >= args.columns")
                             : absl::StrCat("lane + ", lanes_, " * t >= args.columns");
    elementwise_ = parts_.prologue;
    elementwise_.insert(elementwise_.end(), parts_.epilogue.begin(), parts_.epilogue.end());
    std::sort(elementwise_.begin(), elementwise_.end());
    // Stored over the row (in the last pass), rather than once per row.
    stored_over_row_.assign(step.outputs.size(), false);
    for (size_t o = 0; o < step.outputs.size(); ++o) {
      const ValueId v = step.outputs[o];
      stored_over_row_[o] = !is_reduction(graph.nodes[v].op) && step.role_of(v) != Role::RowValue;
      stores_ |= stored_over_row_[o];
    }
  }

  // Which row this lane works on, and its lane in the row; for columns, its column and slice
  // (a lane past the last column takes part in combining, never reading or storing).
  void find_row() {
    if (columns_) {
      absl::StrAppend(&s_, "  const int lane = threadIdx.x % ", warp_, ", slice = threadIdx.x / ",
                      warp_, ";\n  const long long row = (long long)blockIdx.x * ", warp_,
                      " + lane;\n  const bool in_range = row < args.rows;\n");
    } else if (spec_.row_warps == 1) {
      absl::StrAppend(&s_, "  const long long row = (long long)blockIdx.x * (blockDim.x / ", warp_,
                      ") + threadIdx.x / ", warp_, ";\n  const int lane = threadIdx.x % ", warp_,
                      ";\n  if (row >= args.rows) return;\n");
    } else {
      s_ += "  const long long row = blockIdx.x;\n  const int lane = threadIdx.x;\n";
    }
  }

  // The lane's elements of each operand, read once into registers.
  void load_row() {
    if (!spec_.row_in_registers) return;
    absl::StrAppend(&s_, "  // The lane's elements of each operand, read once.\n");
    for (size_t k = 0; k < step_.inputs.size(); ++k) {
      absl::StrAppend(&s_, "  ", type_name(graph_.nodes[step_.inputs[k]].dtype), " row", k, "[",
                      registers_, "];\n");
      pass_loads_[k] = absl::StrCat("row", k, "[t]");
    }
    if (vector_rows_) {
      load_row_in_vectors();
      return;
    }
    absl::StrAppend(&s_, "#pragma unroll\n  for (int t = 0; t < ", registers_, "; ++t) {\n    if (",
                    past_row_, ") break;\n", "    const IDX i = (IDX)(row * args.columns + ",
                    column_, ");\n");
    s_ += cuda_emit::emit_coordinates(spec_.rank, "    ");
    for (size_t k = 0; k < step_.inputs.size(); ++k)
      absl::StrAppend(&s_, "    row", k, "[t] = ",
                      spec_.periods_are_rows && spec_.inputs[k] == OperandAccess::Repeated
                          ? absl::StrCat("in", k, "[", column_, "]")
                          : loads_[k],
                      ";\n");
    s_ += "  }\n";
  }

  // With the row in registers, the values the last pass reads from the last reduction's pass
  // (softmax's exponentials) are kept there too rather than computed again, while the operands
  // and kept values together fit the register budget.
  void choose_carried() {
    if (!spec_.row_in_registers || !stores_) return;
    const ValueId last_reduction = parts_.reductions.back();
    std::vector<bool> read_after(graph_.nodes.size(), false);
    for (ValueId m : elementwise_)
      if (m > last_reduction)
        for (ValueId in : graph_.nodes[m].inputs) read_after[in] = true;
    for (ValueId v : step_.outputs) read_after[v] = true;
    for (ValueId m : elementwise_)
      if (m < last_reduction && read_after[m] && graph_.nodes[m].op != Op::Const)
        carried_.push_back(m);
    if (step_.inputs.size() + carried_.size() > static_cast<size_t>(kCudaRowRegisterInputs))
      carried_.clear();
    for (ValueId m : carried_)
      absl::StrAppend(&s_, "  ", type_name(compute_dtype(graph_.nodes[m].dtype)), " kept", m, "[",
                      registers_, "];\n");
  }

  // Row values, once per row, as soon as the reductions they read are known (with the scalar
  // constants they read, each declared once); a stored one is stored by lane 0.
  void emit_ready_row_values() {
    std::vector<ValueId> ready;
    for (; next_row_value_ < parts_.row_values.size(); ++next_row_value_) {
      const ValueId v = parts_.row_values[next_row_value_];
      bool operands_known = true;
      for (ValueId in : graph_.nodes[v].inputs)
        operands_known &= known_[in] || is_scalar_constant(graph_.nodes[in]);
      if (!operands_known) break;  // topological order: the rest read later reductions
      for (ValueId in : graph_.nodes[v].inputs)
        if (is_scalar_constant(graph_.nodes[in]) && !known_[in]) {
          ready.push_back(in);
          known_[in] = true;
        }
      ready.push_back(v);
      known_[v] = true;
    }
    s_ += cuda_emit::emit_members(graph_, {}, ready, {}, "  ", step_.round_each_op);
    for (size_t o = 0; o < step_.outputs.size(); ++o) {
      const ValueId v = step_.outputs[o];
      if (step_.role_of(v) != Role::RowValue ||
          std::find(ready.begin(), ready.end(), v) == ready.end())
        continue;
      const char* type = type_name(graph_.nodes[v].dtype);
      absl::StrAppend(&s_, "  if (", leader_, ") ((", type, "*)args.out[", o, "])[row] = lf_store<",
                      type, ">(v", v, ");\n");
    }
  }

  // Reduction k: a pass over the row into the lane's accumulators, then the row's combined.
  void reduce(size_t k) {
    const ValueId r = parts_.reductions[k];
    const Node& node = graph_.nodes[r];
    const ValueId operand = node.inputs[0];
    const DType acc = step_accumulator(graph_, step_, node);
    const char* a = type_name(acc);
    const std::string combine = absl::StrCat("lf_combine", k);
    const bool last = r == parts_.reductions.back();
    // The members before the reduction that it (and on the last pass, the kept values) needs:
    // a pass emits nothing it does not use, which keeps big row kernels quick to compile.
    std::vector<ValueId> earlier, roots = {operand};
    for (ValueId m : elementwise_)
      if (m < r) earlier.push_back(m);
    if (last) roots.insert(roots.end(), carried_.begin(), carried_.end());
    const std::vector<ValueId> before = needed_members(graph_, earlier, roots);
    // A lane's elements of a row in registers go to parts_per_lane independent accumulators by
    // position, combined in order after the pass: chains of additions short enough for their
    // latency to hide, in the same order on every run (as the fused reduction's).
    const std::string identity =
        absl::StrCat("(", a, ")(", cuda_emit::reduction_identity(node.op, acc), ")");
    const int parts_per_lane = spec_.row_in_registers ? std::min(registers_, 4) : 1;
    const std::string into = parts_per_lane > 1
                                 ? absl::StrCat("acc", k, "_part[t % ", parts_per_lane, "]")
                                 : absl::StrCat("acc", k);
    absl::StrAppend(&s_, "  ", a, " acc", k, " = ", identity, ";\n");
    if (parts_per_lane > 1)
      absl::StrAppend(&s_, "  ", a, " acc", k, "_part[", parts_per_lane,
                      "];\n#pragma unroll\n  for (int p = 0; p < ", parts_per_lane, "; ++p) acc", k,
                      "_part[p] = ", identity, ";\n");
    absl::StrAppend(&s_, pass_head(before, step_.inputs), "    ", into, " = ", combine, "(", into,
                    ", (", a, ")v", operand, ");\n");
    if (last)
      for (ValueId m : carried_) absl::StrAppend(&s_, "    kept", m, "[t] = v", m, ";\n");
    s_ += "  }\n";
    if (parts_per_lane > 1)
      absl::StrAppend(&s_, "#pragma unroll\n  for (int p = 0; p < ", parts_per_lane, "; ++p) acc",
                      k, " = ", combine, "(acc", k, ", acc", k, "_part[p]);\n");
    combine_lanes(k, a, combine);
    if (reduction_meaning(node.op).finish == ReductionFinish::DivideByCount)
      // In the accumulator's type: a float32 one divided by the double divisor would divide in
      // float64 (two dozen instructions, once a warp, for a warp's 512 elements of a row).
      absl::StrAppend(&s_, "  acc", k, " = acc", k, " / (", a, ")args.divisor;\n");
    finish_reduction(k, r, node);
    known_[r] = true;
  }

  // The last pass stores what is stored besides the reductions, reading the kept values.
  void store_row() {
    if (next_row_value_ < parts_.row_values.size())
      throw VerifierError(absl::StrCat("row value %", parts_.row_values[next_row_value_],
                                       " reads a value the row kernel has per element only"));
    if (!stores_) return;
    std::vector<ValueId> inputs = step_.inputs, members;
    for (ValueId m : carried_) {
      inputs.push_back(m);
      pass_loads_.push_back(absl::StrCat("kept", m, "[t]"));
    }
    std::vector<ValueId> stored;
    for (size_t o = 0; o < step_.outputs.size(); ++o)
      if (stored_over_row_[o]) stored.push_back(step_.outputs[o]);
    for (ValueId m : elementwise_)
      if (std::find(carried_.begin(), carried_.end(), m) == carried_.end()) members.push_back(m);
    members = needed_members(graph_, members, stored);
    // Vectorized, each output's elements of a group are stored at once.
    for (size_t k = 0; vector_rows_ && k < step_.outputs.size(); ++k)
      if (stored_over_row_[k])
        absl::StrAppend(&s_, "  lf_vec<", type_name(graph_.nodes[step_.outputs[k]].dtype), ", ",
                        width_, "> y", k, ";\n");
    s_ += pass_head(members, inputs, reciprocals_for(members));
    for (size_t k = 0; k < step_.outputs.size(); ++k) {
      if (!stored_over_row_[k]) continue;
      const char* type = type_name(graph_.nodes[step_.outputs[k]].dtype);
      if (vector_rows_) {
        absl::StrAppend(&s_, "    y", k, ".v[t % ", width_, "] = lf_store<", type, ">(v",
                        step_.outputs[k], ");\n    if (t % ", width_, " == ", width_ - 1,
                        ") *(lf_vec<", type, ", ", width_, ">*)((", type, "*)args.out[", k,
                        "] + i - ", width_ - 1, ") = y", k, ";\n");
      } else {
        absl::StrAppend(&s_, "    ((", type, "*)args.out[", k, "])[i] = lf_store<", type, ">(v",
                        step_.outputs[k], ");\n");
      }
    }
    s_ += "  }\n";
  }

 private:
  // load_row, vectorized: each lane reads its width_ elements of a group with one access.
  void load_row_in_vectors() {
    absl::StrAppend(&s_, "#pragma unroll\n  for (int t = 0; t < ", registers_, "; t += ", width_,
                    ") {\n    if (", group_, " * (t / ", width_,
                    ") >= args.columns) break;\n    const IDX i = (IDX)(row * args.columns + ",
                    group_, " * (t / ", width_, ") + ", width_, " * lane);\n");
    for (size_t k = 0; k < step_.inputs.size(); ++k) {
      const char* type = type_name(graph_.nodes[step_.inputs[k]].dtype);
      if (spec_.inputs[k] == OperandAccess::Broadcast) {
        absl::StrAppend(&s_, "#pragma unroll\n    for (int l = 0; l < ", width_, "; ++l) row", k,
                        "[t + l] = in", k, "[0];\n");
        continue;
      }
      const std::string at =
          spec_.inputs[k] != OperandAccess::Repeated ? std::string("i")
          : spec_.periods_are_rows
              ? absl::StrCat("(IDX)(", group_, " * (t / ", width_, ") + ", width_, " * lane)")
              : absl::StrCat("i % (IDX)args.stride[", k, "][0]");
      const std::string vec = absl::StrCat("lf_vec<", type, ", ", width_, ">");
      absl::StrAppend(&s_, "    const ", vec, " x", k, " = *(const ", vec, "*)(in", k, " + ", at,
                      ");\n#pragma unroll\n    for (int l = 0; l < ", width_, "; ++l) row", k,
                      "[t + l] = x", k, ".v[l];\n");
    }
    s_ += "  }\n";
  }

  // The head of a pass over the row computing `members`, which the caller closes.
  std::string pass_head(const std::vector<ValueId>& members, const std::vector<ValueId>& inputs,
                        const cuda_emit::Reciprocals& reciprocals = {}) const {
    std::string p;
    if (spec_.row_in_registers) {
      absl::StrAppend(&p, "#pragma unroll\n  for (int t = 0; t < ", registers_,
                      "; ++t) {\n    if (", past_row_, ") break;\n",
                      "    const IDX i = (IDX)(row * args.columns + ", column_, ");\n");
    } else if (columns_) {
      absl::StrAppend(
          &p, "#pragma unroll 4\n  for (long long j = slice; in_range && j < args.columns; j += ",
          spec_.row_warps, ") {\n    const IDX i = (IDX)(j * args.rows + row);\n");
    } else {
      absl::StrAppend(&p, "#pragma unroll 4\n  for (long long j = lane; j < args.columns; j += ",
                      lanes_, ") {\n    const IDX i = (IDX)(row * args.columns + j);\n");
    }
    p += cuda_emit::emit_coordinates(spec_.rank, "    ");
    p += cuda_emit::emit_members(graph_, inputs, members, pass_loads_, "    ", step_.round_each_op,
                                 reciprocals);
    return p;
  }

  // Accumulator k combined over the warp through shuffles, then over the block's warps through
  // shared memory (an array per reduction, so none is overwritten while another warp still
  // reads it), in warp order by every lane.
  void combine_lanes(size_t k, const char* a, const std::string& combine) {
    const std::string acc = absl::StrCat("acc", k);
    if (columns_) {
      // A column's slices, in slice order, by each of its lanes.
      absl::StrAppend(&s_, "  __shared__ ", a, " slice_acc", k, "[", spec_.row_warps, "][", warp_,
                      "];\n  slice_acc", k, "[slice][lane] = ", acc, ";\n  __syncthreads();\n  ",
                      acc, " = slice_acc", k, "[0][lane];\n  for (int w = 1; w < ", spec_.row_warps,
                      "; ++w) ", acc, " = ", combine, "(", acc, ", slice_acc", k, "[w][lane]);\n");
      return;
    }
    absl::StrAppend(&s_, "  for (int offset = ", warp_ / 2, "; offset > 0; offset /= 2) ", acc,
                    " = ", combine, "(", acc, ", ", gpu_dialect().shuffle_xor(acc, "offset"),
                    ");\n");
    if (spec_.row_warps == 1) return;
    absl::StrAppend(&s_, "  __shared__ ", a, " warp_acc", k, "[", spec_.row_warps,
                    "];\n  if (lane % ", warp_, " == 0) warp_acc", k, "[lane / ", warp_, "] = acc",
                    k, ";\n  __syncthreads();\n  acc", k, " = warp_acc", k,
                    "[0];\n  for (int w = 1; w < ", spec_.row_warps, "; ++w) acc", k, " = ",
                    combine, "(acc", k, ", warp_acc", k, "[w]);\n");
  }

  // The row's result of reduction k (node r), rounded to the reduction's dtype exactly as a
  // stored one would be; read in the kernel as that, or, a half value rounding only at stores,
  // in float32 (a LayerNorm's mean rounded to bfloat16 would cost its outputs several units in
  // their last place). Lane 0 stores it where the step stores it.
  void finish_reduction(size_t k, ValueId r, const Node& node) {
    const char* result_type = type_name(node.dtype);
    const bool kept_unrounded = !step_.round_each_op && is_half(node.dtype);
    const char* compute_type = type_name(compute_dtype(node.dtype));
    const bool stored =
        std::find(step_.outputs.begin(), step_.outputs.end(), r) != step_.outputs.end();
    if (stored || !kept_unrounded)
      absl::StrAppend(&s_, "  const ", result_type, " total", k, " = lf_store<", result_type,
                      ">(acc", k, ");\n");
    absl::StrAppend(&s_, "  const ", compute_type, " v", r, " = ",
                    kept_unrounded ? absl::StrCat("(", compute_type, ")acc", k)
                                   : absl::StrCat("lf_load(total", k, ")"),
                    ";\n");
    for (size_t o = 0; o < step_.outputs.size(); ++o)
      if (step_.outputs[o] == r)
        absl::StrAppend(&s_, "  if (", leader_, ") ((", result_type, "*)args.out[", o,
                        "])[row] = total", k, ";\n");
  }

  // A half value divided by a value of its row (softmax's sum), rounding at stores, is
  // multiplied by the row's reciprocal: one multiplication an element instead of a division.
  cuda_emit::Reciprocals reciprocals_for(const std::vector<ValueId>& members) {
    cuda_emit::Reciprocals reciprocals;
    std::vector<bool> has_reciprocal(graph_.nodes.size(), false);
    for (ValueId m : members) {
      const Node& node = graph_.nodes[m];
      if (step_.round_each_op || node.op != Op::Div || !is_half(node.dtype)) continue;
      const ValueId divisor = node.inputs[1];
      const Node& d = graph_.nodes[divisor];
      if (!known_[divisor] || is_scalar_constant(d) || d.dtype != node.dtype) continue;
      const std::string name = absl::StrCat("reciprocal", divisor);
      if (!has_reciprocal[divisor])
        absl::StrAppend(&s_, "  const float ", name, " = __frcp_rn(v", divisor, ");\n");
      has_reciprocal[divisor] = true;
      reciprocals.emplace_back(m, name);
    }
    return reciprocals;
  }

  const Graph& graph_;
  const Step& step_;
  const CudaElementwiseSpec& spec_;
  std::string& s_;
  const ReductionParts parts_;
  const int warp_, lanes_;
  const bool vector_rows_;
  const int width_, group_, registers_;
  std::string column_, past_row_;
  const std::vector<std::string> loads_;
  std::vector<std::string> pass_loads_;
  std::vector<ValueId> elementwise_, carried_;
  std::vector<bool> stored_over_row_;
  bool stores_ = false;
  std::vector<bool> known_;
  size_t next_row_value_ = 0;
  const bool columns_;  // a column step: a lane a column, the block's warps slices of it
  const char* leader_;  // the lane that stores a row's (or column's) values
};

}  // namespace

void choose_cuda_row_layout(CudaElementwiseLaunch& plan, int64_t columns, size_t inputs,
                            bool outputs_aligned) {
  CudaElementwiseSpec& spec = plan.spec;
  // Measured on the H200 (docs/bench/2026-12-04-2135-h200-rows.md, docs/benchmarks.md): a warp a
  // row of 4096 reread its row from memory in every pass, at a third of the copy roof; a block a
  // row keeps it in registers. Rows of 1024 four-byte elements ran faster with two warps a row (16
  // elements a lane) than with one (32), and half-precision ones slower: a warp takes a row while
  // its lanes keep 64 bytes each of every operand. A bfloat16 LayerNorm's row (the row, a weight, a
  // bias: 99 registers a lane, a quarter of the threads resident) ran faster with two warps:
  // half-precision rows of more than two operands take two.
  const int64_t warp = gpu_dialect().warp_size();
  constexpr int64_t kBlockRowRegisters = 16;
  const int64_t warp_limit =
      spec.vector_width == 8 && inputs <= 2 ? kCudaRowRegisters : kBlockRowRegisters;
  spec.row_warps =
      columns <= warp * warp_limit
          ? 1
          : static_cast<int>(std::min<int64_t>(
                32, std::bit_ceil(static_cast<uint64_t>((columns + warp * kBlockRowRegisters - 1) /
                                                        (warp * kBlockRowRegisters)))));
  const int64_t lanes = warp * spec.row_warps;
  const int64_t per_lane = (columns + lanes - 1) / lanes;
  const int64_t limit = spec.row_warps == 1 ? warp_limit : kBlockRowRegisters;
  spec.row_in_registers =
      per_lane <= limit && inputs <= static_cast<size_t>(kCudaRowRegisterInputs);
  // The plan's width is 16 bytes of the narrowest operand; half of it where the row is whole
  // groups of that only.
  int width = spec.vector_width;
  if (columns % (lanes * width) != 0 && width == 8) width = 4;
  spec.vectorized =
      spec.vectorized && spec.row_in_registers && columns % (lanes * width) == 0 && outputs_aligned;
  spec.vector_width = spec.vectorized ? width : 4;
  bool repeated = false, whole_rows = true;
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    if (spec.inputs[k] != OperandAccess::Repeated) continue;
    repeated = true;
    whole_rows = whole_rows && spec.rank == 1 && plan.strides[k][0] == columns;
  }
  spec.periods_are_rows = spec.row_in_registers && repeated && whole_rows;
  // Registers for the lane's elements, a power of two (fewer kernels) of at least a vector.
  spec.row_registers = static_cast<int>(
      std::min<int64_t>(limit, std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(
                                   per_lane, spec.vectorized ? spec.vector_width : 1)))));
}

void choose_cuda_column_layout(CudaElementwiseLaunch& plan) {
  CudaElementwiseSpec& spec = plan.spec;
  spec.row_warps = static_cast<int>(kCudaColumnSlices);
  spec.row_in_registers = false;
  spec.vectorized = false;
  spec.vector_width = 4;
  spec.periods_are_rows = false;
}

int64_t cuda_column_step_blocks(int64_t columns) {
  const int64_t warp = gpu_dialect().warp_size();
  return (columns + warp - 1) / warp;
}

int cuda_row_threads(const CudaElementwiseSpec& spec) {
  return spec.row_warps == 1 ? kCudaReduceThreads : gpu_dialect().warp_size() * spec.row_warps;
}

int64_t cuda_row_blocks(const CudaElementwiseSpec& spec, int64_t rows) {
  if (spec.row_warps > 1) return rows;
  const int64_t rows_per_block = kCudaReduceThreads / gpu_dialect().warp_size();
  return (rows + rows_per_block - 1) / rows_per_block;
}

CudaSource generate_cuda_row_kernel(const Graph& graph, const Step& step,
                                    const CudaElementwiseSpec& spec, bool fast_math) {
  const ReductionParts parts = reduction_parts(step);
  const char* walked = step.kind == StepKind::Column ? "column" : "row";
  std::string preamble, names;
  for (size_t k = 0; k < parts.reductions.size(); ++k) {
    const Node& node = graph.nodes[parts.reductions[k]];
    preamble += cuda_emit::reduction_preamble(node.op, step_accumulator(graph, step, node),
                                              absl::StrCat("lf_combine", k));
    absl::StrAppend(&names, k ? ", then " : "", op_name(node.op));
  }
  CudaSource source = cuda_emit::begin_row_kernel(
      graph, step, spec, fast_math, preamble,
      absl::StrCat(names, " over each ", walked, ", then ", parts.epilogue.size(),
                   " fused nodes over the ", walked, " again"),
      [&](ArgLayout& layout) { add_row_fields(layout, static_cast<int>(step.outputs.size())); },
      cuda_row_threads(spec));
  RowKernel row(graph, step, spec, source.source);
  row.find_row();
  row.load_row();
  row.choose_carried();
  row.emit_ready_row_values();
  for (size_t k = 0; k < parts.reductions.size(); ++k) {
    row.reduce(k);
    row.emit_ready_row_values();
  }
  row.store_row();
  source.source += "}\n";
  return source;
}

}  // namespace lazyfuse
