// The CPU backend: each compute step of a schedule on the host.
#include "lazyfuse/runtime/cpu/cpu_backend.h"

#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lazyfuse/codegen/cpu/cpu_jit.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/codegen/cpu/cpu_row_program.h"
#include "lazyfuse/codegen/kernel_plan.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/runtime/backend.h"
#include "lazyfuse/runtime/cpu/openmp.h"
#include "lazyfuse/runtime/host_memory.h"
#include "lazyfuse/runtime/stats.h"

namespace lazyfuse {
namespace {

// Elements per parallel task: large enough to amortise scheduling, small enough to balance.
constexpr int64_t kTaskElements = 16 * 1024;

// An elementwise step ready to run: its program, its operands, its results allocated.
struct PreparedProgram {
  std::shared_ptr<const CpuProgram> program;
  std::vector<CpuOperand> operands;
  std::vector<CpuResult> results;
};

PreparedProgram prepare_elementwise(const Graph& graph, const Step& step, ValueBuffers& values,
                                    std::shared_ptr<const CpuProgram>* memo) {
  PreparedProgram prepared;
  prepared.program = memo != nullptr ? *memo : nullptr;
  if (prepared.program == nullptr) {
    prepared.program = std::make_shared<const CpuProgram>(CpuProgram::compile(graph, step));
    if (memo != nullptr) *memo = prepared.program;
  }
  for (ValueId v : step.inputs) {
    const BufferView& in = *values[v];
    prepared.operands.push_back(
        make_cpu_operand(in.data(), in.dtype, in.shape, in.strides, step.shape));
  }
  for (ValueId v : step.outputs) {
    const Node& node = graph.nodes[v];
    // An output the evaluator bound already is written where it lies (Note [Writing an update
    // into its own buffer] in runtime/lazy.cc).
    if (!values[v]) values[v] = allocate_buffer(node.device, node.dtype, node.shape);
    prepared.results.push_back({values[v]->data(), node.dtype,
                                worth_streaming(numel(node.shape) * dtype_size(node.dtype))});
  }
  return prepared;
}

void run_elementwise(const Graph& graph, const Step& step, ValueBuffers& values,
                     std::shared_ptr<const CpuProgram>* memo = nullptr) {
  const PreparedProgram prepared = prepare_elementwise(graph, step, values, memo);
  const CpuProgram& program = *prepared.program;
  const std::vector<CpuOperand>& operands = prepared.operands;
  const std::vector<CpuResult>& results = prepared.results;
  const int64_t total = program.numel();
  const int64_t tasks = (total + kTaskElements - 1) / kTaskElements;
  const size_t scratch_bytes = program.scratch_bytes();
  auto run_range = [&](int64_t first_task, int64_t last_task) {
    const size_t size = (std::max<size_t>(scratch_bytes, 64) + 63) / 64 * 64;
    std::unique_ptr<std::byte, decltype(&std::free)> scratch(
        static_cast<std::byte*>(std::aligned_alloc(64, size)), &std::free);
    if (scratch == nullptr)
      throw OutOfMemoryError(absl::StrCat("out of host memory for ", size,
                                          " bytes of an elementwise program's registers"));
    program.clear_scratch(scratch.get(), total);
    for (int64_t t = first_task; t < last_task; ++t) {
      program.run(operands, results, t * kTaskElements, std::min(total, (t + 1) * kTaskElements),
                  scratch.get());
    }
  };
  if (tasks <= 1) {
    run_range(0, tasks);
    return;
  }
  ParallelFailure failure;
#pragma omp parallel
  {
    int threads = omp_get_num_threads();
    int me = omp_get_thread_num();
    // Contiguous ranges per thread: each thread streams through its own part of memory.
    int64_t per = (tasks + threads - 1) / threads;
    try {
      run_range(std::min(tasks, me * per), std::min(tasks, (me + 1) * per));
    } catch (...) {
      failure.capture();
    }
  }
  failure.rethrow_if_any();
}

// A reduction step's parts (split_reduction_step) and each part's compiled program (an
// elementwise part's, or a fused reduction's prologue), kept for every later run of the schedule:
// splitting and compiling cost more than a small step's work.
struct CpuReductionCache : StepCache {
  bool split = false;
  std::vector<Step> parts;
  std::vector<std::shared_ptr<const CpuProgram>> programs;  // one per part; null until compiled
  std::optional<Graph> widened;  // carried_in_float32's graph, where it differs
  int64_t row_length = 0;        // row_length(), 0 where the step is not a row step
  // The step's row program (Note [Row programs] in codegen/cpu/cpu_row_program.cc), once its parts'
  // programs are compiled: null where it has none.
  bool row_program_checked = false;
  std::shared_ptr<CpuRowProgram> row_program;
};

// Rounding half values only at stores (Note [Half precision in fused kernels] in
// ir/half_rounding.h), the half values a reduction step computes and does not store (a LayerNorm's
// mean and centred values, a softmax's exponentials and their sum) stay float32 between its
// parts, as in the GPU's row kernel: the parts run over a copy of the graph with those values
// typed float32, so that what the parts hand each other is stored as float32 too. A value is
// widened only where that changes no reading of it: every op of the step that reads it has its
// dtype or is a reduction (an op reading a half value into another dtype reads it as stored,
// rounded, which a float32 type would skip). Casts, constants and generators keep their half
// type, which they round to under either policy.
std::optional<Graph> carried_in_float32(const Graph& graph, const Step& step) {
  if (step.round_each_op) return std::nullopt;
  std::vector<bool> in_step(graph.nodes.size(), false), widen(graph.nodes.size(), false);
  for (ValueId v : step.nodes) in_step[v] = true;
  for (ValueId v : step.nodes) {
    const Node& node = graph.nodes[v];
    widen[v] = is_half(node.dtype) && node.op != Op::Cast && node.op != Op::Const &&
               !is_generator(node.op) &&
               std::find(step.outputs.begin(), step.outputs.end(), v) == step.outputs.end();
  }
  for (ValueId v : step.nodes) {
    const Node& reader = graph.nodes[v];
    for (ValueId in : reader.inputs)
      if (in_step[in] && reader.dtype != graph.nodes[in].dtype && !is_reduction(reader.op))
        widen[in] = false;
  }
  std::optional<Graph> widened;
  for (ValueId v : step.nodes) {
    if (!widen[v]) continue;
    if (!widened) {
      // The parts read only the step's nodes and its inputs: the rest of the graph is left out
      // (empty nodes keep the ids), so the copy costs the step's size, not the graph's.
      widened.emplace();
      widened->name = graph.name;
      widened->nodes.resize(graph.nodes.size());
      for (ValueId n : step.nodes) widened->nodes[n] = graph.nodes[n];
      for (ValueId n : step.inputs) widened->nodes[n] = graph.nodes[n];
      widened->outputs = graph.outputs;
    }
    widened->nodes[v].dtype = DType::Float32;
  }
  return widened;
}

// Note [Row blocks]
// A row step (a softmax, a LayerNorm: reductions over the same trailing dims, the values per row
// they give, and the work over the step's space that reads them) runs as parts, each a pass over
// the whole tensor, which would make a softmax over 64 MiB read 384 MiB from memory. Every part
// treats each row apart from the others, though: an elementwise part computes element (r, j)
// from row r of its inputs, a reduction reduces each row alone, a row value is one per row. So
// the parts run a block of rows at a time, all of them on one block before the next, each block
// on one thread: what one part stores for the next is still in that core's cache when the next
// reads it, and the step reads its input from memory about once. Each row's arithmetic is the
// same as a part at a time, so no bit changes.
//
// What a part hands the next over the step's whole space and the step does not store (a
// softmax's exponentials) lives only a block at a time: each thread has a buffer of one block's
// rows for it, which every block of the thread reuses, seen through a view whose row r is the
// buffer's row r - first. A buffer of the whole space would be written back to memory as the
// blocks move on: a softmax over 64 MiB would write 64 MiB it never reads again.

// The elements per row of a row step whose reductions all reduce the same trailing dims of its
// space; 0 where the step is not one.
int64_t row_length(const Graph& graph, const Step& step) {
  if (step.kind == StepKind::Column) return 0;
  int64_t length = 0;
  const int64_t rank = static_cast<int64_t>(step.shape.size());
  for (ValueId v : step.nodes) {
    const Node& node = graph.nodes[v];
    if (!is_reduction(node.op)) continue;
    if (graph.nodes[node.inputs[0]].shape != step.shape) return 0;
    const std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
    if (dims.empty()) return 0;
    int64_t elements = 1;
    for (size_t k = 0; k < dims.size(); ++k) {
      if (dims[k] != rank - static_cast<int64_t>(dims.size()) + static_cast<int64_t>(k)) return 0;
      elements *= step.shape[dims[k]];
    }
    if (length != 0 && elements != length) return 0;
    length = elements;
  }
  return length;
}

// Each part's elements per row of a row step of `rows` rows `length` long: the row's length for
// a part over the step's space, 1 for a part over row values; empty where a part is neither.
std::optional<std::vector<int64_t>> elements_per_row(const std::vector<Step>& parts, int64_t rows,
                                                     int64_t length) {
  std::vector<int64_t> per_row(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const int64_t elements = numel(parts[i].shape);
    if (rows == 0 || (elements != rows * length && elements != rows)) return std::nullopt;
    per_row[i] = elements / rows;
  }
  return per_row;
}

// The values one part of a row step hands a later one over the whole space that the step does
// not store and the evaluator did not bind (a softmax's exponentials): what a row step keeps
// only a block of rows, or a row, at a time.
std::vector<ValueId> handed_between_parts(const std::vector<Step>& parts,
                                          const std::vector<int64_t>& per_row, int64_t length,
                                          const Step& step, const ValueBuffers& values) {
  std::vector<ValueId> handed;
  for (size_t i = 0; i < parts.size(); ++i)
    for (ValueId v : parts[i].outputs)
      if (per_row[i] == length && parts[i].kind == StepKind::Elementwise && !values[v] &&
          std::find(step.outputs.begin(), step.outputs.end(), v) == step.outputs.end())
        handed.push_back(v);
  return handed;
}

// Elements per block of rows: up to 64K (256 KiB of float32 per value the parts hand each
// other, within a core's L2 cache), and no fewer than 16K where the step has too few rows for
// two blocks a thread of the most. Longer blocks cost less per row (each part's setup is once a
// block) and are longer runs for the prefetchers to follow: 64K ran softmax, LayerNorm and
// RMSNorm faster than 16K, and 4K slower still (docs/benchmarks.md, "CPU block programs and
// reductions").
constexpr int64_t kRowBlockElements = 64 * 1024;
constexpr int64_t kRowBlockMinElements = 16 * 1024;

// The parts of a row step, whose rows are `length` long (row_length()), a block of rows at a
// time (Note [Row blocks]); false, having done nothing, where the step is not one (length 0)
// or has too few rows for blocks to pay.
bool run_row_blocks(const Graph& graph, const std::vector<Step>& parts, const Step& step,
                    int64_t length, ValueBuffers& values,
                    std::vector<std::shared_ptr<const CpuProgram>>& programs) {
  if (length == 0) return false;
  const int64_t rows = numel(step.shape) / length;
  const int threads = std::max(1, omp_get_max_threads());
  const int64_t rows_per_block =
      std::clamp<int64_t>(rows / (2 * threads), std::max<int64_t>(1, kRowBlockMinElements / length),
                          std::max<int64_t>(1, kRowBlockElements / length));
  if (rows < 2 * rows_per_block) return false;
  const std::optional<std::vector<int64_t>> elements = elements_per_row(parts, rows, length);
  if (!elements) return false;
  const std::vector<int64_t>& per_row = *elements;
  // The values handed between parts: a block's rows of each in a buffer per thread (Note [Row
  // blocks]).
  const std::vector<ValueId> block_local =
      handed_between_parts(parts, per_row, length, step, values);
  // buffers[t][k]: thread t's block of block_local[k].
  std::vector<std::vector<BufferView>> buffers(threads);
  for (auto& mine : buffers)
    for (ValueId v : block_local)
      mine.push_back(
          allocate_buffer(graph.nodes[v].device, graph.nodes[v].dtype, {rows_per_block * length}));
  // Block-local value k as row `first` on of the whole space: its rows before `first` lie before
  // the buffer, and nothing reads them.
  auto block_view = [&](const BufferView& buffer, ValueId v, int64_t first) {
    const Node& node = graph.nodes[v];
    return BufferView{buffer.storage, buffer.offset - first * length, node.shape,
                      contiguous_strides(node.shape), node.dtype};
  };
  for (size_t k = 0; k < block_local.size(); ++k)
    values[block_local[k]] = block_view(buffers[0][k], block_local[k], 0);
  // Everything that can fail, first: compiling, allocating.
  std::vector<PreparedProgram> prepared(parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    const Step& part = parts[i];
    if (part.kind == StepKind::Elementwise) {
      prepared[i] = prepare_elementwise(graph, part, values, &programs[i]);
      // What a part stores for the next is read again while in cache: not streamed past it.
      for (size_t k = 0; k < part.outputs.size(); ++k)
        if (std::find(step.outputs.begin(), step.outputs.end(), part.outputs[k]) ==
            step.outputs.end())
          prepared[i].results[k].stream = false;
      continue;
    }
    const Node& node = graph.nodes[part.outputs[0]];
    if (part.nodes.size() > 1 && programs[i] == nullptr)
      programs[i] = compile_reduction_prologue(graph, part);
    values[part.outputs[0]] = allocate_buffer(node.device, node.dtype, node.shape);
  }
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  ParallelFailure failure;
#pragma omp parallel
  {
    // This thread's copies of the values and the programs' operands and results, whose
    // block-local entries follow the block.
    ValueBuffers local;
    std::vector<PreparedProgram> mine;
    try {
      local = values;
      mine = prepared;
    } catch (...) {
      failure.capture();  // every thread still takes its share of the loop below, skipping it
    }
    const std::vector<BufferView>& buffer = buffers[omp_get_thread_num() % threads];
#pragma omp for schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      if (failure.stopped()) continue;
      try {
        const int64_t first = block * rows_per_block, last = std::min(rows, first + rows_per_block);
        for (size_t k = 0; k < block_local.size(); ++k) {
          local[block_local[k]] = block_view(buffer[k], block_local[k], first);
          for (size_t i = 0; i < parts.size(); ++i) {
            if (parts[i].kind != StepKind::Elementwise) continue;
            for (size_t j = 0; j < parts[i].inputs.size(); ++j)
              if (parts[i].inputs[j] == block_local[k])
                mine[i].operands[j].data = local[block_local[k]]->data();
            for (size_t j = 0; j < parts[i].outputs.size(); ++j)
              if (parts[i].outputs[j] == block_local[k])
                mine[i].results[j].data = local[block_local[k]]->data();
          }
        }
        thread_local AlignedBytes scratch;
        for (size_t i = 0; i < parts.size(); ++i) {
          const Step& part = parts[i];
          if (part.kind == StepKind::Elementwise) {
            const CpuProgram& program = *mine[i].program;
            program.run(mine[i].operands, mine[i].results, first * per_row[i], last * per_row[i],
                        scratch.at_least(program.scratch_bytes()));
            continue;
          }
          const ValueId reduction = part.outputs[0];
          const Node& node = graph.nodes[reduction];
          if (part.nodes.size() == 1)
            cpu_reduce(node, *local[node.inputs[0]], RowRange{first, last}, local[reduction]);
          else
            cpu_fused_reduce(graph, part, local, &programs[i], RowRange{first, last},
                             local[reduction]);
        }
      } catch (...) {
        failure.capture();
      }
    }
  }
  failure.rethrow_if_any();
  return true;
}

// The row program of a row step (Note [Row programs] in codegen/cpu/cpu_row_program.cc), its parts'
// programs compiled here; null where the JIT could not compile one.
std::shared_ptr<CpuRowProgram> make_row_program(
    const Graph& graph, const std::vector<Step>& parts, const std::vector<int64_t>& per_row,
    int64_t length, std::vector<std::shared_ptr<const CpuProgram>>& programs) {
  std::optional<DType> dtype;
  std::vector<CpuRowProgram::Part> row_parts;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Step& part = parts[i];
    CpuRowProgram::Part row_part;
    if (is_reduction_kind(part.kind)) {
      const Node& node = graph.nodes[part.outputs[0]];
      row_part.reduction = true;
      row_part.op = node.op;
      // Reduced and reducing in one float type: the row's value is what the parts after read.
      if (graph.nodes[node.inputs[0]].dtype != node.dtype || (dtype && *dtype != node.dtype))
        return nullptr;
      dtype = node.dtype;
      if (part.nodes.size() > 1 && programs[i] == nullptr)
        programs[i] = compile_reduction_prologue(graph, part);
    } else {
      row_part.once_a_row = per_row[i] == 1;
      if (programs[i] == nullptr)
        programs[i] = std::make_shared<const CpuProgram>(CpuProgram::compile(graph, part));
    }
    row_part.program = programs[i];
    row_parts.push_back(std::move(row_part));
  }
  if (dtype != DType::Float32 && dtype != DType::Float64) return nullptr;
  const bool double_precision = dtype == DType::Float64;
  if (!CpuRowProgram::fits(row_parts, length, double_precision)) return nullptr;
  return CpuRowProgram::shared(std::move(row_parts), length, numel(parts.front().shape),
                               double_precision);
}

