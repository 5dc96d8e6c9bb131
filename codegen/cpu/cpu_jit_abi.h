// The C interface between lazyfuse and its CPU JIT (liblazyfuse_cpu_jit.so,
// codegen/cpu/cpu_jit.cc), which lazyfuse loads at run time where it is installed
// (codegen/cpu/cpu_jit_loader.cc): the JIT links LLVM, which a program need not carry to run
// lazyfuse; without it CPU programs run in the interpreter (codegen/cpu/cpu_program.cc), which
// computes the same bits.
#pragma once

#include <cstdint>

extern "C" {

// Changes whenever a struct or signature below does: the library and the program that loads it
// must agree (lazyfuse_cpu_jit_abi_version).
#define LF_JIT_ABI_VERSION 2

// What an instruction of a JIT program does, at loop index i (an element index of the step's
// iteration space, the first of a vector of lanes elements). Registers hold one vector each.
enum LfJitKind : int32_t {
  kLfJitLoadDense = 0,  // dst = operand[slot][i ...]
  kLfJitLoadScalar,     // dst = operand[slot][0] in every lane
  kLfJitLoadRowRun,     // dst = operand[slot][i % row ...]: one run of a row read by every row
  kLfJitLoadRowValue,   // dst = operand[slot][(i / row) * row_stride] in every lane
  kLfJitConst,          // dst = value in every lane
  kLfJitApply,          // dst = function(src[0], src[1], src[2]), an op of cpu_jit_ops.cc
  kLfJitStore,          // result[slot][i ...] = src[0]
  kLfJitStoreStream,    // the same past the caches (result[slot] 64-byte aligned)
  kLfJitStoreRowRun,    // result[slot][i % row ...] = src[0]: a row's values kept for the row
};

// How a load's operand or a store's result lies in memory: as the program's registers (float32
// or float64), or as a half type whose values a float32 program's registers hold (Note [Half
// precision in fused kernels] in ir/schedule.h): converted as they are loaded, rounded
// to nearest even as they are stored. Flat programs only: a row program's loads and stores lie
// as its registers (emit_row_kernel refuses others).
enum LfJitMemory : int32_t {
  kLfJitMemoryAsRegisters = 0,
  kLfJitMemoryBFloat16,
  kLfJitMemoryHalf,
};

struct LfJitInstr {
  int32_t kind;
  int32_t memory;  // loads and stores: an LfJitMemory
  int32_t dst;
  int32_t src[3];
  int32_t slot;
  int64_t row;           // LoadRowRun, LoadRowValue: elements per row (a multiple of the lanes)
  int64_t row_stride;    // LoadRowValue: elements between one row's value and the next's
  double value;          // Const (exact in the program's dtype)
  const char* function;  // Apply: lf_jit_<Op>_<f32|f64>
};

// One part of a row program (LfJitProgram::phases): its instructions, over registers of its
// own, either once a row on vectors whose lanes all hold the row's value (a part over one value
// a row: a LoadDense reads, and a Store writes, index `row` of its operand, a Store from lane 0)
// or for each vector of the row; the latter may reduce a register's vectors over the row into
// one value a row, stored at index `row` of result `reduce_result`.
struct LfJitPhase {
  int32_t once_a_row;
  int32_t num_registers;
  int32_t num_instrs;
  const LfJitInstr* instrs;
  int32_t reduce_src;     // the register reduced; -1 where the part is no reduction
  int32_t reduce_result;  // the result slot of the row's value
  // lf_jit_<init|combine|flush|finish>_<Op>_<f32|f64> (codegen/cpu/cpu_jit_ops.cc): a vector of
  // accumulators, one a lane, set to the identity (and its vector of stretches to zero); a
  // vector of values combined into them; the stretches added into the accumulators, at every
  // 256th element of the row and at its end (nothing, but for a sum of float32 values); the
  // row's value from sets of 16 accumulators.
  const char* reduce_init;
  const char* reduce_combine;
  const char* reduce_flush;
  const char* reduce_finish;
  // Elements of a row between flushes (kCpuReduceStretchSpan; 0 where the reduction keeps no
  // stretches).
  int32_t reduce_flush_every;
  int32_t reduce_sets;               // sets of 16 accumulators the row's vectors go to in turn
  int32_t reduce_accumulator_bytes;  // 8 (float64 accumulators) or 4
  // The result slot of a row-long buffer (or -1): where the phase calls an op function out of
  // line (SLEEF's), it computes the row's values into the buffer and reduces them in a loop of
  // their own, so that its accumulators do not cross the calls (which would keep them in memory).
  int32_t reduce_scratch;
};

struct LfJitProgram {
  int32_t double_precision;  // every register f64 (else f32)
  const char* isa;           // "avx512" or "avx2": whose op functions, and its vector lanes
  int32_t num_registers;
  int32_t num_instrs;
  const LfJitInstr* instrs;
  // A row program (num_phases > 0, instrs unused): rows of `row_length` elements (a multiple of
  // 16 times each phase's reduce_sets), each row running every phase in turn.
  int64_t row_length;
  int32_t num_phases;
  const LfJitPhase* phases;
  // For each vector loaded densely, a request for the line `prefetch_bytes` on (0: none); in a
  // row program, for each operand any phase loads densely, by the phase applying the most ops.
  int64_t prefetch_bytes;
};

// Computes the whole vectors of elements [begin, end): end - begin a multiple of the lanes, and
// begin too where the program reads a row operand; a row program's, whole rows.
typedef void (*LfJitKernel)(const void* const* operands, void* const* results, int64_t begin,
                            int64_t end);

// The vector lanes of the program's dtype under `isa`; 0 where the JIT has no code for it.
typedef int32_t (*LfJitLanesFn)(const char* isa, int32_t double_precision);
// Compiles `program`; returns null and sets *kernel and *code (what holds the kernel's code), or
// returns an error message (valid until the next call on the thread).
typedef const char* (*LfJitCompileFn)(const LfJitProgram* program, LfJitKernel* kernel,
                                      void** code);
// Frees a kernel's code (`code` from the compile), once nothing will call the kernel again.
typedef void (*LfJitReleaseFn)(void* code);
// The LF_JIT_ABI_VERSION the library was built with.
typedef int32_t (*LfJitAbiVersionFn)();

}  // extern "C"
