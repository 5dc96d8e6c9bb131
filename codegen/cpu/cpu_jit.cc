// The CPU JIT (liblazyfuse_cpu_jit.so): compiles a fused elementwise program into one loop over
// vectors whose values stay in registers from op to op, through LLVM's ORC JIT.
//
// Before: a program as LfJitProgram (codegen/cpu/cpu_jit_abi.h) whose registers all have one float
// type, with each operand's layout decided (dense, a scalar, a row's run, a row's value).
// After: a function computing the program's whole vectors of any range of elements, its code
// held by a resource tracker until lazyfuse_cpu_jit_release frees it.
//
// What each op computes is not written here: the op functions (cpu_jit_ops.cc, compiled by clang
// to bitcode per instruction set and embedded below) are the interpreter's kernels' own
// expressions on one vector. The generated loop only moves vectors between them; the op
// functions are inlined into it and the registers become vector registers. Nothing reassociates
// or contracts floating-point operations (no fast-math flags), so a program computes the
// interpreter's bits.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "lazyfuse/codegen/cpu/cpu_jit_abi.h"
#include "llvm/Bitcode/BitcodeReader.h"
#include "llvm/ExecutionEngine/Orc/ExecutionUtils.h"
#include "llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h"
#include "llvm/ExecutionEngine/Orc/LLJIT.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Passes/PassBuilder.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/TargetSelect.h"
#include "llvm/Support/raw_ostream.h"
#include "llvm/Target/TargetMachine.h"

// The op functions' bitcode, one module per instruction set (built by codegen/CMakeLists.txt).
#define LF_JIT_EMBED(isa)                              \
  ".balign 16\n"                                       \
  "lf_jit_bitcode_" #isa                               \
  ":\n"                                                \
  ".incbin \"" LF_JIT_BITCODE_DIR "/cpu_jit_ops_" #isa \
  ".bc\"\n"                                            \
  "lf_jit_bitcode_" #isa "_end:\n"
asm(".section .rodata\n" LF_JIT_EMBED(avx512) LF_JIT_EMBED(avx2) ".previous\n");
extern "C" {
__attribute__((visibility("hidden"))) extern const char lf_jit_bitcode_avx512[];
__attribute__((visibility("hidden"))) extern const char lf_jit_bitcode_avx512_end[];
__attribute__((visibility("hidden"))) extern const char lf_jit_bitcode_avx2[];
__attribute__((visibility("hidden"))) extern const char lf_jit_bitcode_avx2_end[];
}

namespace {

struct Jit {
  std::unique_ptr<llvm::orc::LLJIT> lljit;
  std::unique_ptr<llvm::TargetMachine> machine;  // the optimizer's cost model
  std::string error;                             // why there is no JIT, if there is none
  std::mutex mutex;                              // one compile at a time
  int kernels = 0;                               // names the next kernel
};

Jit& jit() {
  static Jit* const instance = [] {
    auto* j = new Jit;
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    auto builder = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!builder) {
      j->error = llvm::toString(builder.takeError());
      return j;
    }
    builder->setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
    auto machine = builder->createTargetMachine();
    auto lljit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(*builder).create();
    if (!machine || !lljit) {
      j->error = !machine ? llvm::toString(machine.takeError()) : llvm::toString(lljit.takeError());
      return j;
    }
    // The op functions call SLEEF, which the process has loaded.
    auto process = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
        (*lljit)->getDataLayout().getGlobalPrefix());
    if (!process) {
      j->error = llvm::toString(process.takeError());
      return j;
    }
    (*lljit)->getMainJITDylib().addGenerator(std::move(*process));
    j->machine = std::move(*machine);
    j->lljit = std::move(*lljit);
    return j;
  }();
  return *instance;
}

int32_t lanes_of(const char* isa, int32_t double_precision) {
  const std::string name = isa;
  const int32_t bytes = name == "avx512" ? 64 : name == "avx2" ? 32 : 0;
  return bytes / (double_precision ? 8 : 4);
}

llvm::StringRef bitcode_of(const std::string& isa) {
  if (isa == "avx512")
    return {lf_jit_bitcode_avx512,
            static_cast<size_t>(lf_jit_bitcode_avx512_end - lf_jit_bitcode_avx512)};
  return {lf_jit_bitcode_avx2, static_cast<size_t>(lf_jit_bitcode_avx2_end - lf_jit_bitcode_avx2)};
}

// A request, where `b` is, for the cache line `bytes` past `pointer` (read soon, kept in every
// level of the cache).
void prefetch_ahead(llvm::IRBuilder<>& b, llvm::Value* pointer, int64_t bytes) {
  llvm::Value* ahead =
      b.CreateGEP(b.getInt8Ty(), b.CreateBitCast(pointer, b.getInt8PtrTy()), b.getInt64(bytes));
  b.CreateIntrinsic(llvm::Intrinsic::prefetch, {b.getInt8PtrTy()},
                    {ahead, b.getInt32(0), b.getInt32(3), b.getInt32(1)});
}

// For each of `count` instructions, where it divides by a value its loop does not change (a
// constant, a 0-d operand or, where `row_values_fixed`, a row's value: loaded before the loop),
// the index of the load of that divisor; else -1. Such a division runs as
// lf_jit_div_by_reciprocal, the divisor's reciprocal computed where the divisor is loaded
// (Note [Division by a reciprocal] in cpu_jit_ops.cc).
std::vector<int32_t> fixed_divisors(const LfJitInstr* instrs, int32_t count, const char* suffix,
                                    bool row_values_fixed) {
  const std::string division = std::string("lf_jit_Div") + suffix;
  std::vector<int32_t> fixed(static_cast<size_t>(count), -1);
  std::vector<int32_t> loaded_by;  // per register: the load of the value it holds, or -1
  for (int32_t k = 0; k < count; ++k) {
    const LfJitInstr& instr = instrs[k];
    const int32_t divisor = instr.src[1];
    if (instr.kind == kLfJitApply && instr.function == division && divisor >= 0 &&
        divisor < static_cast<int32_t>(loaded_by.size()))
      fixed[k] = loaded_by[divisor];
    if (instr.kind == kLfJitStore || instr.kind == kLfJitStoreStream ||
        instr.kind == kLfJitStoreRowRun)
      continue;
    if (instr.dst >= static_cast<int32_t>(loaded_by.size())) loaded_by.resize(instr.dst + 1, -1);
    const bool fixed_value = instr.kind == kLfJitLoadScalar || instr.kind == kLfJitConst ||
                             (row_values_fixed && instr.kind == kLfJitLoadRowValue);
    loaded_by[instr.dst] = fixed_value ? k : -1;
  }
  return fixed;
}