// Elements of a row program's rows per parallel item.
constexpr int64_t kRowProgramTaskElements = 16 * 1024;

// A row step through its row program: every part of a row before the next row, rows across the
// threads. The values one part hands another over the whole space that the step does not store
// (a softmax's exponentials) are kept a row at a time in a buffer of each thread's, never
// allocated whole. False, having computed nothing, where the step has no row program or it is
// not compiled (the JIT not yet hot, or an operand it cannot read where it lies).
bool run_row_program(const Graph& graph, const std::vector<Step>& parts, const Step& step,
                     int64_t length, ValueBuffers& values, CpuReductionCache& cache) {
  if (length == 0 || length % 16 != 0) return false;
  const int64_t rows = numel(step.shape) / length;
  const std::optional<std::vector<int64_t>> elements = elements_per_row(parts, rows, length);
  if (!elements) return false;
  const std::vector<int64_t>& per_row = *elements;
  if (!cache.row_program_checked) {
    cache.row_program = make_row_program(graph, parts, per_row, length, cache.programs);
    cache.row_program_checked = true;
  }
  if (cache.row_program == nullptr || !cache.row_program->ready(numel(step.shape))) return false;
  // The kept values: each a row at a time in a buffer of the thread's.
  const std::vector<ValueId> kept_values =
      handed_between_parts(parts, per_row, length, step, values);
  auto kept = [&](ValueId v) {
    const auto at = std::find(kept_values.begin(), kept_values.end(), v);
    return at == kept_values.end() ? -1 : static_cast<int>(at - kept_values.begin());
  };
  // What each part reads and writes; the results allocated (an output the evaluator bound is
  // written where it lies: Note [Writing an update into its own buffer] in runtime/lazy.cc).
  std::vector<CpuRowProgram::PartData> data(parts.size());
  std::vector<std::vector<CpuOperand>> operands(parts.size());
  std::vector<std::vector<CpuResult>> results(parts.size());
  int scratches = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Step& part = parts[i];
    CpuRowProgram::PartData& part_data = data[i];
    const bool plain_reduction = is_reduction_kind(part.kind) && part.nodes.size() == 1;
    const std::vector<ValueId> inputs =
        plain_reduction ? std::vector<ValueId>{graph.nodes[part.outputs[0]].inputs[0]}
                        : part.inputs;
    for (ValueId v : inputs) {
      part_data.operand_kept.push_back(kept(v));
      if (kept(v) >= 0) {
        // Read a row at a time from the thread's buffer: no memory of the whole space.
        operands[i].push_back(CpuOperand{nullptr, graph.nodes[v].dtype, {numel(part.shape)}, {1}});
        continue;
      }
      const BufferView& in = *values[v];
      operands[i].push_back(
          make_cpu_operand(in.data(), in.dtype, in.shape, in.strides, part.shape));
    }
    part_data.operands = operands[i];
    if (is_reduction_kind(part.kind)) {
      const Node& node = graph.nodes[part.outputs[0]];
      if (!values[part.outputs[0]])
        values[part.outputs[0]] = allocate_buffer(node.device, node.dtype, node.shape);
      part_data.row_values = values[part.outputs[0]]->data();
      // A row for its operand's values to wait in, after the kept values' rows.
      if (!plain_reduction)
        part_data.scratch_kept = static_cast<int>(kept_values.size()) + scratches++;
      continue;
    }
    for (ValueId v : part.outputs) {
      const Node& node = graph.nodes[v];
      part_data.result_kept.push_back(kept(v));
      if (kept(v) >= 0) {
        results[i].push_back(CpuResult{nullptr, node.dtype, false});
        continue;
      }
      if (!values[v]) values[v] = allocate_buffer(node.device, node.dtype, node.shape);
      results[i].push_back({values[v]->data(), node.dtype,
                            worth_streaming(numel(node.shape) * dtype_size(node.dtype))});
    }
    part_data.results = results[i];
  }
  const CpuRowProgram::Bound bound = cache.row_program->bind(data);
  if (bound.kernel == nullptr) return false;
  const int64_t rows_per_task = std::max<int64_t>(1, kRowProgramTaskElements / length);
  const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
  const size_t element_bytes = dtype_size(graph.nodes[parts.front().outputs[0]].dtype);
  // Each kept value's row, five cache lines past the previous one's (so that the same element of
  // two is never 4 KiB apart, where a load after a store to the other waits for it).
  const size_t kept_stride = (static_cast<size_t>(length) * element_bytes + 63) / 64 * 64 + 5 * 64;
  auto run_tasks = [&](int64_t first_task, int64_t last_task) {
    thread_local AlignedBytes kept_rows;
    std::vector<const void*> task_operands = bound.operands;
    std::vector<void*> task_results = bound.results;
    std::byte* rows_of_kept = kept_rows.at_least(
        kept_stride * (kept_values.size() + static_cast<size_t>(scratches)) + 64);
    for (const auto& [index, value] : bound.kept_operands)
      task_operands[index] = rows_of_kept + kept_stride * static_cast<size_t>(value);
    for (const auto& [index, value] : bound.kept_results)
      task_results[index] = rows_of_kept + kept_stride * static_cast<size_t>(value);
    const int64_t first = std::min(rows, first_task * rows_per_task);
    const int64_t last = std::min(rows, last_task * rows_per_task);
    if (first < last)
      bound.kernel(task_operands.data(), task_results.data(), first * length, last * length);
    // Non-temporal stores are weakly ordered: make them visible before the caller goes on.
    if (bound.streams) _mm_sfence();
    count_cpu_jit_run();
  };
  if (tasks <= 1) {
    run_tasks(0, tasks);
    return true;
  }
  ParallelFailure failure;
