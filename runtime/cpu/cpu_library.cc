// The CPU's library steps: reductions (multi-threaded, deterministic), matmul through OpenBLAS,
// and contiguous copies.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/codegen/cpu/cpu_program.h"
#include "lazyfuse/codegen/cpu/cpu_reduction.h"
#include "lazyfuse/codegen/kernel_plan.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/infer.h"
#include "lazyfuse/runtime/cpu/cpu_backend.h"
#include "lazyfuse/runtime/cpu/openmp.h"

namespace lazyfuse {
namespace {

// Reduces one part of a row (at most kCpuReduceBlock elements), handed by `visit(consume)` to
// consume(values, count, stride) in runs, in order: each value goes into lane (position in the
// part) % kCpuReduceLanes of kCpuReduceLanes accumulators (CpuReduceRunFn, vector code for a
// contiguous run; a sum of float32 values through float32 stretches first), which are
// then combined in a fixed tree. The bits depend on the part's values alone, not on how they
// came in runs, so a strided operand, a contiguous one and a fused prologue's chunks all give
// the same.
template <Op kOp, typename S, typename Visit>
CpuAccumulator<kOp, S> reduce_part(CpuReduceRunFn reduce_run, Visit&& visit) {
  using Meaning = CpuReduction<kOp>;
  using Acc = CpuAccumulator<kOp, S>;
  CpuReduceState<Acc> state;
  Acc* lanes = state.lanes;
  std::fill_n(lanes, kCpuReduceLanes, reduction_identity_value<Acc>(Meaning::identity));
  std::fill_n(state.stretch, kCpuReduceLanes, 0.0f);
  int64_t position = 0;  // in the part
  visit([&](const S* values, int64_t count, int64_t stride) {
    if (stride == 1) {
      reduce_run(values, count, &state, position);
    } else {
      for (int64_t i = 0; i < count; ++i) {
        const int64_t p = position + i, l = p % kCpuReduceLanes;
        if constexpr (kCpuSumsInStretches<kOp, S>) {
          state.stretch[l] = state.stretch[l] + convert_value<float>(values[i * stride]);
          if ((p + 1) % kCpuReduceStretchSpan == 0) state.flush();
        } else {
          lanes[l] = Meaning::combine(lanes[l], convert_value<Acc>(values[i * stride]));
        }
      }
    }
    position += count;
  });
  if constexpr (kCpuSumsInStretches<kOp, S>) state.flush();
  for (int width = kCpuReduceLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] = Meaning::combine(lanes[l], lanes[l + width]);
  return lanes[0];
}

// A row's combined value finished: a mean divides by the row's `inner` elements.
template <Op kOp, typename Acc>
Acc finish_value(Acc acc, int64_t inner) {
  if constexpr (CpuReduction<kOp>::finish == ReductionFinish::DivideByCount) {
    if constexpr (std::is_floating_point_v<Acc>)
      return inner == 0 ? std::numeric_limits<Acc>::quiet_NaN() : acc / static_cast<Acc>(inner);
    else
      return inner == 0 ? Acc(0) : acc / static_cast<Acc>(inner);
  }
  return acc;
}

// A row's result from its parts' partial results, combined in order onto the identity, then
// finished.
template <Op kOp, typename S, typename Partial>
CpuAccumulator<kOp, S> finish_row(int64_t parts, int64_t inner, Partial&& partial) {
  using Meaning = CpuReduction<kOp>;
  using Acc = CpuAccumulator<kOp, S>;
  Acc acc = reduction_identity_value<Acc>(Meaning::identity);
  for (int64_t b = 0; b < parts; ++b) acc = Meaning::combine(acc, partial(b));
  return finish_value<kOp>(acc, inner);
}

// Below this many elements a reduction runs on the calling thread: opening a parallel region
// costs more than the threads save.
constexpr int64_t kParallelReduceElements = 32768;

// Reduces `outer` rows of `inner` elements each. `visit(row, begin, end, consume)` hands
// elements [begin, end) of a row to consume(values, count, stride) in runs, in order, as values
// of storage type S: read from a buffer, or computed by a fused prologue. A row is reduced in
// parts of kCpuReduceBlock elements (reduce_part), whose results are then combined (finish_row).
// Only rows [rows.begin, rows.end) on the calling thread when rows.end >= 0; otherwise every
// row, across the threads. A row's bits are the same either way.
template <typename S, typename Visit>
void reduce_rows(const Node& node, int64_t outer, int64_t inner, const BufferView& out,
                 Visit&& visit, const RowRange& rows) {
  const int64_t blocks = std::max<int64_t>(1, (inner + kCpuReduceBlock - 1) / kCpuReduceBlock);
  const bool all_rows = rows.end < 0;
  const int64_t first_row = all_rows ? 0 : rows.begin, end_row = all_rows ? outer : rows.end;
  // Rows shorter than a block go to the threads a block's worth at a time: one parallel item a
  // row made the scheduling cost more than the work on short rows (a softmax over rows of 64).
  // Each row is reduced as alone, so the grouping changes no bit.
  const int64_t parts = (end_row - first_row) * blocks;
  const int64_t parts_per_item =
      blocks == 1 ? std::max<int64_t>(1, kCpuReduceBlock / std::max<int64_t>(inner, 1)) : 1;
  const int64_t items = (parts + parts_per_item - 1) / parts_per_item;
  dispatch_reduction(node.op, [&]<Op kOp>() {
    using Acc = CpuAccumulator<kOp, S>;
    std::vector<Acc> partials(parts);
    ParallelFailure failure;  // a fused prologue's scratch can fail to allocate
    // Part p: block p % blocks of row first_row + p / blocks.
    const CpuReduceRunFn reduce_run =
        cpu_kernel_table().reduce_run[static_cast<int>(kOp)][storage_slot_of<S>()];
    auto reduce_item = [&](int64_t item) {
      for (int64_t part = item * parts_per_item;
           part < std::min(parts, (item + 1) * parts_per_item); ++part) {
        const int64_t row = first_row + part / blocks, begin = part % blocks * kCpuReduceBlock;
        partials[part] = reduce_part<kOp, S>(reduce_run, [&](auto&& consume) {
          visit(row, begin, std::min(inner, begin + kCpuReduceBlock), consume);
        });
      }
    };
    if (all_rows && outer * inner > kParallelReduceElements) {
      // A contiguous range of parts per thread, so that each thread streams through memory of
      // its own and the lines its compiled prologue asks for ahead are the ones it reads next.
      // Parts handed out one at a time alternated between the threads, and the sum of squares
      // measured slower so (docs/benchmarks.md, "CPU block programs and reductions").
#pragma omp parallel for schedule(static)
      for (int64_t item = 0; item < items; ++item) {
        if (failure.stopped()) continue;
        try {
          reduce_item(item);
        } catch (...) {
          failure.capture();
        }
      }
      failure.rethrow_if_any();
    } else {
      // On the calling thread, without opening a parallel region: a region, even one that runs
      // on one thread, costs a lock in the OpenMP runtime, and a row step's blocks (Note [Row
      // blocks] in runtime/cpu/cpu_backend.cc) call this once per part per block from every thread.
      for (int64_t item = 0; item < items; ++item) reduce_item(item);
    }
    dispatch_storage(node.dtype, [&]<typename R>() {
      R* dst = static_cast<R*>(out.data());
      for (int64_t o = first_row; o < end_row; ++o)
        dst[o] = convert_value<R>(finish_row<kOp, S>(
            blocks, inner, [&](int64_t b) { return partials[(o - first_row) * blocks + b]; }));
    });
  });
}

// Note [Column reductions]
// A sum over leading dims (a bias's gradient, a LayerNorm weight's: [B, T, C] summed to [C]) has
// rows (one per kept column) whose elements lie a whole row of the operand apart. Walked a row at
// a time, each element is a load from another cache line, a scalar addition and a division for
// its lane: the CPU's transformer step spent most of its time so. Here a tile of adjacent
// columns is reduced together instead, walking the operand's rows in memory order: each column
// keeps its own lanes and stretches (CpuReduceState's, one per column of the tile), element p of
// the column goes into lane p % kCpuReduceLanes, stretches are flushed at the same positions, and
// the lanes are combined in the same tree, so every column's bits are those reduce_rows gives it;
// only the order of the loops changes, and the loop over the tile's columns is vector code.
// A tile's rows lie a row of the operand apart, each on a page of its own once rows are longer
// than 4 KiB, and the hardware's prefetchers stay within a page: the loop asks for the tile's
// lines kColumnPrefetchRows rows ahead itself, which made a bias gradient's sum faster
// (docs/benchmarks.md, "A GPT training step on the CPU: 2026-12-07 02:28 UTC, the 2-core AMD
// EPYC machine").
constexpr int64_t kColumnTile = 64;
constexpr int64_t kColumnPrefetchRows = 8;

template <typename S>
void reduce_columns(const Node& node, const S* base, int64_t columns, int64_t inner,
                    int64_t inner_stride, const BufferView& out, const RowRange& rows) {
  const int64_t first = rows.end < 0 ? 0 : rows.begin, end = rows.end < 0 ? columns : rows.end;
  const int64_t tiles = (end - first + kColumnTile - 1) / kColumnTile;
  dispatch_reduction(node.op, [&]<Op kOp>() {
    using Meaning = CpuReduction<kOp>;
    using Acc = CpuAccumulator<kOp, S>;
    constexpr bool kStretches = kCpuSumsInStretches<kOp, S>;
    const Acc identity = reduction_identity_value<Acc>(Meaning::identity);
    auto reduce_tile = [&]<int64_t kWidth>(int64_t c0, int64_t width) {
      const int64_t w = kWidth > 0 ? kWidth : width;
      alignas(64) Acc lanes[kCpuReduceLanes][kColumnTile];
      alignas(64) float stretch[kCpuReduceLanes][kColumnTile];
      Acc total[kColumnTile];
      std::fill_n(total, w, identity);
      auto flush = [&] {
        for (int l = 0; l < kCpuReduceLanes; ++l)
          for (int64_t c = 0; c < w; ++c) {
            lanes[l][c] = static_cast<Acc>(lanes[l][c] + static_cast<Acc>(stretch[l][c]));
            stretch[l][c] = 0.0f;
          }
      };
      for (int64_t start = 0; start < inner; start += kCpuReduceBlock) {
        for (int l = 0; l < kCpuReduceLanes; ++l) {
          std::fill_n(lanes[l], w, identity);
          std::fill_n(stretch[l], w, 0.0f);
        }
        const int64_t count = std::min(kCpuReduceBlock, inner - start);
        const int64_t tile_lines = (w * static_cast<int64_t>(sizeof(S)) + 63) / 64;
        for (int64_t p = 0; p < count; ++p) {
          const S* row = base + (start + p) * inner_stride + c0;
          if (p + kColumnPrefetchRows < count) {
            const char* ahead =
                reinterpret_cast<const char*>(row + kColumnPrefetchRows * inner_stride);
            for (int64_t line = 0; line < tile_lines; ++line) __builtin_prefetch(ahead + 64 * line);
          }
          const int l = static_cast<int>(p % kCpuReduceLanes);
          if constexpr (kStretches) {
            for (int64_t c = 0; c < w; ++c)
              stretch[l][c] = stretch[l][c] + convert_value<float>(row[c]);
            if ((p + 1) % kCpuReduceStretchSpan == 0) flush();
          } else {
            for (int64_t c = 0; c < w; ++c)
              lanes[l][c] = Meaning::combine(lanes[l][c], convert_value<Acc>(row[c]));
          }
        }
        if constexpr (kStretches) flush();
        for (int half = kCpuReduceLanes / 2; half >= 1; half /= 2)
          for (int l = 0; l < half; ++l)
            for (int64_t c = 0; c < w; ++c)
              lanes[l][c] = Meaning::combine(lanes[l][c], lanes[l + half][c]);
        for (int64_t c = 0; c < w; ++c) total[c] = Meaning::combine(total[c], lanes[0][c]);
      }
      dispatch_storage(node.dtype, [&]<typename R>() {
        R* dst = static_cast<R*>(out.data()) + c0;
        for (int64_t c = 0; c < w; ++c)
          dst[c] = convert_value<R>(finish_value<kOp>(total[c], inner));
      });
    };
    auto run_tile = [&](int64_t tile) {
      const int64_t c0 = first + tile * kColumnTile, width = std::min(kColumnTile, end - c0);
      // A full tile's loops have a constant trip count, which the compiler turns into vector code.
      if (width == kColumnTile)
        reduce_tile.template operator()<kColumnTile>(c0, width);
      else
        reduce_tile.template operator()<0>(c0, width);
    };
    if (rows.end < 0 && (end - first) * inner > kParallelReduceElements && tiles > 1) {
#pragma omp parallel for schedule(static)
      for (int64_t tile = 0; tile < tiles; ++tile) run_tile(tile);
    } else {
      for (int64_t tile = 0; tile < tiles; ++tile) run_tile(tile);
    }
  });
}

}  // namespace

BufferView cpu_reduce(const Node& node, const BufferView& input, const RowRange& rows,
                      const std::optional<BufferView>& into) {
  const int64_t rank = static_cast<int64_t>(input.shape.size());
  std::vector<int64_t> dims = reduction_dims(node.attrs, rank);
  Shape outer_shape, inner_shape;
  Strides outer_strides, inner_strides;
  for (int64_t d = 0; d < rank; ++d) {
    bool reduced = std::binary_search(dims.begin(), dims.end(), d);
    (reduced ? inner_shape : outer_shape).push_back(input.shape[d]);
    (reduced ? inner_strides : outer_strides).push_back(input.strides[d]);
  }
  // Reduced dims that memory walks in order are one: a contiguous operand is one run a block.
  if (!inner_shape.empty()) {
    IterationSpace runs = merge_dims(inner_shape, {inner_strides});
    inner_shape = std::move(runs.sizes);
    inner_strides = std::move(runs.strides[0]);
  }
  BufferView out = into ? *into : allocate_buffer(node.device, node.dtype, node.shape);
  // Kept dims that memory walks in order, one element apart, and reduced dims that merge into
  // one stride: a reduction of columns (Note [Column reductions]).
  const IterationSpace kept =
      outer_shape.empty() ? IterationSpace{} : merge_dims(outer_shape, {outer_strides});
  const bool columns = kept.sizes.size() == 1 && kept.strides[0][0] == 1 &&
                       inner_shape.size() == 1 && inner_strides[0] != 1 &&
                       kept.sizes[0] >= kCpuReduceLanes;
  dispatch_storage(input.dtype, [&]<typename S>() {
    const S* base = static_cast<const S*>(input.data());
    if (columns) {
      reduce_columns<S>(node, base, kept.sizes[0], inner_shape[0], inner_strides[0], out, rows);
      return;
    }
    const int inner_rank = static_cast<int>(inner_shape.size());
    // Walks a row's elements through the strides, a run along the innermost dim at a time.
    auto visit = [&](int64_t row, int64_t begin, int64_t end, auto&& consume) {
      if (end <= begin) return;  // an empty row: its sizes include a zero, not to divide by
      int64_t offset = 0;
      for (int64_t d = static_cast<int64_t>(outer_shape.size()) - 1, rest = row; d >= 0; --d) {
        offset += (rest % outer_shape[d]) * outer_strides[d];
        rest /= outer_shape[d];
      }
      if (inner_rank == 0) {
        consume(base + offset, 1, 1);
        return;
      }
      StridedCursor cursor(inner_shape, inner_strides, begin);
      for (int64_t j = begin; j < end;) {
        const int64_t run = std::min(end - j, cursor.run_left());
        consume(base + offset + cursor.offset(), run, cursor.inner_stride());
        j += run;
        cursor.advance(run);
      }
    };
    reduce_rows<S>(node, numel(outer_shape), numel(inner_shape), out, visit, rows);
  });
  return out;
}

std::shared_ptr<const CpuProgram> compile_reduction_prologue(const Graph& graph, const Step& step) {
  const ValueId reduction = step.outputs[0];
  Step prologue = step;
  prologue.kind = StepKind::Elementwise;
  std::erase(prologue.nodes, reduction);
  prologue.roles.assign(prologue.nodes.size(), Role::Work);
  prologue.outputs = {graph.nodes[reduction].inputs[0]};
  return std::make_shared<const CpuProgram>(CpuProgram::compile(graph, prologue));
}

// Elements of a fused reduction's operand that compiled code stores at a time: 8 KiB of float32.
constexpr int64_t kJitChunk = 2048;

BufferView cpu_fused_reduce(const Graph& graph, const Step& step, const ValueBuffers& values,
                            std::shared_ptr<const CpuProgram>* prologue_memo, const RowRange& rows,
                            const std::optional<BufferView>& into) {
  const Node& node = graph.nodes[step.outputs[0]];
  const ValueId operand = node.inputs[0];
  // The prologue as an elementwise program whose one result is the reduction's operand.
  std::shared_ptr<const CpuProgram> compiled = prologue_memo != nullptr ? *prologue_memo : nullptr;
  if (compiled == nullptr) {
    compiled = compile_reduction_prologue(graph, step);
    if (prologue_memo != nullptr) *prologue_memo = compiled;
  }
  const CpuProgram& program = *compiled;
  std::vector<CpuOperand> operands;
  for (ValueId v : step.inputs) {
    const BufferView& in = *values[v];
    operands.push_back(make_cpu_operand(in.data(), in.dtype, in.shape, in.strides, step.shape));
  }
  // The fusion pass fuses only trailing reduced dims: rows are contiguous ranges of the
  // prologue's elements.
  const int64_t inner = numel(step.shape) / std::max<int64_t>(1, numel(node.shape));
  const int64_t outer = numel(node.shape);
  const DType dtype = graph.nodes[operand].dtype;
  BufferView out = into ? *into : allocate_buffer(node.device, node.dtype, node.shape);
  dispatch_storage(dtype, [&]<typename S>() {
    // The compiled loop, bound once for every row: a call of run() would find it again each
    // time, which cost more than a row's work. Where the operand's elements are read from
    // memory rather than the caches (worth_streaming's bound; a row step's block of rows never
    // is), the program measures which path is faster on this machine (Note [Compiled or
    // interpreted from memory] in codegen/cpu/cpu_program.cc).
    const int64_t rows_read = rows.end >= 0 ? rows.end - rows.begin : outer;
    const bool from_memory = worth_streaming(rows_read * inner * static_cast<int64_t>(sizeof(S)));
    // Timed only where the path is being measured.
    const bool timed = from_memory && program.jit_compilable();
    const auto started =
        timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    CpuProgram::Bound bound;
    if (program.jit_compilable() && inner >= kCpuVectorPad &&
        (!from_memory || program.compiled_from_memory_next())) {
      thread_local AlignedBytes placeholder;  // a result for bind() to look at; never written
      const CpuResult result{placeholder.at_least(64), dtype};
      bound = program.bind(operands, std::span(&result, 1), rows_read * inner);
    }
    const bool compiled = bound.kernel != nullptr;
    auto visit = [&](int64_t row, int64_t begin, int64_t end, auto&& f) {
      // The prologue runs a program block at a time, each reduced while it is in the L1 cache.
      // Each thread keeps its block and registers between visits.
      thread_local AlignedBytes block, scratch;
      // Compiled code stores longer chunks, each still in the L1 cache when reduced (Note [The
      // CPU JIT] in codegen/cpu/cpu_program.cc).
      const int64_t chunk = compiled ? kJitChunk : kCpuBlock;
      // Five cache lines past a 4 KiB boundary, as the interpreter's registers are: the operands'
      // blocks lie at multiples of the chunk in memory, and a load right after a store to the
      // same offset within 4 KiB waits for the store (4K aliasing).
      constexpr size_t kOffAlias = 5 * 64;
      std::byte* elements =
          block.at_least(static_cast<size_t>(chunk) * sizeof(S) + kOffAlias) + kOffAlias;
      std::byte* registers = scratch.at_least(program.scratch_bytes());
      for (int64_t first = row * inner + begin, last = row * inner + end; first < last;
           first += chunk) {
        const int64_t count = std::min(chunk, last - first);
        if (std::is_same_v<S, ComputeOf<S>> && !compiled) {
          // Stored as computed: reduced where the program left it.
          CpuResult kept{nullptr, dtype};
          f(reinterpret_cast<const S*>(
                program.run(operands, std::span(&kept, 1), first, first + count, registers)),
            count, 1);
        } else {
          CpuResult result{elements, dtype};
          const int64_t computed = compiled ? CpuProgram::run_bound(bound, std::span(&result, 1),
                                                                    first, first + count, first)
                                            : first;
          if (computed < first + count)
            program.run(operands, std::span(&result, 1), computed, first + count, registers, first);
          f(reinterpret_cast<const S*>(elements), count, 1);
        }
      }
    };
    reduce_rows<S>(node, outer, inner, out, visit, rows);
    if (timed)
      program.record_from_memory(
          compiled,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() /
              static_cast<double>(rows_read * inner));
  });
  return out;
}

BufferView cpu_contiguous(const BufferView& input) {
  if (input.is_contiguous()) return input;
  BufferView out = allocate_buffer(input.storage->device(), input.dtype, input.shape);
  CpuOperand operand =
      make_cpu_operand(input.data(), input.dtype, input.shape, input.strides, input.shape);
  cpu_gather(operand, input.dtype, 0, numel(input.shape), out.data());
  return out;
}

namespace {

// How gemm reads one operand: each batch's matrix where it lies, where the operand has gemm's
// type and each matrix is row-major or column-major (a transposed view, such as a Linear
// layer's weight.t()) with a leading dimension; otherwise from a dense copy. Staging a
// transposed weight had cost far more than the product itself (docs/benchmarks.md, "CPU
// matmul").
struct GemmOperand {
  const std::byte* data = nullptr;  // batch 0's matrix
  bool transposed = false;          // column-major: gemm reads it transposed
  int64_t ld = 1;                   // the leading dimension gemm is given
  std::vector<int64_t> offsets;     // in elements, of each batch's matrix from data
  std::vector<std::byte> staged;    // the dense copy, where there is one
};

// `full`/`strides`: the operand broadcast to batch + [rows, cols]; `work`: gemm's type.
GemmOperand gemm_operand(const BufferView& v, const Shape& full, const Strides& strides,
                         DType work) {
  GemmOperand operand;
  const size_t rank = full.size();
  const int64_t rows = full[rank - 2], cols = full[rank - 1];
  int64_t batches = 1;  // the product of the batch dims (rows * cols may be 0)
  for (size_t d = 0; d + 2 < rank; ++d) batches *= full[d];
  const std::optional<MatrixLayout> layout =
      matrix_layout(rows, cols, strides[rank - 2], strides[rank - 1]);
  if (v.dtype == work && layout) {
    operand.data = static_cast<const std::byte*>(v.data());
    operand.transposed = layout->transposed;
    operand.ld = layout->ld;
    // Each batch's offset: its index through the batch dims' strides (0 where broadcast).
    operand.offsets.assign(static_cast<size_t>(batches), 0);
    for (int64_t i = 0; i < batches; ++i) {
      int64_t offset = 0;
      for (int64_t d = static_cast<int64_t>(rank) - 3, rest = i; d >= 0; --d) {
        offset += rest % full[d] * strides[d];
        rest /= full[d];
      }
      operand.offsets[static_cast<size_t>(i)] = offset;
    }
    return operand;
  }
  operand.staged.resize(static_cast<size_t>(numel(full)) * dtype_size(work));
  CpuOperand gathered = make_cpu_operand(v.data(), v.dtype, full, strides, full);
  cpu_gather(gathered, work, 0, numel(full), operand.staged.data());
  operand.data = operand.staged.data();
  operand.ld = std::max<int64_t>(cols, 1);
  operand.offsets.resize(static_cast<size_t>(batches));
  for (int64_t i = 0; i < batches; ++i) operand.offsets[static_cast<size_t>(i)] = i * rows * cols;
  return operand;
}

}  // namespace

BufferView cpu_matmul(const Node& node, const BufferView& a, const BufferView& b) {
  const MatmulShapes shapes = matmul_shapes(a, b);
  const int64_t n = shapes.n, k = shapes.k, m = shapes.m, batches = shapes.batches;
  // gemm's type: float for float32 and the half types, double for float64 and integers (exact
  // below 2^53).
  const bool use_float =
      node.dtype == DType::Float32 || node.dtype == DType::Float16 || node.dtype == DType::BFloat16;
  const DType work = use_float ? DType::Float32 : DType::Float64;
  const GemmOperand a_work = gemm_operand(a, shapes.a_full, shapes.a_strides, work);
  const GemmOperand b_work = gemm_operand(b, shapes.b_full, shapes.b_strides, work);
  BufferView out = allocate_buffer(node.device, node.dtype, node.shape);
  // The product is written where it is stored when that has gemm's type.
  std::vector<std::byte> c_staged;
  std::byte* c = static_cast<std::byte*>(out.data());
  if (node.dtype != work) {
    c_staged.resize(static_cast<size_t>(batches * n * m) * dtype_size(work));
    c = c_staged.data();
  }
  const size_t element = dtype_size(work);
  const CBLAS_TRANSPOSE a_trans = a_work.transposed ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE b_trans = b_work.transposed ? CblasTrans : CblasNoTrans;
  // Note [Batched products on the CPU]
  // A batch of products over one matrix B (a Linear layer applied to [B, T, C]: B broadcast
  // over the batch) whose A matrices are stacked rows, each batch's right after the last, is one
  // product of all the rows: one gemm of batches * n rows rather than `batches` of n, which
  // OpenBLAS threads and blocks far better (PyTorch's matmul folds the same way). Other batches
  // (attention's per-head products, many and small) go to the threads a product each, each
  // product on one thread: OpenBLAS runs single-threaded inside a parallel region, and a
  // product of 64 x 64 by 64 x 32 is too small for its threads to pay. A product's bits do not
  // depend on its thread: gemm splits rows and columns among threads, never the sum over k.
  const bool b_shared = std::all_of(b_work.offsets.begin(), b_work.offsets.end(),
                                    [](int64_t offset) { return offset == 0; });
  bool a_stacked = batches > 1 && !a_work.transposed && b_shared;
  for (int64_t i = 1; a_stacked && i < batches; ++i)
    a_stacked = a_work.offsets[static_cast<size_t>(i)] == i * n * a_work.ld;
  const int64_t products = a_stacked ? 1 : batches, rows = a_stacked ? batches * n : n;
  auto product = [&](int64_t i) {
    const std::byte* a_i = a_work.data + a_work.offsets[static_cast<size_t>(i)] * element;
    const std::byte* b_i = b_work.data + b_work.offsets[static_cast<size_t>(i)] * element;
    std::byte* c_i = c + static_cast<size_t>(i * n * m) * element;
    if (use_float) {
      cblas_sgemm(CblasRowMajor, a_trans, b_trans, rows, m, k, 1.0f,
                  reinterpret_cast<const float*>(a_i), a_work.ld,
                  reinterpret_cast<const float*>(b_i), b_work.ld, 0.0f,
                  reinterpret_cast<float*>(c_i), std::max<int64_t>(m, 1));
    } else {
      cblas_dgemm(CblasRowMajor, a_trans, b_trans, rows, m, k, 1.0,
                  reinterpret_cast<const double*>(a_i), a_work.ld,
                  reinterpret_cast<const double*>(b_i), b_work.ld, 0.0,
                  reinterpret_cast<double*>(c_i), std::max<int64_t>(m, 1));
    }
  };
  if (products > 1 && omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < products; ++i) product(i);
  } else {
    for (int64_t i = 0; i < products; ++i) product(i);
  }
  if (node.dtype == work) return out;
  Shape flat = {batches * n * m};
  if (is_integral(node.dtype)) {
    // BLAS computed exact integers in double; round rather than truncate.
    double* values = reinterpret_cast<double*>(c_staged.data());
    for (int64_t i = 0; i < batches * n * m; ++i) values[i] = std::nearbyint(values[i]);
  }
  CpuOperand result = make_cpu_operand(c_staged.data(), work, flat, {1}, flat);
  cpu_gather(result, node.dtype, 0, batches * n * m, out.data());
  return out;
}

}  // namespace lazyfuse