// Calls, where `at` is, the op function of the Apply `instr` on the vectors `view` holds, into
// `out`; where `reciprocal` is given, the division by a fixed divisor through that reciprocal.
std::string call_op(llvm::IRBuilder<>& at, llvm::Module& module, const LfJitInstr& instr,
                    const std::vector<llvm::Value*>& view, llvm::Value* reciprocal,
                    const char* suffix, llvm::Value* out) {
  const std::string function =
      reciprocal != nullptr ? std::string("lf_jit_div_by_reciprocal") + suffix : instr.function;
  llvm::Function* op = module.getFunction(function);
  if (op == nullptr) return "no op function " + function;
  llvm::Value* a = view[instr.src[0]];
  llvm::Value* second = instr.src[1] >= 0 ? view[instr.src[1]] : a;
  llvm::Value* third = reciprocal != nullptr ? reciprocal
                       : instr.src[2] >= 0   ? view[instr.src[2]]
                                             : a;
  at.CreateCall(op, {a, second, third, out});
  return "";
}

// The op function `what` ("load", "load_one", "store", "stream") of a load's or store's half
// memory type (LfJitMemory), or "" where it lies in memory as the registers do.
std::string half_memory_function(const char* what, int32_t memory) {
  switch (memory) {
    case kLfJitMemoryBFloat16:
      return std::string("lf_jit_") + what + "_bf16";
    case kLfJitMemoryHalf:
      return std::string("lf_jit_") + what + "_f16";
    default:
      return "";
  }
}

// Calls the half memory type's op function `what` on `at`: `memory_address`, the element's
// address in the operand or result, and `vector`, the register's vector.
std::string call_half_memory(llvm::IRBuilder<>& at, llvm::Module& module, const char* what,
                             const LfJitInstr& instr, llvm::Value* memory_address,
                             llvm::Value* vector) {
  const std::string name = half_memory_function(what, instr.memory);
  llvm::Function* function = module.getFunction(name);
  if (function == nullptr) return "no op function " + name;
  at.CreateCall(function, {memory_address, vector});
  return "";
}

// What both kinds of kernel start from: the kernel function `name` (LfJitKernel's signature)
// in `module`, which holds the op functions, and the types of the program's values.
struct KernelFrame {
  llvm::Function* kernel = nullptr;
  llvm::Type *element = nullptr, *vector = nullptr, *element_ptr = nullptr, *vector_ptr = nullptr,
             *i64 = nullptr;
  const char* suffix = "";  // the op functions' for the program's precision
  int32_t lanes = 0;
  llvm::Value *operands = nullptr, *results = nullptr, *begin = nullptr, *end = nullptr;
  // A slot, allocated where `b` is (the entry block), for the reciprocal of each load that
  // `divisors` (fixed_divisors) names; null for every other instruction.
  std::vector<llvm::Value*> reciprocal_slots(llvm::IRBuilder<>& b,
                                             const std::vector<int32_t>& divisors) const {
    std::vector<llvm::Value*> slots(divisors.size(), nullptr);
    for (int32_t divisor : divisors)
      if (divisor >= 0 && slots[divisor] == nullptr)
        slots[divisor] = b.CreateBitCast(b.CreateAlloca(vector, nullptr), element_ptr);
    return slots;
  }
  // Stores, where `at` is, the vector 1 / (the vector at `divisor`) at `reciprocal`.
  void store_reciprocal(llvm::IRBuilder<>& at, llvm::Value* divisor, llvm::Value* reciprocal,
                        llvm::Align align) const {
    llvm::Value* value = at.CreateAlignedLoad(vector, at.CreateBitCast(divisor, vector_ptr), align);
    at.CreateAlignedStore(at.CreateFDiv(llvm::ConstantFP::get(vector, 1.0), value),
                          at.CreateBitCast(reciprocal, vector_ptr), align);
  }
  // The address in `array` (the operands' or the results') at `slot`, loaded where `b` is.
  llvm::Value* base(llvm::IRBuilder<>& b, llvm::Value* array, int32_t slot) const {
    llvm::Value* at = b.CreateConstGEP1_64(b.getInt8PtrTy(), array, static_cast<uint64_t>(slot));
    return b.CreateBitCast(b.CreateLoad(b.getInt8PtrTy(), at), element_ptr);
  }
};
std::string declare_kernel(const LfJitProgram& program, const std::string& name,
                           llvm::Module& module, KernelFrame* frame) {
  llvm::LLVMContext& context = module.getContext();
  const bool dp = program.double_precision != 0;
  frame->lanes = lanes_of(program.isa, program.double_precision);
  frame->element = dp ? llvm::Type::getDoubleTy(context) : llvm::Type::getFloatTy(context);
  frame->vector = llvm::FixedVectorType::get(frame->element, static_cast<unsigned>(frame->lanes));
  frame->element_ptr = frame->element->getPointerTo();
  frame->vector_ptr = frame->vector->getPointerTo();
  frame->i64 = llvm::Type::getInt64Ty(context);
  llvm::Type* bytes_ptr_ptr = llvm::Type::getInt8PtrTy(context)->getPointerTo();
  auto* type =
      llvm::FunctionType::get(llvm::Type::getVoidTy(context),
                              {bytes_ptr_ptr, bytes_ptr_ptr, frame->i64, frame->i64}, false);
  frame->kernel = llvm::Function::Create(type, llvm::Function::ExternalLinkage, name, module);
  // The op functions are inlined only into a function of their instruction set.
  frame->suffix = dp ? "_f64" : "_f32";
  llvm::Function* sample = module.getFunction(std::string("lf_jit_Add") + frame->suffix);
  if (sample == nullptr) return "the op functions' bitcode has no lf_jit_Add";
  for (const char* attribute : {"target-cpu", "target-features", "min-legal-vector-width"})
    if (sample->hasFnAttribute(attribute))
      frame->kernel->addFnAttr(sample->getFnAttribute(attribute));
  frame->kernel->addFnAttr(llvm::Attribute::NoUnwind);
  frame->operands = frame->kernel->getArg(0);
  frame->results = frame->kernel->getArg(1);
  frame->begin = frame->kernel->getArg(2);
  frame->end = frame->kernel->getArg(3);
  return "";
}

// Writes the kernel function for the block program `program` (one loop over the range's
// vectors, or a loop over rows around one over a row's vectors) into the module, which holds
// the op functions. Each part returns an error message, empty where it succeeded.
class KernelEmitter {
 public:
  KernelEmitter(const LfJitProgram& program, llvm::Module& module, const KernelFrame& frame)
      : program_(program),
        module_(module),
        context_(module.getContext()),
        f_(frame),
        element_align_(program.double_precision != 0 ? 8 : 4),
        entry_(llvm::BasicBlock::Create(context_, "entry", frame.kernel)),
        rows_(llvm::BasicBlock::Create(context_, "rows", frame.kernel)),
        vectors_(llvm::BasicBlock::Create(context_, "vectors", frame.kernel)),
        next_row_(llvm::BasicBlock::Create(context_, "next_row", frame.kernel)),
        done_(llvm::BasicBlock::Create(context_, "done", frame.kernel)),
        b_(entry_),
        once_(rows_) {}