#pragma omp parallel
  {
    const int threads = omp_get_num_threads(), me = omp_get_thread_num();
    // Contiguous ranges of rows per thread: each thread streams through its own part of memory.
    const int64_t per = (tasks + threads - 1) / threads;
    try {
      run_tasks(std::min(tasks, me * per), std::min(tasks, (me + 1) * per));
    } catch (...) {
      failure.capture();
    }
  }
  failure.rethrow_if_any();
  return true;
}

// A reduction step, one reduction at a time (through the members it reads, when there are
// any), then what is stored besides the reductions, as an elementwise program that reads them;
// a row step a block of rows at a time (Note [Row blocks]).
void run_reduction(const Graph& step_graph, const Step& step, ValueBuffers& values,
                   CpuReductionCache* cache) {
  std::vector<Step> uncached;
  std::optional<Graph> uncached_widened;
  if (cache != nullptr && !cache->split) {
    cache->parts = split_reduction_step(step_graph, step);
    cache->programs.assign(cache->parts.size(), nullptr);
    cache->widened = carried_in_float32(step_graph, step);
    cache->row_length = cache->parts.size() > 1 ? row_length(step_graph, step) : 0;
    cache->split = true;
  } else if (cache == nullptr) {
    uncached = split_reduction_step(step_graph, step);
    uncached_widened = carried_in_float32(step_graph, step);
  }
  const std::vector<Step>& parts = cache != nullptr ? cache->parts : uncached;
  const std::optional<Graph>& widened = cache != nullptr ? cache->widened : uncached_widened;
  const Graph& graph = widened ? *widened : step_graph;
  std::vector<std::shared_ptr<const CpuProgram>> uncached_programs(parts.size());
  std::vector<std::shared_ptr<const CpuProgram>>& programs =
      cache != nullptr ? cache->programs : uncached_programs;
  // Whether the step is a row step, found once per cached schedule.
  const int64_t length = cache != nullptr      ? cache->row_length
                         : uncached.size() > 1 ? row_length(step_graph, step)
                                               : 0;
  const bool blocked =
      (cache != nullptr && run_row_program(graph, parts, step, length, values, *cache)) ||
      run_row_blocks(graph, parts, step, length, values, programs);
  for (size_t i = 0; i < parts.size() && !blocked; ++i) {
    const Step& part = parts[i];
    std::shared_ptr<const CpuProgram>* program = &programs[i];
    if (part.kind == StepKind::Elementwise) {
      run_elementwise(graph, part, values, program);
      continue;
    }
    const ValueId reduction = part.outputs[0];
    const Node& node = graph.nodes[reduction];
    values[reduction] = part.nodes.size() == 1 ? cpu_reduce(node, *values[node.inputs[0]])
                                               : cpu_fused_reduce(graph, part, values, program);
  }
  // What the parts stored for each other and the step does not.
  for (const Step& part : parts)
    for (ValueId v : part.outputs)
      if (std::find(step.outputs.begin(), step.outputs.end(), v) == step.outputs.end())
        values[v].reset();
}

