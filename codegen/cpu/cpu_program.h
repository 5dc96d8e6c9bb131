// A fused elementwise step compiled for the CPU: a straight-line program over blocks of
// elements (numexpr's idea). Each instruction runs a vector loop over one block held in
// registers of kCpuBlock elements, so a chain of ops makes one pass over memory and never a
// full-size temporary; the runtime runs blocks on all cores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "lazyfuse/codegen/cpu/cpu_jit_abi.h"
#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/schedule.h"

namespace lazyfuse {

// Elements per register: 256 doubles are 2 KiB, so a program's live registers stay in the L1
// cache. Measured against 512 and 1024: Adam, GELU and `(z + 2).exp() * y` faster at 2^24,
// softmax, with few ops a block, slightly slower (docs/benchmarks.md, "CPU block programs and
// reductions").
inline constexpr int64_t kCpuBlock = 256;

// An operand as the program reads it: strides over the step's iteration space (0 where it
// broadcasts), with dims the operand traverses in order merged.
struct CpuOperand {
  const void* data = nullptr;  // the element at index 0
  DType dtype = DType::Float32;
  Shape shape;
  Strides strides;
};
// Prepares `data` (a tensor of `shape` and `strides`) to be read over `space`.
CpuOperand make_cpu_operand(const void* data, DType dtype, const Shape& shape,
                            const Strides& strides, const Shape& space);

// Reads elements [start, start + n) of `operand` in row-major order into `out`, converted to
// `to` (any dtype): contiguous copies, and the staging of library calls.
void cpu_gather(const CpuOperand& operand, DType to, int64_t start, int64_t n, void* out);

struct CpuResult {
  void* data = nullptr;  // contiguous, step.shape
  DType dtype = DType::Float32;
  // Written with non-temporal stores where an op writes it directly: for a result larger than
  // the caches that nothing reads soon (worth_streaming), it saves reading each line in before
  // writing it.
  bool stream = false;
};
// Whether a result of `bytes` is worth streaming: more than the last-level cache of the 2-core
// machine the choice was measured on would keep.
inline bool worth_streaming(int64_t bytes) { return bytes >= (int64_t{16} << 20); }

class CpuProgram {
 public:
  // Compiles an elementwise step; throws DTypeError if an op has no kernel for its dtype.
  static CpuProgram compile(const Graph& graph, const Step& step);

  int64_t numel() const { return numel_; }
  size_t scratch_bytes() const { return static_cast<size_t>(num_registers_) * kRegisterStride; }
  // Zeroes what run() can read of each register in `scratch` when it computes at most
  // `elements` elements: a block's elements and the padding its last vector reaches into, so
  // that no lane ever reads uninitialised memory. A few of them cost far less than the whole.
  void clear_scratch(std::byte* scratch, int64_t elements) const;
  // Computes elements [begin, end) of every result. `scratch` holds scratch_bytes(), 64-byte
  // aligned; each thread brings its own.
  // Element i is stored at index i - result_base of its result (a block buffer passes the
  // block's first index). A result whose data is null is not stored: its elements are left in
  // the registers, and run() returns where the last block's elements of result 0 are (of its
  // compute type), for a caller that consumes them block by block (a fused reduction).
  const std::byte* run(std::span<const CpuOperand> operands, std::span<const CpuResult> results,
                       int64_t begin, int64_t end, std::byte* scratch,
                       int64_t result_base = 0) const;
  // A listing of the program, one instruction a line (LAZYFUSE_DUMP=cpu).
  std::string listing() const;
  // Whether the JIT can compile the program (codegen/cpu/cpu_jit.h): every register float32, or
  // every one float64, and every op one with a vector form, nothing generated; nothing
  // converted but a float32 program's half-type operands and results (and its rounded copies).
  bool jit_compilable() const { return jit_ != nullptr; }
  // Whether a compilable program loads or stores a half type (its registers float32).
  bool jit_keeps_half_types() const;

  // The compiled loop of the program over particular operands and results (Note [The CPU JIT]
  // in cpu_program.cc), found once for the many ranges a caller then runs: a fused reduction
  // runs one a row.
  struct Bound {
    LfJitKernel kernel = nullptr;  // null: the interpreter computes everything
    int64_t lanes = 0;
    bool reads_rows = false;  // ranges must start at a whole vector
    bool streams = false;     // and, relative to result_base, to stream
    absl::InlinedVector<const void*, 8> operands;
  };
  // Binds the program to `operands` and `results` for `elements` elements in all, which count
  // towards CpuJitMode::Hot's first evaluation; compiles the loop if it is new.
  Bound bind(std::span<const CpuOperand> operands, std::span<const CpuResult> results,
             int64_t elements) const;
  // Computes the whole vectors of [begin, end) with bound code into `results` (laid out as the
  // bound ones; element i at index i - result_base); returns where the interpreter is to go on
  // from (begin where it computed nothing), for run() to compute the rest.
  static int64_t run_bound(const Bound& bound, std::span<const CpuResult> results, int64_t begin,
                           int64_t end, int64_t result_base);