  std::string emit() {
    choose_nesting();
    prepare();
    open_loops();
    for (int32_t k = 0; k < program_.num_instrs; ++k)
      if (std::string error = emit_instr(k); !error.empty()) return error;
    close_loops();
    return "";
  }

 private:
  // A program that reads rows (a row's run, a row's value) of one length runs as a loop over
  // rows around a loop over the row's vectors: the row's values (a norm's statistics), 0-d
  // operands and constants are loaded and splat once a row, in the outer loop, and a row's run
  // is addressed without a division. Otherwise one flat loop.
  void choose_nesting() {
    bool one_row_length = true;
    for (int32_t k = 0; k < program_.num_instrs; ++k) {
      const LfJitInstr& instr = program_.instrs[k];
      if (instr.kind != kLfJitLoadRowRun && instr.kind != kLfJitLoadRowValue) continue;
      one_row_length &= row_ == 0 || row_ == instr.row;
      row_ = instr.row;
    }
    nested_ = row_ > 0 && one_row_length;
  }

  // In the entry block: each instruction's slot, the reciprocals' slots, and each operand's and
  // result's base address, read once.
  void prepare() {
    // A slot per instruction's result rather than per register: a value computed once a row
    // must not share its slot with one computed every vector. Promoted to registers by the
    // optimizer.
    slots_.assign(static_cast<size_t>(program_.num_instrs), nullptr);
    for (int32_t k = 0; k < program_.num_instrs; ++k) {
      const int32_t kind = program_.instrs[k].kind;
      // A dense or row-run load reads its operand in place, but for a half type's, converted.
      const bool in_place = (kind == kLfJitLoadDense || kind == kLfJitLoadRowRun) &&
                            program_.instrs[k].memory == kLfJitMemoryAsRegisters;
      if (!in_place && kind != kLfJitStore && kind != kLfJitStoreStream)
        slots_[k] = b_.CreateBitCast(b_.CreateAlloca(f_.vector, nullptr), f_.element_ptr);
    }
    // A slot for the reciprocal of each divisor the loop does not change.
    divisors_ = fixed_divisors(program_.instrs, program_.num_instrs, f_.suffix,
                               /*row_values_fixed=*/nested_);
    reciprocals_ = f_.reciprocal_slots(b_, divisors_);
    bases_.assign(static_cast<size_t>(program_.num_instrs), nullptr);
    for (int32_t k = 0; k < program_.num_instrs; ++k) {
      const LfJitInstr& instr = program_.instrs[k];
      if (instr.kind == kLfJitConst || instr.kind == kLfJitApply) continue;
      const bool store = instr.kind == kLfJitStore || instr.kind == kLfJitStoreStream;
      bases_[k] = f_.base(b_, store ? f_.results : f_.operands, instr.slot);
      if (instr.memory != kLfJitMemoryAsRegisters)
        bases_[k] = b_.CreateBitCast(bases_[k], b_.getInt16Ty()->getPointerTo());
    }
    view_.assign(static_cast<size_t>(program_.num_registers), nullptr);
  }

  // rows: from `row_begin` to the end of its row (or of the range); once a row (`once_`), the
  // row's values; then `vectors`, with `i_` the vector's first element.
  void open_loops() {
    b_.CreateCondBr(b_.CreateICmpSLT(f_.begin, f_.end), rows_, done_);
    b_.SetInsertPoint(rows_);
    row_begin_ = b_.CreatePHI(f_.i64, 2, "row_begin");
    row_begin_->addIncoming(f_.begin, entry_);
    row_index_ = nested_ ? b_.CreateUDiv(row_begin_, b_.getInt64(row_)) : nullptr;
    row_start_ = nested_ ? b_.CreateMul(row_index_, b_.getInt64(row_)) : nullptr;
    row_end_ = f_.end;
    if (nested_) {
      llvm::Value* next_start = b_.CreateAdd(row_start_, b_.getInt64(row_));
      row_end_ = b_.CreateSelect(b_.CreateICmpSLT(next_start, f_.end), next_start, f_.end);
    }
    once_.SetInsertPoint(rows_);  // the row's part, before the branch into its vectors
    b_.SetInsertPoint(vectors_);
    i_ = b_.CreatePHI(f_.i64, 2, "i");
    i_->addIncoming(row_begin_, rows_);
  }

