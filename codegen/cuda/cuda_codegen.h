// CUDA source for a fused elementwise step. A kernel is specialised on what changes its code:
// dtypes and ops (the step), the rank of the collapsed iteration space, how each operand is
// read (contiguous, one broadcast element, repeated rows, or strided), 16-byte vector access,
// and 32- or 64-bit index math. Sizes and strides are arguments, so a new size never recompiles.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/codegen/cuda/cuda_kernel_args.h"
#include "lazyfuse/codegen/kernel_plan.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/schedule.h"

namespace lazyfuse {

struct CudaElementwiseSpec {
  int rank = 1;
  // Elements per thread through one access per operand: vector_width of them, 16 bytes of the
  // narrowest operand (eight where one is 2 bytes or less, else four).
  bool vectorized = false;
  int vector_width = 4;
  bool index64 = false;
  // Row kernels only (choose_cuda_row_layout): each lane keeps its elements of the row's
  // operands in registers (row_registers each), read once, instead of rereading the row in
  // every pass; row_warps warps share a row (one row a block when more than one).
  bool row_in_registers = false;
  int row_registers = 32;
  int row_warps = 1;
  // Row kernels with the row in registers: every Repeated operand's period is the row's length
  // (a LayerNorm's weight), so its element is the column's, with no division.
  bool periods_are_rows = false;
  std::vector<OperandAccess> inputs;
  std::string code() const;  // "r1v4_cbr": part of the kernel's name
};

// What one launch needs besides the kernel: sizes and strides after merging dims (kernel_plan.h).
struct CudaElementwiseLaunch {
  CudaElementwiseSpec spec;
  int64_t numel = 0;
  Shape sizes;             // the collapsed iteration space
  OperandStrides strides;  // per input, over `sizes`
};

// An operand as it lies in memory.
struct OperandLayout {
  uint64_t address = 0;
  int64_t element_size = 4;
  Shape shape;
  Strides strides;
};

// Collapses the step's iteration space jointly over its operands and picks the variant.
// `outputs_address` are the result buffers' addresses (contiguous), for the alignment check.
CudaElementwiseLaunch plan_cuda_elementwise(const Step& step,
                                            const std::vector<OperandLayout>& inputs,
                                            std::span<const uint64_t> output_addresses,
                                            const std::vector<int64_t>& output_element_sizes);

// What names a generated kernel in the runtime's in-memory cache: the step's structure, its
// variant, and whether it was generated with fast math.
std::string cuda_kernel_cache_key(const Step& step, const CudaElementwiseSpec& spec,
                                  bool fast_math);

struct CudaSource {
  std::string kernel_name;  // "k_3f9a1c0b_r1.v4..." with dots as underscores
  std::string source;       // complete: prologue and kernel
};

// The kernel's parameters: elementwise_arg_layout (codegen/cuda/cuda_kernel_args.h).
CudaSource generate_cuda_elementwise(const Graph& graph, const Step& step,
                                     const CudaElementwiseSpec& spec, bool fast_math = false);

// A member of a Group step as its kernel takes it: an elementwise step with its variant, a
// reduction with a fused prologue with its (never vectorized) variant, or a reduction of a stored
// operand (a step of one node) by rows (the plain reduction) or by columns (the column
// reduction). Each is a kernel of kCudaReduceThreads threads a block.
struct CudaGroupMember {
  const Step* step = nullptr;
  CudaElementwiseSpec spec;  // elementwise and fused reduction members
  bool columns = false;      // plain reduction members
};
// The name that keys a member's kernel: an elementwise member's cuda_kernel_cache_key, a
// reduction's kernel name.
std::string cuda_group_member_key(const Graph& graph, const CudaGroupMember& member,
                                  bool fast_math);
// A Group step's kernel (Note [Horizontal fusion] in ir/passes/horizontal_fusion.cc) for the
// members given: every member's body is a device function over a range of blocks, one per
// distinct member kernel, and the kernel's blocks go to the members in order. Its parameter:
// each member's arguments in member order (elementwise_arg_layout; a fused reduction's space
// and reduction fields; plain_reduction_arg_layout; column_reduction_arg_layout), then
// start[members + 1], the first block of each member and,
// last, the grid's size. Named "g_<hash>" by the members' keys (cuda_group_kernel_name), which
// key it in the kernel cache.
CudaSource generate_cuda_group(const Graph& graph, std::span<const CudaGroupMember> members,
                               bool fast_math = false);
std::string cuda_group_kernel_name(std::span<const std::string> member_keys);

// The prologue every kernel starts with (codegen/cuda/cuda_prologue.cuh and codegen/philox.h).
const std::string& cuda_prologue();

}  // namespace lazyfuse

