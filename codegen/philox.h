// Philox 4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator, so element i of a random tensor depends only on (seed, offset + i)
// and every device produces the same numbers without sharing state.
//
// This file is C++ for the host and, unchanged, part of every generated CUDA kernel's prologue
// (codegen/cuda/cuda_prologue.cuh): the CPU and the GPU draw with one definition.
#pragma once

#ifndef __CUDACC_RTC__
#include <cmath>
#include <cstdint>
#define LF_HOST_DEVICE inline
#else
#define LF_HOST_DEVICE __device__ __forceinline__
#endif

namespace lazyfuse {

#ifndef __CUDACC_RTC__
using std::cos;
using std::log;
using std::sqrt;
#endif

struct Philox4x32 {
  uint32_t v[4];
};

LF_HOST_DEVICE Philox4x32 philox4x32_10(uint64_t counter, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  Philox4x32 out = {{c0, c1, c2, c3}};
  return out;
}

// Uniform in [0, 1) with `bits` random bits: as many as the dtype's significand holds (11 for
// float16, 8 for bfloat16, 24 for float32, 53 for float64), so rounding never reaches 1.
LF_HOST_DEVICE double philox_uniform(uint64_t index, uint64_t seed, int bits) {
  Philox4x32 r = philox4x32_10(index, seed);
  uint64_t word = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
  return static_cast<double>(word >> (64 - bits)) / static_cast<double>(uint64_t{1} << bits);
}

// Attention's dropout (Note [Attention] in ir/attention.cc): whether the probability of query i
// and key j of head `head` (over the dims before the rows) is kept. Its draw is element
// (head * queries + i) * keys + j of a rand over the scores' shape at `offset`, of `bits` random
// bits (the scores' dtype's, as uniform_bits says), kept where at least `threshold` (the dropout
// probability as that dtype holds it): the mask the unfused graph's `rand(...) >= p` draws.
LF_HOST_DEVICE bool attention_keeps(uint64_t seed, uint64_t offset, uint64_t head, uint64_t queries,
                                    uint64_t keys, uint64_t i, uint64_t j, int bits,
                                    double threshold) {
  return philox_uniform(offset + (head * queries + i) * keys + j, seed, bits) >= threshold;
}

// Standard normal by Box-Muller over two uniforms of the same counter; (0, 1] keeps log finite.
LF_HOST_DEVICE double philox_normal(uint64_t index, uint64_t seed) {
  Philox4x32 r = philox4x32_10(index, seed);
  double u1 = ((r.v[0] >> 8) + 1) * (1.0 / 16777216.0);
  double u2 = (r.v[1] >> 8) * (1.0 / 16777216.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

}  // namespace lazyfuse