  void close_loops() {
    once_.CreateBr(vectors_);
    llvm::Value* next =
        b_.CreateAdd(i_, b_.getInt64(f_.lanes), "next", /*HasNUW=*/true, /*HasNSW=*/true);
    i_->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, row_end_), vectors_, next_row_);
    b_.SetInsertPoint(next_row_);
    row_begin_->addIncoming(row_end_, next_row_);
    b_.CreateCondBr(b_.CreateICmpSLT(row_end_, f_.end), rows_, done_);
    b_.SetInsertPoint(done_);
    b_.CreateRetVoid();
  }

  // An element's address in the operand or result of instruction k.
  llvm::Value* element_at(llvm::IRBuilder<>& at, int32_t k, llvm::Value* index) {
    const bool half = program_.instrs[k].memory != kLfJitMemoryAsRegisters;
    return at.CreateGEP(half ? at.getInt16Ty() : f_.element, bases_[k], index);
  }

  // `scalar` in every lane of instruction k's slot, which its register reads from here.
  void splat(llvm::IRBuilder<>& at, llvm::Value* scalar, int32_t k) {
    at.CreateAlignedStore(at.CreateVectorSplat(static_cast<unsigned>(f_.lanes), scalar),
                          at.CreateBitCast(slots_[k], f_.vector_ptr), element_align_);
    view_[program_.instrs[k].dst] = slots_[k];
    if (reciprocals_[k] != nullptr)
      f_.store_reciprocal(at, slots_[k], reciprocals_[k], element_align_);
  }

  // A load of a half type's element (`one`: into every lane) by instruction k, converted into
  // its slot.
  std::string load_half(llvm::IRBuilder<>& to, int32_t k, llvm::Value* address, bool one) {
    if (std::string error = call_half_memory(to, module_, one ? "load_one" : "load",
                                             program_.instrs[k], address, slots_[k]);
        !error.empty())
      return error;
    view_[program_.instrs[k].dst] = slots_[k];
    if (one && reciprocals_[k] != nullptr)
      f_.store_reciprocal(to, slots_[k], reciprocals_[k], element_align_);
    return "";
  }

  // Instruction k, in the vectors' loop or, where it is the same for a whole row, once a row.
  std::string emit_instr(int32_t k) {
    const LfJitInstr& instr = program_.instrs[k];
    // Once a row: loads of a row's value or of one value, and constants (an op of those alone
    // is never here: fusion gives a row's values a step of their own); in a flat loop, the load
    // of a fixed divisor, whose reciprocal the loop would otherwise compute again wherever an
    // op calls out of line. (Hoisting every constant and load of one value out of flat loops
    // made chain16 slower on the 2-core Intel machine: docs/benchmarks.md, "The CPU JIT".)
    const bool invariant =
        (nested_ && (instr.kind == kLfJitLoadScalar || instr.kind == kLfJitConst ||
                     instr.kind == kLfJitLoadRowValue)) ||
        reciprocals_[k] != nullptr;
    llvm::IRBuilder<>& at = invariant ? once_ : b_;
    const bool half = instr.memory != kLfJitMemoryAsRegisters;
    switch (instr.kind) {
      case kLfJitLoadDense: {
        llvm::Value* address = element_at(b_, k, i_);
        if (program_.prefetch_bytes > 0) prefetch_ahead(b_, address, program_.prefetch_bytes);
        if (half) return load_half(b_, k, address, false);
        view_[instr.dst] = address;
        return "";
      }
      case kLfJitLoadScalar:
        if (half) return load_half(at, k, bases_[k], true);
        splat(at, at.CreateAlignedLoad(f_.element, bases_[k], element_align_), k);
        return "";
      case kLfJitLoadRowRun: {
        llvm::Value* column =
            nested_ ? b_.CreateSub(i_, row_start_) : b_.CreateURem(i_, b_.getInt64(instr.row));
        if (half) return load_half(b_, k, element_at(b_, k, column), false);
        view_[instr.dst] = element_at(b_, k, column);
        return "";
      }
      case kLfJitLoadRowValue: {
        llvm::Value* index = nested_ ? row_index_ : at.CreateUDiv(i_, at.getInt64(instr.row));
        llvm::Value* offset = at.CreateMul(index, at.getInt64(instr.row_stride));
        if (half) return load_half(at, k, element_at(at, k, offset), true);
        splat(at, at.CreateAlignedLoad(f_.element, element_at(at, k, offset), element_align_), k);
        return "";
      }
      case kLfJitConst:
        splat(at, llvm::ConstantFP::get(f_.element, instr.value), k);
        return "";
      case kLfJitApply: {
        llvm::Value* reciprocal = divisors_[k] >= 0 ? reciprocals_[divisors_[k]] : nullptr;
        if (std::string error =
                call_op(at, module_, instr, view_, reciprocal, f_.suffix, slots_[k]);
            !error.empty())
          return error;
        view_[instr.dst] = slots_[k];
        return "";
      }
      case kLfJitStore:
      case kLfJitStoreStream:
        return emit_store(k);
      default:
        return "unknown JIT instruction kind " + std::to_string(instr.kind);
    }
  }

  // Store instruction k: a vector, a half type's converted, or one that streams past the cache.
  std::string emit_store(int32_t k) {
    const LfJitInstr& instr = program_.instrs[k];
    llvm::Value* to = element_at(b_, k, i_);
    const bool stream = instr.kind == kLfJitStoreStream;
    if (instr.memory != kLfJitMemoryAsRegisters)
      return call_half_memory(b_, module_, stream ? "stream" : "store", instr, to,
                              view_[instr.src[0]]);
    if (stream) {
      llvm::Function* function = module_.getFunction(std::string("lf_jit_stream") + f_.suffix);
      if (function == nullptr) return "the op functions' bitcode has no stream function";
      b_.CreateCall(function, {to, view_[instr.src[0]]});
      return "";
    }
    llvm::Value* value = b_.CreateAlignedLoad(
        f_.vector, b_.CreateBitCast(view_[instr.src[0]], f_.vector_ptr), element_align_);
    b_.CreateAlignedStore(value, b_.CreateBitCast(to, f_.vector_ptr), element_align_);
    return "";
  }

  const LfJitProgram& program_;
  llvm::Module& module_;
  llvm::LLVMContext& context_;
  const KernelFrame& f_;
  const llvm::Align element_align_;
  llvm::BasicBlock *entry_, *rows_, *vectors_, *next_row_, *done_;
  llvm::IRBuilder<> b_;
  llvm::IRBuilder<> once_;  // the row's part, before the branch into its vectors
  int64_t row_ = 0;
  bool nested_ = false;
  std::vector<llvm::Value*> slots_, reciprocals_, bases_;
  std::vector<int32_t> divisors_;
  // Where each register's vector is read from (an instruction's slot, or an operand in place).
  std::vector<llvm::Value*> view_;
  llvm::PHINode *row_begin_ = nullptr, *i_ = nullptr;
  llvm::Value *row_index_ = nullptr, *row_start_ = nullptr, *row_end_ = nullptr;
};

std::string emit_kernel(const LfJitProgram& program, const std::string& name,
                        llvm::Module& module) {
  KernelFrame frame;
  if (std::string error = declare_kernel(program, name, module, &frame); !error.empty())
    return error;
  return KernelEmitter(program, module, frame).emit();
}

// Writes the kernel function for the row program `program` (LfJitProgram::phases): for each
// row of the range, every phase in turn, a loop over the row's vectors or a line run once. A
// reducing phase's loop takes 16 * sets elements an iteration, so that each vector's lanes go to
// accumulators known when compiling (the optimizer keeps them in registers). Each part returns
// an error message, empty where it succeeded.
class RowKernelEmitter {
 public:
  RowKernelEmitter(const LfJitProgram& program, llvm::Module& module, const KernelFrame& frame)
      : program_(program),
        module_(module),
        context_(module.getContext()),
        f_(frame),
        length_(program.row_length),
        element_align_(program.double_precision != 0 ? 8 : 4),
        entry_(llvm::BasicBlock::Create(context_, "entry", frame.kernel)),
        rows_(llvm::BasicBlock::Create(context_, "rows", frame.kernel)),
        b_(entry_) {}

  std::string emit() {
    if (length_ <= 0 || length_ % 16 != 0) return "a row program's rows are a multiple of 16 long";
    for (int32_t p = 0; p < program_.num_phases; ++p)
      for (int32_t k = 0; k < program_.phases[p].num_instrs; ++k)
        if (program_.phases[p].instrs[k].memory != kLfJitMemoryAsRegisters)
          return "a row program's loads and stores lie in memory as its registers";
    states_.resize(static_cast<size_t>(program_.num_phases));
    for (int32_t p = 0; p < program_.num_phases; ++p)
      if (std::string error = prepare_phase(p); !error.empty()) return error;
    choose_prefetching();
    auto* done = llvm::BasicBlock::Create(context_, "done", f_.kernel);
    b_.CreateCondBr(b_.CreateICmpSLT(f_.begin, f_.end), rows_, done);
    // rows: the row from `row_start`, every phase in turn.
    b_.SetInsertPoint(rows_);
    row_start_ = b_.CreatePHI(f_.i64, 2, "row_start");
    row_start_->addIncoming(f_.begin, entry_);
    row_ = b_.CreateUDiv(row_start_, b_.getInt64(length_), "row");
    llvm::Value* row_end = b_.CreateAdd(row_start_, b_.getInt64(length_));
    for (int32_t p = 0; p < program_.num_phases; ++p) {
      view_.assign(static_cast<size_t>(program_.phases[p].num_registers), nullptr);
      std::string error = program_.phases[p].once_a_row ? emit_once_a_row(p) : emit_loop(p);
      if (!error.empty()) return error;
    }
    row_start_->addIncoming(row_end, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(row_end, f_.end), rows_, done);
    b_.SetInsertPoint(done);
    b_.CreateRetVoid();
    return "";
  }