// An elementwise step's compiled program depends on the graph and the step alone, not on the
// operands' layouts: kept for every later run of the schedule.
struct CpuStepCache : StepCache {
  std::shared_ptr<const CpuProgram> program;
};

// A group's members' caches, in member order.
struct CpuGroupCache : StepCache {
  std::vector<std::unique_ptr<StepCache>> members;
};

class CpuBackend final : public Backend {
 public:
  void run_step(const Graph& graph, const Step& step, ValueBuffers& values,
                std::unique_ptr<StepCache>* cache) override {
    const Node& node = graph.nodes[step.nodes.back()];
    // A group counts its members, which run one after another.
    if (step.kind != StepKind::Group) count_launch();
    switch (step.kind) {
      case StepKind::Elementwise: {
        std::shared_ptr<const CpuProgram>* program = nullptr;
        if (cache != nullptr) {
          if (*cache == nullptr) *cache = std::make_unique<CpuStepCache>();
          program = &static_cast<CpuStepCache&>(**cache).program;
        }
        run_elementwise(graph, step, values, program);
        return;
      }
      case StepKind::Reduction:
      case StepKind::Row:
      case StepKind::Column: {
        CpuReductionCache* reduction = nullptr;
        if (cache != nullptr) {
          if (*cache == nullptr) *cache = std::make_unique<CpuReductionCache>();
          reduction = &static_cast<CpuReductionCache&>(**cache);
        }
        run_reduction(graph, step, values, reduction);
        return;
      }
      case StepKind::Group: {
        // One launch on a GPU; here the members run one after another, each across the threads.
        CpuGroupCache* group = nullptr;
        if (cache != nullptr) {
          if (*cache == nullptr) *cache = std::make_unique<CpuGroupCache>();
          group = &static_cast<CpuGroupCache&>(**cache);
          group->members.resize(step.members.size());
        }
        // The members are independent, so the order they run in is free: the others first,
        // then the elementwise ones, whose outputs are allocated before any of them runs. So
        // once an elementwise member has written, nothing in the group can fail (Note [Writing
        // an update into its own buffer] in runtime/lazy.cc).
        for (const Step& member : step.members) {
          if (member.kind != StepKind::Elementwise) continue;
          for (ValueId v : member.outputs)
            if (!values[v])
              values[v] = allocate_buffer(graph.nodes[v].device, graph.nodes[v].dtype,
                                          graph.nodes[v].shape);
        }
        for (bool elementwise : {false, true})
          for (size_t m = 0; m < step.members.size(); ++m)
            if ((step.members[m].kind == StepKind::Elementwise) == elementwise)
              run_step(graph, step.members[m], values, group ? &group->members[m] : nullptr);
        return;
      }
      case StepKind::Matmul: {
        const ValueId product = step.first_with_role(Role::Product);
        const Node& matmul = graph.nodes[product];
        values[product] = cpu_matmul(matmul, *values[matmul.inputs[0]], *values[matmul.inputs[1]]);
        // The bias and relu fusion gave the step: one pass over the product.
        if (std::optional<MatmulEpilogue> epilogue = matmul_epilogue(graph, step)) {
          std::shared_ptr<const CpuProgram>* program = nullptr;
          if (cache != nullptr) {
            if (*cache == nullptr) *cache = std::make_unique<CpuStepCache>();
            program = &static_cast<CpuStepCache&>(**cache).program;
          }
          run_elementwise(graph, epilogue->elementwise, values, program);
          values[epilogue->matmul].reset();
        }
        return;
      }
      case StepKind::Index: {
        absl::InlinedVector<const BufferView*, 4> inputs;
        for (ValueId v : node.inputs) inputs.push_back(&*values[v]);
        values[step.nodes[0]] = cpu_index(node, inputs);
        return;
      }
      case StepKind::Attention:
        cpu_attention(graph, step, values);
        return;
      case StepKind::View:
      case StepKind::Transfer:
      case StepKind::Collective:
        break;
    }
    throw VerifierError(
        "views, transfers and collectives are the executor's, not the CPU backend's");
  }