  // How the compiled loop reads each of the program's loads and writes each of its stores, in
  // instruction order (a kLfJit* load or store kind, and a row's length and stride for a row's
  // operand), for `operands` and `results` with vectors of `lanes`; false where the JIT cannot
  // compile the program or read an operand as it lies.
  struct JitLayout {
    int32_t kind = 0;
    int64_t row = 0, row_stride = 0;
  };
  // Inline for a program's usual loads and stores: bind() finds them on every run.
  using JitLayouts = absl::InlinedVector<JitLayout, 12>;
  bool jit_layouts(std::span<const CpuOperand> operands, std::span<const CpuResult> results,
                   int64_t lanes, JitLayouts* layouts) const;
  // The program as the JIT's instructions with these layouts, its operand and result slots
  // offset by the bases (a row program's parts share one array of each).
  std::vector<LfJitInstr> jit_instrs(std::span<const JitLayout> layouts, int32_t operand_base,
                                     int32_t result_base) const;
  int num_registers() const { return num_registers_; }
  // Equal for two living programs exactly when their code is, which then share their compiled
  // loops; null where the JIT cannot compile the program.
  const void* code_identity() const { return jit_.get(); }
  // The JIT's vector lanes for the program's dtype (0 where it has none), and that dtype.
  int64_t jit_lanes() const;
  bool double_precision() const;

  // Where the program reads operands from memory rather than the caches, which of its compiled
  // loop and the interpreter runs it faster depends on the machine (Note [Compiled or interpreted
  // from memory] in cpu_program.cc), so it is measured: whether the compiled loop is to run
  // next, and each such run's time per element, from the path that ran.
  bool compiled_from_memory_next() const;
  void record_from_memory(bool compiled, double seconds_per_element) const;

 private:
  struct JitState;
  static constexpr size_t kRegisterBytes = kCpuBlock * 8;
  // Registers lie this far apart: five cache lines more than a register, so that the same
  // element of two registers is never 4 KiB apart, where a load after a store to the other
  // waits for it (4K aliasing: each op reads one register while writing another).
  static constexpr size_t kRegisterStride = kRegisterBytes + 5 * 64;
  // A multiple of every vector kernel's lanes (vectors are at most 64 bytes of elements of at
  // least 4 bytes): a block of such a length is read in whole vectors.
  static constexpr int64_t kWholeVectorElements = 16;
  enum class Kind : uint8_t { Load, Const, Arange, Rand, Randn, Apply, Convert, Round, Store };
  struct Instr {
    explicit Instr(Kind k) : kind(k) {}
    Kind kind;
    int dst = -1;
    int src[3] = {-1, -1, -1};
    int slot = -1;                 // operand or result index for Load and Store
    DType dtype = DType::Float32;  // the register's compute dtype, or what Round rounds to
    DType from = DType::Float32;
    Op op = Op::Add;  // Apply's op
    CpuApplyFn apply = nullptr;
    CpuApplyFn apply_stream = nullptr;  // the same with non-temporal stores, where it has them
    CpuConvertFn convert = nullptr;
    double value = 0, step = 0;  // Const value; Arange start and step
    int64_t period = 0;          // Arange: counts the index modulo this (0: no period)
    int64_t int_value = 0;       // Const value of integer dtypes
    uint64_t seed = 0, offset = 0;
    int bits = 24;  // Rand: random bits per draw
    // Const, and Round of a constant: run once per run() call, into a register no other value
    // takes, rather than once per block.
    bool once = false;
    // An Apply or Convert whose result the next instruction stores unconverted: where the block
    // is whole vectors, it writes into result `store_slot` directly and that Store is skipped.
    int store_slot = -1;
    bool stored_directly = false;  // a Store that the instruction before may have done
    // An op whose result nothing reads after the store right after it: it may stream the result
    // past the caches (CpuResult::stream), since no later op reads it back.
    bool read_only_by_store = false;
    std::string text;  // the listing's line
  };
  // compile()'s parts: the step's nodes as instructions over a virtual register per value
  // (cpu_program.cc), then constants marked to run once, registers allocated, and results
  // stored where they are computed.
  class Lowering;
  static std::vector<bool> mark_constants(std::vector<Instr>& code, size_t virtual_registers);
  static int allocate_registers(std::vector<Instr>& code, const std::vector<bool>& constant);
  static void store_where_computed(std::vector<Instr>& code);

  std::vector<Instr> code_;
  int num_registers_ = 0;
  int64_t numel_ = 0;
  // The compiled forms of the program, one per layout of its operands; null where the JIT
  // cannot compile it. Shared by every program of equal code (Note [Programs that share their
  // compiled loops] in cpu_program.cc).
  std::shared_ptr<JitState> jit_;
};

// The CPU programs a step runs, as text: an elementwise step's program; for a reduction step,
// per reduction (split_reduction_step) the program computing its operand, then the program of
// what is stored besides. What `lazyfuse codegen --target=cpu` prints.
std::string cpu_step_listing(const Graph& graph, const Step& step);

}  // namespace lazyfuse
