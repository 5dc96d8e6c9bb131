// The CPU kernels for AVX-512 (compiled with -mavx512f -mavx512dq -mavx2 -mfma), vector math
// from SLEEF. Like the other instruction sets' files, it must define no symbol another file
// could share (nm shows only local ones and its table): a function merged at link time with
// another file's copy could run AVX-512 code on a CPU without it.
#define LF_CPU_NAMESPACE cpu_avx512
#include "lazyfuse/codegen/cpu/cpu_kernels_impl.inc"
