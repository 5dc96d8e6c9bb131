// A row step's parts compiled into one loop over its rows.
#include "lazyfuse/codegen/cpu/cpu_row_program.h"

#include <algorithm>
#include <array>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "lazyfuse/codegen/cpu/cpu_kernels.h"
#include "lazyfuse/codegen/cpu/cpu_reduction.h"

namespace lazyfuse {

// Note [Row programs]
// A row step (a softmax, a LayerNorm: Note [Row blocks] in runtime/cpu/cpu_backend.cc) runs as
// parts: reductions over each row, parts over one value a row (a norm's rsqrt), parts over the
// step's space that read them. Run a part at a time, even over a block of rows in the caches, each
// part pays its setup and reads its operands back from the cache, and the memory is idle while the
// later parts compute. The JIT compiles the parts into one loop over rows instead
// (emit_row_kernel in cpu_jit.cc): for each row, each part in turn, as a loop over the row's
// vectors or, for a part over row values, once. A reduction's accumulators are in registers and
// its value goes straight to the parts after it; a value handed between parts over the whole
// space lies in a buffer of one row, in the L1 cache; and the part applying the most ops asks for
// the lines a little ahead of those the program reads, so that the next rows come from memory
// while this one is computed.
//
// The bits are the interpreter's: each elementwise op is the same op function, and a reduction
// puts element p of its row into lane p % 16 of set (p / 16) % sets and combines the sets, the
// lanes and the identity in the order reduce_run, reduce_part and finish_row do (runtime/
// cpu_library.cc), a sum of float32 values through the same float32 stretches. Rows are whole
// multiples of 16 elements (64 for a max or a min, which keep four sets) no longer than one part of
// a reduction (kCpuReduceBlock); other steps run a part at a time.

namespace {

// The reduction functions of the JIT's op functions, by op and precision.
struct ReductionFunctions {
  const char* init;
  const char* combine;
  const char* flush;
  const char* finish;
  int32_t flush_every;  // elements between flushes (0: the reduction keeps no stretches)
};
const ReductionFunctions* reduction_functions(Op op, bool double_precision) {
  static const auto table = [] {
    std::array<std::array<ReductionFunctions, 2>, kNumOps> names{};
#define LF_REDUCTION(Name, mnemonic, dtype_rule, accumulator, identity, combine, finish)           \
  names[static_cast<int>(Op::Name)] = {                                                            \
      {{"lf_jit_init_" #Name "_f32", "lf_jit_combine_" #Name "_f32", "lf_jit_flush_" #Name "_f32", \
        "lf_jit_finish_" #Name "_f32",                                                             \
        kCpuSumsInStretches<Op::Name, float> ? kCpuReduceStretchSpan : 0},                         \
       {"lf_jit_init_" #Name "_f64", "lf_jit_combine_" #Name "_f64", "lf_jit_flush_" #Name "_f64", \
        "lf_jit_finish_" #Name "_f64",                                                             \
        kCpuSumsInStretches<Op::Name, double> ? kCpuReduceStretchSpan : 0}}};
#define LF_OP(Name, mnemonic, kind, arity, dtype_rule)
#include "lazyfuse/ir/ops.def"
    return names;
  }();
  const ReductionFunctions& functions = table[static_cast<int>(op)][double_precision ? 1 : 0];
  return functions.init == nullptr ? nullptr : &functions;
}

// Sets of 16 accumulators a reduction keeps (reduce_run in cpu_kernels_impl.inc).
int sets_of(Op op) { return op == Op::Max || op == Op::Min ? 4 : 1; }

}  // namespace

bool CpuRowProgram::fits(std::span<const Part> parts, int64_t length, bool double_precision) {
  if (length <= 0 || length % 16 != 0 || length > kCpuReduceBlock) return false;
  bool reduces = false;
  for (const Part& part : parts) {
    // Row loops keep their values as registers hold them (emit_row_kernel in cpu_jit.cc).
    if (part.program != nullptr &&
        (!part.program->jit_compilable() || part.program->double_precision() != double_precision ||
         part.program->jit_keeps_half_types()))
      return false;
    if (!part.reduction) {
      if (part.program == nullptr) return false;
      continue;
    }
    reduces = true;
    if (reduction_functions(part.op, double_precision) == nullptr ||
        length % (16 * sets_of(part.op)) != 0)
      return false;
  }
  return reduces;
}

CpuRowProgram::CpuRowProgram(std::vector<Part> parts, int64_t length, int64_t numel,
                             bool double_precision)
    : parts_(std::move(parts)),
      length_(length),
      numel_(numel),
      double_precision_(double_precision) {}

std::shared_ptr<CpuRowProgram> CpuRowProgram::shared(std::vector<Part> parts, int64_t length,
                                                     int64_t numel, bool double_precision) {
  // The parts' programs are told apart by their code (CpuProgram::code_identity), which the
  // entry's own parts keep alive as long as it lives.
  std::vector<int64_t> key = {length, numel, double_precision};
  for (const Part& part : parts)
    key.insert(key.end(),
               {reinterpret_cast<int64_t>(part.program ? part.program->code_identity() : nullptr),
                part.reduction, static_cast<int64_t>(part.op), part.once_a_row});
  static std::mutex registry_mutex;
  static auto* registry =
      new absl::flat_hash_map<std::vector<int64_t>, std::weak_ptr<CpuRowProgram>>;
  static size_t swept_at = 0;
  std::lock_guard<std::mutex> lock(registry_mutex);
  std::weak_ptr<CpuRowProgram>& entry = (*registry)[key];
  if (std::shared_ptr<CpuRowProgram> alive = entry.lock()) return alive;
  auto program = std::make_shared<CpuRowProgram>(std::move(parts), length, numel, double_precision);
  entry = program;
  if (registry->size() >= 2 * swept_at + 64) {
    absl::erase_if(*registry, [](const auto& kept) { return kept.second.expired(); });
    swept_at = registry->size();
  }
  return program;
}

CpuRowProgram::~CpuRowProgram() {
  for (const Entry& entry : kernels_) cpu_jit_release(entry.compiled);
}

bool CpuRowProgram::ready(int64_t elements) {
  const CpuJitMode mode = cpu_jit_mode();
  if (mode == CpuJitMode::Off || cpu_jit_lanes(double_precision_) <= 0) return false;
  // When the parts' own programs would be compiled (CpuProgram::bind).
  return mode == CpuJitMode::Always || (numel_ >= kCpuJitMinElements &&
                                        processed_.fetch_add(elements, std::memory_order_relaxed) >=
                                            std::max(numel_, kCpuJitWorkElements));
}

CpuRowProgram::Bound CpuRowProgram::bind(std::span<const PartData> data) {
  const int64_t lanes = cpu_jit_lanes(double_precision_);
  const DType dtype = double_precision_ ? DType::Float64 : DType::Float32;
  // The pointers, and each part's layouts, which with the kept values' places make the key of
  // the compiled loop: found again on every run after the first, rather than built anew.
  Bound bound;
  std::vector<CpuProgram::JitLayouts> layouts(parts_.size());
  std::vector<int64_t> key;
  for (size_t p = 0; p < parts_.size(); ++p) {
    const Part& part = parts_[p];
    const PartData& part_data = data[p];
    key.push_back(-1);  // a part's start
    for (size_t j = 0; j < part_data.operands.size(); ++j) {
      key.push_back(part_data.operand_kept[j] >= 0);
      if (part_data.operand_kept[j] >= 0)
        bound.kept_operands.push_back({bound.operands.size(), part_data.operand_kept[j]});
      bound.operands.push_back(part_data.operands[j].data);
    }
    for (size_t j = 0; j < part_data.results.size(); ++j) {
      key.push_back(part_data.result_kept[j] >= 0);
      if (part_data.result_kept[j] >= 0)
        bound.kept_results.push_back({bound.results.size(), part_data.result_kept[j]});
      bound.results.push_back(part_data.results[j].data);
    }
    if (part.reduction) bound.results.push_back(part_data.row_values);
    if (part.reduction && part.program != nullptr) {
      key.push_back(part_data.scratch_kept >= 0);
      if (part_data.scratch_kept >= 0) {
        bound.kept_results.push_back({bound.results.size(), part_data.scratch_kept});
        bound.results.push_back(nullptr);
      }
    }
    if (part.program != nullptr) {
      // A reduction's prologue stores its one result nowhere: a placeholder for the layouts.
      const CpuResult placeholder{&bound, dtype};
      if (!part.program->jit_layouts(
              part_data.operands, part.reduction ? std::span(&placeholder, 1) : part_data.results,
              lanes, &layouts[p]))
        return {};
      for (const CpuProgram::JitLayout& layout : layouts[p])
        key.insert(key.end(), {layout.kind, layout.row, layout.row_stride});
    } else {
      // The reduction of a stored value reads it densely.
      const CpuOperand& operand = part_data.operands[0];
      if (operand.dtype != dtype || operand.shape.size() != 1 || operand.strides[0] != 1) return {};
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const Entry* found = nullptr;
  for (const Entry& entry : kernels_)
    if (entry.key == key) found = &entry;
  if (found == nullptr) {
    const Compiled compiled = compile(data, layouts, lanes);
    kernels_.push_back({key, compiled.compiled, compiled.streams});
    found = &kernels_.back();
  }
  if (found->compiled.kernel == nullptr) return {};
  bound.kernel = found->compiled.kernel;
  bound.streams = found->streams;
  return bound;
}

CpuRowProgram::Compiled CpuRowProgram::compile(std::span<const PartData> data,
                                               const std::vector<CpuProgram::JitLayouts>& layouts,
                                               int64_t lanes) const {
  std::vector<std::vector<LfJitInstr>> instrs(parts_.size());
  std::vector<LfJitPhase> phases(parts_.size());
  bool streams = false;
  int32_t operand_base = 0, result_base = 0;
  for (size_t p = 0; p < parts_.size(); ++p) {
    const Part& part = parts_[p];
    const PartData& part_data = data[p];
    std::vector<LfJitInstr>& code = instrs[p];
    int32_t registers = 1;
    if (part.program != nullptr) {
      code = part.program->jit_instrs(layouts[p], operand_base, result_base);
      registers = part.program->num_registers();
    } else {
      // The reduction of a stored value: its one load.
      LfJitInstr load{};
      load.kind = kLfJitLoadDense;
      load.dst = 0;
      load.src[0] = load.src[1] = load.src[2] = -1;
      load.slot = operand_base;
      code.push_back(load);
    }
    LfJitPhase& phase = phases[p];
    phase.once_a_row = part.once_a_row ? 1 : 0;
    phase.num_registers = registers;
    phase.reduce_src = -1;
    for (size_t k = 0; k < code.size(); ++k) {
      LfJitInstr& instr = code[k];
      const bool load = instr.kind == kLfJitLoadDense || instr.kind == kLfJitLoadScalar ||
                        instr.kind == kLfJitLoadRowRun || instr.kind == kLfJitLoadRowValue;
      const bool store = instr.kind == kLfJitStore || instr.kind == kLfJitStoreStream;
      if (load) {
        if (part_data.operand_kept[instr.slot - operand_base] >= 0) {
          instr.kind = kLfJitLoadRowRun;
          instr.row = length_;
        }
        if ((instr.kind == kLfJitLoadRowRun || instr.kind == kLfJitLoadRowValue) &&
            instr.row != length_)
          return {};
        if (part.once_a_row && instr.kind != kLfJitLoadDense && instr.kind != kLfJitLoadScalar)
          return {};
      } else if (store && part.reduction) {
        // The prologue's result is what the reduction reduces: its last instruction.
        if (k + 1 != code.size()) return {};
        phase.reduce_src = instr.src[0];
      } else if (store) {
        if (part_data.result_kept[instr.slot - result_base] >= 0) instr.kind = kLfJitStoreRowRun;
        if (part.once_a_row) instr.kind = kLfJitStore;
        streams |= instr.kind == kLfJitStoreStream;
      }
    }
    operand_base += static_cast<int32_t>(part_data.operands.size());
    result_base += static_cast<int32_t>(part_data.results.size());
    if (part.reduction) {
      if (part.program != nullptr) {
        if (phase.reduce_src < 0) return {};
        code.pop_back();
      } else {
        phase.reduce_src = 0;
      }
      const ReductionFunctions* functions = reduction_functions(part.op, double_precision_);
      phase.reduce_result = result_base++;
      phase.reduce_scratch =
          part.program != nullptr && part_data.scratch_kept >= 0 ? result_base++ : -1;
      phase.reduce_init = functions->init;
      phase.reduce_combine = functions->combine;
      phase.reduce_flush = functions->flush;
      phase.reduce_flush_every = functions->flush_every;
      phase.reduce_finish = functions->finish;
      phase.reduce_sets = sets_of(part.op);
      phase.reduce_accumulator_bytes =
          dtype_size(reduction_accumulator(
              part.op, double_precision_ ? DType::Float64 : DType::Float32)) == 8
              ? 8
              : 4;
    }
    phase.num_instrs = static_cast<int32_t>(code.size());
    phase.instrs = code.data();
  }
  LfJitProgram program{};
  program.double_precision = double_precision_ ? 1 : 0;
  program.isa = cpu_jit_isa();
  program.row_length = length_;
  program.num_phases = static_cast<int32_t>(phases.size());
  program.phases = phases.data();
  program.prefetch_bytes = kRowPrefetchBytes;
  return {cpu_jit_compile(program), streams};
}

}  // namespace lazyfuse