 private:
  // Per phase: each instruction's base address and result slot, and the accumulators.
  struct PhaseState {
    std::vector<llvm::Value*> bases, slots;
    // Per instruction: the load of its fixed divisor (fixed_divisors), and the reciprocal of
    // the value a load holds where a division needs it.
    std::vector<int32_t> divisors;
    std::vector<llvm::Value*> reciprocals;
    // A reduction's accumulators: a vector of them for each of the loop's vectors an iteration,
    // and all of them in one array for the finish (kept apart, so that the optimizer keeps the
    // loop's in vector registers).
    std::vector<llvm::Value*> accumulators;
    // A sum's float32 stretches (flush), a vector each: for each of the `together` stretches
    // the loop adds at once, one per vector of an iteration.
    std::vector<llvm::Value*> stretches;
    int64_t together = 1;
    llvm::Value* finishing = nullptr;
    llvm::Value* finished = nullptr;  // the row's value in every lane
    llvm::Value* scratch = nullptr;   // where a split reduction's values wait (reduce_scratch)
  };

  static bool is_store(int32_t kind) {
    return kind == kLfJitStore || kind == kLfJitStoreStream || kind == kLfJitStoreRowRun;
  }

  // Whether an op function calls a function of another library (SLEEF's), which keeps every
  // vector register the caller holds across it in memory.
  bool calls_out_of_line(const LfJitPhase& phase) const {
    for (int32_t k = 0; k < phase.num_instrs; ++k) {
      if (phase.instrs[k].kind != kLfJitApply) continue;
      const llvm::Function* op = module_.getFunction(phase.instrs[k].function);
      if (op == nullptr) continue;
      for (const llvm::BasicBlock& block : *op)
        for (const llvm::Instruction& instruction : block)
          if (const auto* call = llvm::dyn_cast<llvm::CallBase>(&instruction))
            if (const llvm::Function* callee = call->getCalledFunction();
                callee == nullptr || (callee->isDeclaration() && !callee->isIntrinsic()))
              return true;
    }
    return false;
  }

  // Phase p's slots, base addresses and accumulators, allocated in the entry block.
  std::string prepare_phase(int32_t p) {
    const LfJitPhase& phase = program_.phases[p];
    PhaseState& state = states_[p];
    state.bases.assign(static_cast<size_t>(phase.num_instrs), nullptr);
    state.slots.assign(static_cast<size_t>(phase.num_instrs), nullptr);
    // A part over one value a row has no loop to take a reciprocal out of.
    state.divisors = phase.once_a_row
                         ? std::vector<int32_t>(static_cast<size_t>(phase.num_instrs), -1)
                         : fixed_divisors(phase.instrs, phase.num_instrs, f_.suffix,
                                          /*row_values_fixed=*/true);
    state.reciprocals = f_.reciprocal_slots(b_, state.divisors);
    for (int32_t k = 0; k < phase.num_instrs; ++k) {
      const LfJitInstr& instr = phase.instrs[k];
      state.slots[k] = b_.CreateBitCast(b_.CreateAlloca(f_.vector, nullptr), f_.element_ptr);
      if (instr.kind == kLfJitConst || instr.kind == kLfJitApply) continue;
      state.bases[k] = f_.base(b_, is_store(instr.kind) ? f_.results : f_.operands, instr.slot);
    }
    if (phase.reduce_src < 0) return "";
    if (phase.reduce_sets < 1 || length_ % (16 * phase.reduce_sets) != 0)
      return "a row program's reduction has sets its rows do not fill";
    llvm::Type* accumulator =
        phase.reduce_accumulator_bytes == 8 ? b_.getDoubleTy() : b_.getFloatTy();
    llvm::Type* accumulators =
        llvm::FixedVectorType::get(accumulator, static_cast<unsigned>(f_.lanes));
    const int64_t every = phase.reduce_flush_every;
    if (every < 0 || every % (16 * phase.reduce_sets) != 0)
      return "a row program's reduction flushes between its loop's iterations";
    // Stretches are independent until they are added, in order, into the accumulators: a loop
    // over 2 or 4 of them at once (vector j of each an iteration) has as many chains of
    // additions in flight, which one stretch's chain had bound.
    for (int64_t g : {4, 2})
      if (every > 0 && state.together == 1 && length_ % (g * every) == 0) state.together = g;
    for (int64_t u = 0; u < 16 * phase.reduce_sets / f_.lanes; ++u)
      state.accumulators.push_back(b_.CreateAlloca(accumulators, nullptr));
    for (int64_t k = 0; k < state.together * static_cast<int64_t>(state.accumulators.size()); ++k)
      state.stretches.push_back(
          b_.CreateBitCast(b_.CreateAlloca(f_.vector, nullptr), f_.element_ptr));
    state.finishing =
        b_.CreateAlloca(llvm::ArrayType::get(accumulators, state.accumulators.size()), nullptr);
    state.finished = b_.CreateBitCast(b_.CreateAlloca(f_.vector, nullptr), f_.element_ptr);
    if (phase.reduce_scratch >= 0 && calls_out_of_line(phase))
      state.scratch = f_.base(b_, f_.results, phase.reduce_scratch);
    state.bases.push_back(f_.base(b_, f_.results, phase.reduce_result));
    return "";
  }

  // The loop that asks for the lines ahead: the one applying the most ops, so that the next
  // rows arrive while the row computes (asked for by a quick loop, a max's, the lines came in a
  // burst that stalled on the fill buffers, and the long loop found memory idle). It asks for
  // every operand the program reads densely, whichever loop reads it.
  void choose_prefetching() {
    for (int32_t p = 0, most = -1; p < program_.num_phases; ++p) {
      if (program_.phases[p].once_a_row) continue;
      int32_t applies = 0;
      for (int32_t k = 0; k < program_.phases[p].num_instrs; ++k)
        applies += program_.phases[p].instrs[k].kind == kLfJitApply;
      if (applies > most) most = applies, prefetching_ = p;
    }
    std::vector<int32_t> slots;
    for (int32_t p = 0; p < program_.num_phases && program_.prefetch_bytes > 0; ++p) {
      for (int32_t k = 0; k < program_.phases[p].num_instrs; ++k) {
        const LfJitInstr& instr = program_.phases[p].instrs[k];
        if (program_.phases[p].once_a_row || instr.kind != kLfJitLoadDense ||
            std::find(slots.begin(), slots.end(), instr.slot) != slots.end())
          continue;
        slots.push_back(instr.slot);
        prefetched_.push_back(states_[p].bases[k]);
      }
    }
  }