  bool runs_attention(DType, int64_t, int64_t) const override { return true; }
  void* allocate(const Device&, int64_t nbytes) override { return cpu::allocate(nbytes); }
  void release(const Device&, void* data, int64_t nbytes) override { cpu::release(data, nbytes); }

  BufferView contiguous(const BufferView& source) override { return cpu_contiguous(source); }
  bool can_copy(const Device& from, const Device& to) const override {
    return from.is_cpu() && to.is_cpu();
  }
  void copy(const void* source, const Device&, void* target, const Device&, size_t bytes) override {
    std::memcpy(target, source, bytes);
  }
  // Host work is done when the call that did it returns.
  void synchronize(const Device&) override {}

  // The host is one device, all its cores and memory.
  Device resolve(const Device& requested) override { return requested; }
  int device_count() override { return 1; }
  AllocatorStats memory_stats(int) override { return cpu::allocator_stats(); }
  void reset_peak_memory_stats(int) override { cpu::reset_peak_memory_stats(); }
  void add_counters(Stats& stats) override {
    const CpuJitStats jit = cpu_jit_stats();
    stats.cpu_programs_compiled = jit.compiled;
    stats.cpu_jit_runs = jit.runs;
  }
  void reset_counters() override { reset_cpu_jit_stats(); }
  int dlpack_device_type() const override { return 1; }  // kDLCPU
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend* backend = new CpuBackend();
  return *backend;
}

}  // namespace lazyfuse