namespace lazyfuse {

// A reduction over the rows of a contiguous [rows, columns] operand, in chunks of columns
// (cuda_reduce_chunk): grid = rows x chunks blocks of kCudaReduceThreads threads. With one chunk a
// block writes the row's result (converted to `out`, divided by `divisor` for mean); with several
// it writes a partial in the accumulator type to `partial` ([rows, chunks]), and the row's last
// block to finish combines the partials in chunk order, in the same launch. `counters` holds a
// zero per row on entry and again on exit. The chunking depends only on sizes and the order of
// every combination is fixed, so a result's bits never depend on the GPU or on timing.
inline constexpr int kCudaReduceThreads = 256;
// A row kernel keeps rows of up to 32 x kCudaRowRegisters elements in registers when it reads
// at most kCudaRowRegisterInputs operands.
inline constexpr int kCudaRowRegisters = 32;
inline constexpr int kCudaRowRegisterInputs = 4;
// The columns one block of a reduction takes, from the sizes alone (so a result's bits depend
// on nothing else): as many as leave about kCudaReduceBlocks blocks in all, one full wave on an
// H200 (132 multiprocessors of eight such blocks), a power of two of at least
// kCudaReduceMinChunk. Measured on the H200 (docs/benchmarks.md): fewer, longer blocks pay
// each block's combination less often; more than a wave leaves a partial last one.
inline constexpr int64_t kCudaReduceBlocks = 1024;
inline constexpr int64_t kCudaReduceMinChunk = 4096;
int64_t cuda_reduce_chunk(int64_t rows, int64_t columns);

// The type a reduction kernel accumulates in: the op table's (reduction_accumulator: float64
// for a floating sum or mean), except that a sum or mean of float16 or bfloat16 values in a
// step rounding half values only where stored (Note [Half precision in fused kernels]) adds in
// float32, as PyTorch and XLA do. float32 keeps 16 bits more than bfloat16 and 13 more than
// float16, each thread adds its elements in a fixed order (the same bits on every run), and a
// conversion to float64 issues at 16 a clock per multiprocessor on sm_90 against float32's 128
// additions: by that rate alone, two a bfloat16 element (a LayerNorm's mean and variance) take
// about half of the time the memory does. Rounding after each op keeps float64, so that kernels
// adding in different orders (fused and unfused) still round to the same half value.
DType cuda_reduction_accumulator(Op op, DType in, bool round_each_op);
// That of `reduction`, a node of `step`.
DType step_accumulator(const Graph& graph, const Step& step, const Node& reduction);
// Whether a reduction step with no fused work (a stored operand's sum) runs as the fused
// reduction of an empty prologue, which reads 16 bytes a thread where the operand allows,
// rather than the plain kernel's one element: over trailing dims of a half-type operand, where
// it combines in float32 (a max or min, exact in any order; a sum or mean rounding at stores,
// which lets the order of its additions change its bits).
bool cuda_reduces_stored_half_in_vectors(const Graph& graph, const Step& step);

// Kernel parameters: in, out, rows, columns, chunk, chunks, divisor (a double), partial,
// counters, each 8 bytes. `acc` is cuda_reduction_accumulator's.
CudaSource generate_cuda_reduction(Op op, DType in, DType out, DType acc);
// Its name, which keys it in the kernel cache: known without generating the source.
std::string cuda_reduction_kernel_name(Op op, DType in, DType out, DType acc);
// A reduction over the leading dim of an operand whose kept elements lie contiguous (a bias's
// gradient, the sum over a batch of [batch, features]): out[k] reduces in[j * stride + k] over
// j < columns, for k < rows. Blocks of kCudaReduceThreads threads take tiles of 32 kept
// elements, a lane each (reads coalesce along the kept dim), and chunks of cuda_column_chunk
// reduced elements, eight lanes' slices of a chunk combined in order; a tile of several chunks
// combines their partials ([rows, chunks]) in the tile's last block, in chunk order, as the row
// reduction does (`counters`: a zero per tile). Parameters: column_reduction_arg_layout.
inline constexpr int64_t kCudaColumnTile = 32;
inline constexpr int64_t kCudaColumnMinChunk = 64;
int64_t cuda_column_chunk(int64_t kept, int64_t reduced);
CudaSource generate_cuda_column_reduction(Op op, DType in, DType out, DType acc);
std::string cuda_column_reduction_kernel_name(Op op, DType in, DType out, DType acc);
// A reduction step with a fused elementwise prologue. Over trailing dims, row r reduces prologue
// elements [r * columns, (r + 1) * columns): parameters sizes and strides as an elementwise
// kernel's (over step.shape), then out, rows, columns, chunk, chunks, divisor, partial,
// counters, combining partials as the plain kernel does. Over leading dims
// (ReductionParts::columns, fusion's phase 7), blocks of kCudaReduceThreads threads take tiles
// of kCudaColumnTile kept columns (a lane each) over chunks of cuda_column_chunk reduced
// elements; each thread computes the work for its elements, stores what the step stores, and
// reduces; chunks combine as a column reduction's. Parameters: the space's, out[outputs] (in
// step order, the result among them), rows (kept), columns (reduced), chunk, chunks, divisor,
// partial, counters (one per tile).
CudaSource generate_cuda_fused_reduction(const Graph& graph, const Step& step,
                                         const CudaElementwiseSpec& spec, bool fast_math = false);
// A row step (ReductionParts::is_row_program: reductions of the same rows, an epilogue): one
// warp (or block: choose_cuda_row_layout) per row makes a pass over the row per reduction, its
// lanes combining through shuffles (and a block's warps through shared memory) in a fixed
// order, then a last pass computing and storing the rest with the rows' results. Rows
// are at most FusionOptions::max_row elements (ir/schedule.h) and reread from cache. Parameters:
// sizes and strides over step.shape, input and output pointers (outputs in step order; a stored
// reduction has one element per row), rows, columns, divisor. Launch cuda_row_blocks blocks of
// cuda_row_threads threads.
CudaSource generate_cuda_row_kernel(const Graph& graph, const Step& step,
                                    const CudaElementwiseSpec& spec, bool fast_math = false);
// A row kernel's layout for rows of `columns` elements, set in `plan` (made by
// plan_cuda_elementwise over the step's operands; `outputs_aligned`: every stored output is
// aligned to 8 of its elements). Rows of up to 32 x kCudaRowRegisters elements take a warp
// each; a longer row takes a block of as many warps as leave each lane 16 of its elements or
// fewer (at most 32 warps). A row is kept in registers when it fits them and the step reads at
// most kCudaRowRegisterInputs operands, and read and written 16 bytes a lane at a time (eight
// half-precision elements, four of four bytes) when it is whole groups of such accesses.
void choose_cuda_row_layout(CudaElementwiseLaunch& plan, int64_t columns, size_t inputs,
                            bool outputs_aligned);
// Whether a fused reduction (made by plan_cuda_elementwise over the step's operands) reads
// them in vectors, set in `plan`: over rows of `columns` elements taken `chunk` at a time by a
// block, where the plan allows and every row and every chunk is whole vectors, so that each
// starts aligned; over columns (`over_columns`), never; nor where the order of its additions
// shows (`order_shows`, cuda_reduction_order_shows): read in vectors, a thread adds its vector's
// elements into separate accumulators, an order the plain kernel of the stored operand, one
// element a thread, does not share.
void choose_cuda_fused_reduction_layout(CudaElementwiseLaunch& plan, bool over_columns,
                                        bool order_shows, int64_t columns, int64_t chunk);
// reduction_order_shows (ir/op.h) for `step`'s reduction in the accumulator its kernel uses:
// where half values round after each op (the rounding under which fused and unfused kernels
// agree bit for bit, Note [Half precision in fused kernels]), a float64 sum or mean.
bool cuda_reduction_order_shows(const Graph& graph, const Step& step);
// The blocks and threads a row kernel of `spec` launches for `rows` rows.
int64_t cuda_row_blocks(const CudaElementwiseSpec& spec, int64_t rows);
int cuda_row_threads(const CudaElementwiseSpec& spec);
// A column step's row kernel (is_column_row_step: a softmax over dim 0): a block takes a tile
// of a warp's width of columns, a lane each, and its kCudaColumnSlices warps walk every
// kCudaColumnSlices-th element of the tile's columns, combining through shared memory; `rows`
// is then the count of columns and `columns` their length. The layout set in `plan`; the
// blocks it launches (of cuda_row_threads threads) for `columns` columns.
inline constexpr int64_t kCudaColumnSlices = 8;
void choose_cuda_column_layout(CudaElementwiseLaunch& plan);
int64_t cuda_column_step_blocks(int64_t columns);

// The kernel a step with generated code (elementwise or reduction) runs, by its kind and what
// is fused into it; a reduction's `spec` is vectorized only for a row kernel
// (choose_cuda_row_layout) or a fused reduction over rows of whole vectors whose chunks are
// whole vectors too. What the runtime launches and what `lazyfuse codegen` shows.
CudaSource generate_cuda_step(const Graph& graph, const Step& step, const CudaElementwiseSpec& spec,
                              bool fast_math = false);
// The kernel a first evaluation of `step` compiles: its operands as freshly made tensors lie,
// contiguous and 256-byte aligned (what cuMemAlloc gives). What `lazyfuse codegen` and
// `compile` show.
CudaSource cuda_source_for_fresh_operands(const Graph& graph, const Step& step);

// The index steps' kernels (codegen/cuda/cuda_index.cc), each named by what it is specialised on,
// which keys it in the kernel cache. Their words: codegen/cuda/cuda_kernel_args.h. Launch blocks of
// kCudaIndexThreads threads; each kernel loops over what its grid does not cover.
inline constexpr int kCudaIndexThreads = 256;
// gather of elements of `element_bytes` bytes (moved as bits) over operands of rank `rank`.
CudaSource generate_cuda_gather(int element_bytes, int rank);
std::string cuda_gather_kernel_name(int element_bytes, int rank);
// scatter_add of `dtype`, one thread per line (Note [scatter_add on the GPU]).
CudaSource generate_cuda_scatter_add(DType dtype, int rank);
std::string cuda_scatter_add_kernel_name(DType dtype, int rank);
// A strided copy from `from` to `to`, converting as a cast does.
CudaSource generate_cuda_strided_copy(DType from, DType to, int rank);
std::string cuda_strided_copy_kernel_name(DType from, DType to, int rank);

// Attention steps' kernels (codegen/cuda/cuda_attention.cc, Note [Attention on the GPU]), each
// specialised on what its name says; their words: attention_arg_layout.
inline constexpr int kCudaAttentionWarps = 4;  // query rows a block of the forward and dq
inline constexpr int64_t kCudaAttentionSharedBytes = 48 * 1024;
inline constexpr int64_t kCudaAttentionMaxHeadDim = 256;
// The kernels on tensor cores (Note [Attention on tensor cores]) take float16 and bfloat16 head
// dims that are multiples of 16 up to this.
inline constexpr int64_t kCudaAttentionMmaMaxHeadDim = 128;
// Delta computes D_i = do_i . o_i for every query row, into a float32 buffer the gradients'
// kernels on tensor cores read (each tile of them would otherwise sum its rows' again).
enum class CudaAttentionKernel { Forward, QueryGradient, KeyGradients, Delta };
struct CudaAttentionSpec {
  DType dtype = DType::Float32;
  int64_t head_dim = 0, value_dim = 0;
  int lead = 1;  // dims before the rows (a rank-2 operand's one, of size 1)
  bool causal = false, mask = false, bias = false, softcap = false, dropout = false;
  // The kernels on tensor cores: the runner's choice, where the dtype and head dims fit
  // (cuda_attention_fits_tensor_cores), the GPU is sm_80 or later, and the operands the kernels
  // stage start and have their rows on 16-byte boundaries.
  bool tensor_cores = false;
};
bool cuda_attention_fits_tensor_cores(DType dtype, int64_t head_dim, int64_t value_dim);
// Query rows a block of the forward or dq: its grid is that many rows of each head a block.
int cuda_attention_rows_per_block(const CudaAttentionSpec& spec, CudaAttentionKernel kernel);
// Queries a tile of the key gradients' kernel on tensor cores: 64, or 16 past head dims of 64
// (its registers hold a tile's scores and their gradients beside dk and dv: at 32, ptxas spilled).
int cuda_attention_mma_query_tile(const CudaAttentionSpec& spec);
// The spec of an Attention step's kernels, from its nodes, and the kernels it runs: the forward,
// or dq and dk-with-dv as its gradients ask.
CudaAttentionSpec cuda_attention_spec(const Graph& graph, const Step& step);
std::vector<CudaAttentionKernel> cuda_attention_kernels(const Graph& graph, const Step& step);
CudaSource generate_cuda_attention(const CudaAttentionSpec& spec, CudaAttentionKernel kernel);
std::string cuda_attention_kernel_name(const CudaAttentionSpec& spec, CudaAttentionKernel kernel);
// Threads a block: a warp a query row (forward, dq) or one warp (dk and dv); on tensor cores,
// four warps.
int cuda_attention_threads(const CudaAttentionSpec& spec, CudaAttentionKernel kernel);
// Keys a tile: the grid of the key kernel is one block per tile of each key head.
int cuda_attention_key_tile(const CudaAttentionSpec& spec, CudaAttentionKernel kernel);

// A product of 1 to kMaxSkinnyMatmulRows rows with its weight read transposed, an nn::Linear
// at a small batch (Note [Products of few rows] in codegen/cuda/cuda_matmul.cc): float32, float16
// or bfloat16 (summed in float32), with the bias and relu of its step's epilogue or without.
inline constexpr int kMaxSkinnyMatmulRows = 64;
enum class SkinnyEpilogue { None, Bias, BiasRelu };
struct SkinnyMatmulPlan {
  DType dtype = DType::Float32;
  int rows = 1;
  int rows_per_block = 1;  // at most 32; the grid has blocks of rows times blocks of columns
  int cols_per_block = 1;
  int warps = 1;   // splitting the inner dim; the block has 32 * warps threads
  int vector = 4;  // elements in 16 bytes: inner, lda and ldb must be multiples of it
  SkinnyEpilogue epilogue = SkinnyEpilogue::None;
  int64_t blocks(int64_t cols) const;
};
// How the kernel splits the product, from its shape alone; nullopt where it does not apply.
std::optional<SkinnyMatmulPlan> plan_skinny_matmul(DType dtype, int64_t rows, int64_t inner,
                                                   int64_t cols, SkinnyEpilogue epilogue);
// Its words: skinny_matmul_arg_layout (codegen/cuda/cuda_kernel_args.h).
CudaSource generate_cuda_skinny_matmul(const SkinnyMatmulPlan& plan);
std::string cuda_skinny_matmul_kernel_name(const SkinnyMatmulPlan& plan);

}  // namespace lazyfuse
