// The CPU kernels for any x86-64 (and other architectures): scalar loops the compiler
// vectorizes where it can, libm for transcendentals.
#define LF_CPU_NAMESPACE cpu_baseline
#include "lazyfuse/codegen/cpu/cpu_kernels_impl.inc"