  llvm::Value* vector_at(llvm::Value* pointer) {
    return b_.CreateAlignedLoad(f_.vector, b_.CreateBitCast(pointer, f_.vector_ptr),
                                element_align_);
  }

  // `scalar` in every lane of instruction k's slot of phase p, which its register reads.
  void splat(int32_t p, llvm::Value* scalar, int32_t k) {
    const PhaseState& state = states_[p];
    b_.CreateAlignedStore(b_.CreateVectorSplat(static_cast<unsigned>(f_.lanes), scalar),
                          b_.CreateBitCast(state.slots[k], f_.vector_ptr), element_align_);
    view_[program_.phases[p].instrs[k].dst] = state.slots[k];
    if (state.reciprocals[k] != nullptr)
      f_.store_reciprocal(b_, state.slots[k], state.reciprocals[k], element_align_);
  }

  // Instruction k of phase p, an op, into its slot.
  std::string apply(int32_t p, int32_t k) {
    const PhaseState& state = states_[p];
    const LfJitInstr& instr = program_.phases[p].instrs[k];
    llvm::Value* reciprocal =
        state.divisors[k] >= 0 ? state.reciprocals[state.divisors[k]] : nullptr;
    if (std::string error =
            call_op(b_, module_, instr, view_, reciprocal, f_.suffix, state.slots[k]);
        !error.empty())
      return error;
    view_[instr.dst] = state.slots[k];
    return "";
  }

  // A part over one value a row, on vectors of that value.
  std::string emit_once_a_row(int32_t p) {
    const LfJitPhase& phase = program_.phases[p];
    const PhaseState& state = states_[p];
    for (int32_t k = 0; k < phase.num_instrs; ++k) {
      const LfJitInstr& instr = phase.instrs[k];
      switch (instr.kind) {
        case kLfJitLoadDense:
          splat(p,
                b_.CreateAlignedLoad(f_.element, b_.CreateGEP(f_.element, state.bases[k], row_),
                                     element_align_),
                k);
          break;
        case kLfJitLoadScalar:
          splat(p, b_.CreateAlignedLoad(f_.element, state.bases[k], element_align_), k);
          break;
        case kLfJitConst:
          splat(p, llvm::ConstantFP::get(f_.element, instr.value), k);
          break;
        case kLfJitApply:
          if (std::string error = apply(p, k); !error.empty()) return error;
          break;
        case kLfJitStore:
        case kLfJitStoreStream:
          b_.CreateAlignedStore(
              b_.CreateExtractElement(vector_at(view_[instr.src[0]]), static_cast<uint64_t>(0)),
              b_.CreateGEP(f_.element, state.bases[k], row_), element_align_);
          break;
        default:
          return "a row program's once-a-row part has a load or store of whole rows";
      }
    }
    return "";
  }

  // The reduction functions of phase p (its init, combine, flush and finish), where it reduces.
  struct ReductionFunctions {
    llvm::Function *init = nullptr, *combine = nullptr, *flush = nullptr, *finish = nullptr;
  };

  llvm::Value* accumulators_of(int32_t p, size_t u) {
    return b_.CreateBitCast(states_[p].accumulators[u], b_.getInt8PtrTy());
  }

  // Every stretch of phase p into its vector's accumulators, in the row's order; in a loop, only
  // once `done` (a multiple of the loop's step) is a whole number of stretches.
  void flush_all(int32_t p, llvm::Function* flush, llvm::Value* done, const std::string& label) {
    const PhaseState& state = states_[p];
    llvm::BasicBlock* flushing = nullptr;
    llvm::BasicBlock* flushed = nullptr;
    if (done != nullptr) {
      flushing = llvm::BasicBlock::Create(context_, "flush" + label, f_.kernel);
      flushed = llvm::BasicBlock::Create(context_, "flushed" + label, f_.kernel);
      llvm::Value* in_stretch =
          b_.CreateURem(done, b_.getInt64(program_.phases[p].reduce_flush_every));
      b_.CreateCondBr(b_.CreateICmpEQ(in_stretch, b_.getInt64(0)), flushing, flushed);
      b_.SetInsertPoint(flushing);
    }
    for (size_t k = 0; k < state.stretches.size(); ++k)
      b_.CreateCall(flush, {accumulators_of(p, k % state.accumulators.size()), state.stretches[k]});
    if (done != nullptr) {
      b_.CreateBr(flushed);
      b_.SetInsertPoint(flushed);
    }
  }

  // What is the same for the whole row, before phase p's loop: loads of one value, or of the
  // row's value, and constants.
  void emit_row_invariants(int32_t p) {
    const LfJitPhase& phase = program_.phases[p];
    const PhaseState& state = states_[p];
    for (int32_t k = 0; k < phase.num_instrs; ++k) {
      const LfJitInstr& instr = phase.instrs[k];
      if (instr.kind == kLfJitLoadScalar) {
        splat(p, b_.CreateAlignedLoad(f_.element, state.bases[k], element_align_), k);
      } else if (instr.kind == kLfJitLoadRowValue) {
        llvm::Value* offset = b_.CreateMul(row_, b_.getInt64(instr.row_stride));
        splat(p,
              b_.CreateAlignedLoad(f_.element, b_.CreateGEP(f_.element, state.bases[k], offset),
                                   element_align_),
              k);
      } else if (instr.kind == kLfJitConst) {
        splat(p, llvm::ConstantFP::get(f_.element, instr.value), k);
      }
    }
  }

  // A loop's counter q steps through a stretch's elements (`every` of them) while the loop
  // takes vector j of each of `together` stretches at once: the column of vector u of an
  // iteration's part for stretch g (the plain column q + u * lanes where together is 1).
  llvm::Value* column_of(llvm::Value* q, int64_t every, int64_t together, int64_t g, int64_t u) {
    llvm::Value* column = q;
    if (together > 1)
      column = b_.CreateAdd(
          b_.CreateMul(b_.CreateUDiv(q, b_.getInt64(every)), b_.getInt64(together * every)),
          b_.CreateURem(q, b_.getInt64(every)));
    const int64_t offset = g * every + u * f_.lanes;
    return offset == 0 ? column : b_.CreateAdd(column, b_.getInt64(offset), "", true, true);
  }

