// The CPU kernels for AVX2 and FMA (compiled with -mavx2 -mfma), vector math from SLEEF.
#define LF_CPU_NAMESPACE cpu_avx2
#include "lazyfuse/codegen/cpu/cpu_kernels_impl.inc"