  // Instruction k of phase p for the vector at `at` in the operands (`column` in the row).
  std::string emit_in_loop(int32_t p, int32_t k, llvm::Value* at, llvm::Value* column) {
    const PhaseState& state = states_[p];
    const LfJitInstr& instr = program_.phases[p].instrs[k];
    switch (instr.kind) {
      case kLfJitLoadDense:
        view_[instr.dst] = b_.CreateGEP(f_.element, state.bases[k], at);
        return "";
      case kLfJitLoadRowRun:
        view_[instr.dst] = b_.CreateGEP(f_.element, state.bases[k], column);
        return "";
      case kLfJitLoadScalar:
      case kLfJitLoadRowValue:
      case kLfJitConst:
        // Computed before the loop; the register holds it again from here (a register is reused
        // once its value is dead, and each vector of the iteration reads anew).
        view_[instr.dst] = state.slots[k];
        return "";
      case kLfJitApply:
        return apply(p, k);
      case kLfJitStore:
      case kLfJitStoreRowRun:
      case kLfJitStoreStream: {
        llvm::Value* to =
            b_.CreateGEP(f_.element, state.bases[k], instr.kind == kLfJitStoreRowRun ? column : at);
        if (instr.kind == kLfJitStoreStream) {
          llvm::Function* stream = module_.getFunction(std::string("lf_jit_stream") + f_.suffix);
          if (stream == nullptr) return "the op functions' bitcode has no stream function";
          b_.CreateCall(stream, {to, view_[instr.src[0]]});
        } else {
          b_.CreateAlignedStore(vector_at(view_[instr.src[0]]), b_.CreateBitCast(to, f_.vector_ptr),
                                element_align_);
        }
        return "";
      }
      default:
        return "unknown JIT instruction kind " + std::to_string(instr.kind);
    }
  }

  // Phase p's loop over the row's vectors, `per_iteration` of them an iteration, and a
  // reduction's finish.
  std::string emit_loop(int32_t p) {
    const LfJitPhase& phase = program_.phases[p];
    PhaseState& state = states_[p];
    const bool reduces = phase.reduce_src >= 0;
    const int64_t per_iteration = reduces ? 16 * phase.reduce_sets / f_.lanes : 1;
    ReductionFunctions fn;
    if (reduces) {
      fn = {module_.getFunction(phase.reduce_init), module_.getFunction(phase.reduce_combine),
            module_.getFunction(phase.reduce_flush), module_.getFunction(phase.reduce_finish)};
      if (fn.init == nullptr || fn.combine == nullptr || fn.flush == nullptr ||
          fn.finish == nullptr)
        return std::string("no reduction functions ") + phase.reduce_combine;
    }
    const int64_t every = phase.reduce_flush_every;  // 0: no stretches, nothing to flush
    for (size_t k = 0; k < state.stretches.size(); ++k)
      b_.CreateCall(fn.init,
                    {accumulators_of(p, k % state.accumulators.size()), state.stretches[k]});
    emit_row_invariants(p);
    llvm::BasicBlock* before = b_.GetInsertBlock();
    auto* loop = llvm::BasicBlock::Create(context_, "phase" + std::to_string(p), f_.kernel);
    auto* after = llvm::BasicBlock::Create(context_, "after" + std::to_string(p), f_.kernel);
    b_.CreateBr(loop);
    b_.SetInsertPoint(loop);
    const int64_t together = reduces && state.scratch == nullptr ? state.together : 1;
    llvm::PHINode* q = b_.CreatePHI(f_.i64, 2, "q");
    q->addIncoming(b_.getInt64(0), before);
    for (int64_t v = 0; v < together * per_iteration; ++v) {
      const int64_t u = v % per_iteration;
      llvm::Value* column = column_of(q, every, together, v / per_iteration, u);
      llvm::Value* at = b_.CreateAdd(row_start_, column, "", true, true);
      if (p == prefetching_)
        for (llvm::Value* operand : prefetched_)
          prefetch_ahead(b_, b_.CreateGEP(f_.element, operand, at), program_.prefetch_bytes);
      for (int32_t k = 0; k < phase.num_instrs; ++k)
        if (std::string error = emit_in_loop(p, k, at, column); !error.empty()) return error;
      if (reduces && state.scratch != nullptr) {
        b_.CreateAlignedStore(
            vector_at(view_[phase.reduce_src]),
            b_.CreateBitCast(b_.CreateGEP(f_.element, state.scratch, column), f_.vector_ptr),
            element_align_);
      } else if (reduces) {
        b_.CreateCall(fn.combine, {accumulators_of(p, static_cast<size_t>(u)), state.stretches[v],
                                   view_[phase.reduce_src]});
      }
    }
    llvm::Value* next =
        b_.CreateAdd(q, b_.getInt64(per_iteration * f_.lanes), "next", /*HasNUW=*/true, true);
    if (reduces && state.scratch == nullptr && every > 0)
      flush_all(p, fn.flush, next, std::to_string(p));
    q->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next, b_.getInt64(length_ / together)), loop, after);
    b_.SetInsertPoint(after);
    if (!reduces) return "";
    if (state.scratch != nullptr) reduce_scratch(p, fn, per_iteration, after);
    finish_reduction(p, fn);
    return "";
  }

  // The row's values of phase p, reduced from the scratch buffer in the same lanes as in its
  // loop.
  void reduce_scratch(int32_t p, const ReductionFunctions& fn, int64_t per_iteration,
                      llvm::BasicBlock* after) {
    const PhaseState& state = states_[p];
    const int64_t every = program_.phases[p].reduce_flush_every;
    auto* reduce = llvm::BasicBlock::Create(context_, "reduce" + std::to_string(p), f_.kernel);
    auto* reduced = llvm::BasicBlock::Create(context_, "reduced" + std::to_string(p), f_.kernel);
    b_.CreateBr(reduce);
    b_.SetInsertPoint(reduce);
    llvm::PHINode* j = b_.CreatePHI(f_.i64, 2, "j");
    j->addIncoming(b_.getInt64(0), after);
    for (int64_t v = 0; v < state.together * per_iteration; ++v) {
      const int64_t u = v % per_iteration;
      llvm::Value* column = column_of(j, every, state.together, v / per_iteration, u);
      b_.CreateCall(fn.combine, {accumulators_of(p, static_cast<size_t>(u)), state.stretches[v],
                                 b_.CreateGEP(f_.element, state.scratch, column)});
    }
    llvm::Value* next_j =
        b_.CreateAdd(j, b_.getInt64(per_iteration * f_.lanes), "next_j", /*HasNUW=*/true, true);
    if (every > 0) flush_all(p, fn.flush, next_j, "_scratch" + std::to_string(p));
    j->addIncoming(next_j, b_.GetInsertBlock());
    b_.CreateCondBr(b_.CreateICmpSLT(next_j, b_.getInt64(length_ / state.together)), reduce,
                    reduced);
    b_.SetInsertPoint(reduced);
  }

  // Phase p's accumulators finished into the row's value, stored.
  void finish_reduction(int32_t p, const ReductionFunctions& fn) {
    const LfJitPhase& phase = program_.phases[p];
    const PhaseState& state = states_[p];
    const int64_t every = phase.reduce_flush_every;
    // The row's last stretch, where it is not whole.
    if (every > 0 && length_ % every != 0) flush_all(p, fn.flush, nullptr, "");
    llvm::Type* accumulators = state.accumulators[0]->getType()->getPointerElementType();
    for (size_t u = 0; u < state.accumulators.size(); ++u)
      b_.CreateStore(b_.CreateLoad(accumulators, state.accumulators[u]),
                     b_.CreateConstGEP2_32(state.finishing->getType()->getPointerElementType(),
                                           state.finishing, 0, static_cast<unsigned>(u)));
    b_.CreateCall(
        fn.finish,
        {b_.CreateBitCast(state.finishing, b_.getInt8PtrTy()), b_.getInt32(phase.reduce_sets),
         llvm::ConstantFP::get(b_.getDoubleTy(), static_cast<double>(length_)), state.finished});
    b_.CreateAlignedStore(b_.CreateAlignedLoad(f_.element, state.finished, element_align_),
                          b_.CreateGEP(f_.element, state.bases.back(), row_), element_align_);
  }

  const LfJitProgram& program_;
  llvm::Module& module_;
  llvm::LLVMContext& context_;
  const KernelFrame& f_;
  const int64_t length_;
  const llvm::Align element_align_;
  llvm::BasicBlock* entry_;
  llvm::BasicBlock* rows_;
  llvm::IRBuilder<> b_;
  std::vector<PhaseState> states_;
  int32_t prefetching_ = -1;
  std::vector<llvm::Value*> prefetched_;  // the base of each densely read operand
  llvm::PHINode* row_start_ = nullptr;
  llvm::Value* row_ = nullptr;
  // Where each register of the phase being written is read from.
  std::vector<llvm::Value*> view_;
};

std::string emit_row_kernel(const LfJitProgram& program, const std::string& name,
                            llvm::Module& module) {
  KernelFrame frame;
  if (std::string error = declare_kernel(program, name, module, &frame); !error.empty())
    return error;
  return RowKernelEmitter(program, module, frame).emit();
}

thread_local std::string last_error;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int32_t lazyfuse_cpu_jit_abi_version() {
  return LF_JIT_ABI_VERSION;
}

__attribute__((visibility("default"))) int32_t lazyfuse_cpu_jit_lanes(const char* isa,
                                                                      int32_t double_precision) {
  return lanes_of(isa, double_precision);
}

__attribute__((visibility("default"))) const char* lazyfuse_cpu_jit_compile(
    const LfJitProgram* program, LfJitKernel* kernel, void** code) {
  Jit& j = jit();
  std::lock_guard<std::mutex> lock(j.mutex);
  if (j.lljit == nullptr) return (last_error = "no JIT for this host: " + j.error).c_str();
  if (lanes_of(program->isa, program->double_precision) == 0)
    return (last_error = std::string("no JIT op functions for ") + program->isa).c_str();
  auto context = std::make_unique<llvm::LLVMContext>();
  llvm::MemoryBufferRef bitcode(bitcode_of(program->isa), "cpu_jit_ops");
  auto parsed = llvm::parseBitcodeFile(bitcode, *context);
  if (!parsed) return (last_error = llvm::toString(parsed.takeError())).c_str();
  std::unique_ptr<llvm::Module> module = std::move(*parsed);
  module->setDataLayout(j.lljit->getDataLayout());
  module->setTargetTriple(j.machine->getTargetTriple().str());
  const std::string name = "lf_jit_kernel_" + std::to_string(j.kernels++);
  last_error = program->num_phases > 0 ? emit_row_kernel(*program, name, *module)
                                       : emit_kernel(*program, name, *module);
  if (last_error.empty()) {
    std::string problems;
    llvm::raw_string_ostream out(problems);
    if (llvm::verifyFunction(*module->getFunction(name), &out))
      last_error = "generated an invalid kernel: " + out.str();
  }
  if (!last_error.empty()) return last_error.c_str();
  // Only the kernel is visible; the op functions are inlined into it and then dropped.
  for (llvm::Function& f : *module) {
    if (f.isDeclaration() || f.getName() == name) continue;
    f.setLinkage(llvm::GlobalValue::InternalLinkage);
    f.removeFnAttr(llvm::Attribute::NoInline);
    f.addFnAttr(llvm::Attribute::AlwaysInline);
  }
  for (llvm::GlobalVariable& g : module->globals())
    if (!g.isDeclaration()) g.setLinkage(llvm::GlobalValue::InternalLinkage);

  llvm::LoopAnalysisManager loops;
  llvm::FunctionAnalysisManager functions;
  llvm::CGSCCAnalysisManager cgscc;
  llvm::ModuleAnalysisManager modules;
  llvm::PassBuilder passes(j.machine.get());
  passes.registerModuleAnalyses(modules);
  passes.registerCGSCCAnalyses(cgscc);
  passes.registerFunctionAnalyses(functions);
  passes.registerLoopAnalyses(loops);
  passes.crossRegisterProxies(loops, functions, cgscc, modules);
  passes.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2).run(*module, modules);

  // LAZYFUSE_DUMP=jit: each kernel's optimized IR to stderr.
  if (const char* dump = std::getenv("LAZYFUSE_DUMP");
      dump != nullptr && std::string(dump).find("jit") != std::string::npos)
    module->getFunction(name)->print(llvm::errs());
  // Each kernel's code under a tracker of its own, so that it can be freed alone.
  auto tracker = j.lljit->getMainJITDylib().createResourceTracker();
  if (auto error = j.lljit->addIRModule(
          tracker, llvm::orc::ThreadSafeModule(std::move(module), std::move(context))))
    return (last_error = llvm::toString(std::move(error))).c_str();
  auto symbol = j.lljit->lookup(name);
  if (!symbol) {
    llvm::consumeError(tracker->remove());
    return (last_error = llvm::toString(symbol.takeError())).c_str();
  }
  *code = new llvm::orc::ResourceTrackerSP(std::move(tracker));
  *kernel = reinterpret_cast<LfJitKernel>(symbol->getAddress());
  return nullptr;
}

__attribute__((visibility("default"))) void lazyfuse_cpu_jit_release(void* code) {
  auto* tracker = static_cast<llvm::orc::ResourceTrackerSP*>(code);
  {
    std::lock_guard<std::mutex> lock(jit().mutex);
    llvm::consumeError((*tracker)->remove());
  }
  delete tracker;
}

}  // extern "C"
