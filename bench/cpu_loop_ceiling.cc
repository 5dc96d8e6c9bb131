// What a compiled, fused loop gets on this CPU: the ceiling lazyfuse's CPU programs can reach
// with their numerics (codegen/cpu/cpu_program.h, codegen/cpu/cpu_jit.cc). Three of the benchmark's
// workloads written by hand as one OpenMP loop of AVX-512 vectors (lazyfuse's vector exp and
// tanh), each with ordinary and with non-temporal stores, beside a copy loop and memcpy over the
// same bytes; inputs rotated among sets as `lazyfuse bench` rotates them, the median of 7 batches.
// Compare with `lazyfuse bench --device=cpu --workloads bias_relu exp_mul gelu` in the same
// window.
//
// Then the row workloads (softmax and LayerNorm over rows of 1024) as one pass per row, each row
// read from memory once and kept in the L1 cache for its later loops: with lazyfuse's numerics
// (sums in float64, in 16 lanes; the 1-ULP vector exp of codegen/cpu/cpu_math.h), with PyTorch's
// (sums in float32), and a softmax without its exp; and with lazyfuse's numerics once more, each
// row's first loop asking for the next rows' cache lines and the output stored as lazyfuse stores
// it (non-temporal from 16 MiB). What they take is what a kernel with those numerics can take here,
// against the roof of the same bytes (memcpy above). Last, Adam's step as one loop.
//
//   build/bin/lazyfuse_cpu_loop_ceiling [log2 sizes...]   (default 20 24; needs AVX-512)
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "lazyfuse/codegen/cpu/cpu_math.h"

namespace {

__m512 exp16(__m512 x) { return lazyfuse::cpu_math::lf_exp(lazyfuse::cpu_math::Vf16{x}).v; }
__m512 tanh16(__m512 x) { return lazyfuse::cpu_math::lf_tanh(lazyfuse::cpu_math::Vf16{x}).v; }

struct Arrays {
  float* x;
  float* y;
  float* out;
};

double median_ms(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

template <typename F>
double time_ms(int sets, int per_batch, F&& body) {
  for (int i = 0; i < 3; ++i) body(i % sets);
  std::vector<double> batches;
  for (int b = 0; b < 7; ++b) {
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < per_batch; ++i) body(i % sets);
    batches.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count() /
        per_batch);
  }
  return median_ms(batches);
}

// A float32 vector's 16 values added into two float64 vectors (lanes 0-7 and 8-15).
inline void add_wide(__m512d& low, __m512d& high, __m512 v) {
  low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  high = _mm512_add_pd(
      high, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// NaN-propagating max, as lazyfuse's.
inline __m512 max_of(__m512 a, __m512 b) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), _mm512_max_ps(a, b), a);
}

// Asks for the cache line `ahead` bytes past p (none where ahead is 0).
inline void prefetch(const float* p, int64_t ahead) {
  if (ahead != 0) _mm_prefetch(reinterpret_cast<const char*>(p) + ahead, _MM_HINT_T0);
}

// A row's softmax, its max in four sets of lanes; `wide` sums in float64, else float32. Its
// first loop asks for the lines `ahead` bytes on (the next rows); `stream` stores the output
// with non-temporal stores.
void softmax_row(const float* x, float* y, int64_t length, bool wide, bool with_exp,
                 int64_t ahead = 0, bool stream = false) {
  __m512 sets[4];
  for (__m512& set : sets) set = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < length; i += 64) {
    for (int k = 0; k < 4; ++k) prefetch(x + i + 16 * k, ahead);
    for (int k = 0; k < 4; ++k) sets[k] = max_of(sets[k], _mm512_loadu_ps(x + i + 16 * k));
  }
  const __m512 max = _mm512_set1_ps(
      _mm512_reduce_max_ps(max_of(max_of(sets[0], sets[1]), max_of(sets[2], sets[3]))));
  __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
  __m512 narrow = _mm512_setzero_ps();
  // The exponentials in the output row, or, where the output is streamed, in a row of this
  // thread's (a non-temporal store to a line in the cache would evict it).
  thread_local std::vector<float> row;
  if (stream && static_cast<int64_t>(row.size()) < length) row.resize(length);
  float* exps = stream ? row.data() : y;
  for (int64_t i = 0; i < length; i += 16) {
    __m512 e = _mm512_sub_ps(_mm512_loadu_ps(x + i), max);
    if (with_exp) e = exp16(e);
    _mm512_storeu_ps(exps + i, e);
    if (wide)
      add_wide(low, high, e);
    else
      narrow = _mm512_add_ps(narrow, e);
  }
  const float sum = wide ? static_cast<float>(_mm512_reduce_add_pd(_mm512_add_pd(low, high)))
                         : _mm512_reduce_add_ps(narrow);
  const __m512 divisor = _mm512_set1_ps(sum);
  for (int64_t i = 0; i < length; i += 16) {
    const __m512 v = _mm512_div_ps(_mm512_loadu_ps(exps + i), divisor);
    if (stream)
      _mm512_stream_ps(y + i, v);
    else
      _mm512_storeu_ps(y + i, v);
  }
}

// A row's LayerNorm (eps 1e-5), weight w and bias b: mean, then variance, then the output.
void layer_norm_row(const float* x, const float* w, const float* b, float* y, int64_t length,
                    bool wide, int64_t ahead = 0, bool stream = false) {
  auto sum = [&](auto&& value) {
    __m512d low = _mm512_setzero_pd(), high = _mm512_setzero_pd();
    __m512 narrow = _mm512_setzero_ps();
    for (int64_t i = 0; i < length; i += 16) {
      if (wide)
        add_wide(low, high, value(i));
      else
        narrow = _mm512_add_ps(narrow, value(i));
    }
    return wide ? static_cast<float>(_mm512_reduce_add_pd(_mm512_add_pd(low, high)) / length)
                : _mm512_reduce_add_ps(narrow) / length;
  };
  const __m512 mean = _mm512_set1_ps(sum([&](int64_t i) {
    prefetch(x + i, ahead);
    return _mm512_loadu_ps(x + i);
  }));
  const float variance = sum([&](int64_t i) {
    const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), mean);
    return _mm512_mul_ps(d, d);
  });
  const __m512 scale = _mm512_set1_ps(1.0f / std::sqrt(variance + 1e-5f));
  for (int64_t i = 0; i < length; i += 16) {
    const __m512 d = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), mean), scale);
    const __m512 v =
        _mm512_add_ps(_mm512_mul_ps(d, _mm512_loadu_ps(w + i)), _mm512_loadu_ps(b + i));
    if (stream)
      _mm512_stream_ps(y + i, v);
    else
      _mm512_storeu_ps(y + i, v);
  }
}

inline void store(float* p, __m512 v, bool stream) {
  if (stream)
    _mm512_stream_ps(p, v);
  else
    _mm512_storeu_ps(p, v);
}

// The first `elements` of a.x copied to a.out by memcpy, each thread a contiguous part.
void copy_in_parts(const Arrays& a, int64_t elements) {
  const int threads = omp_get_max_threads();
  const int64_t part = (elements / threads + 15) / 16 * 16;
#pragma omp parallel for num_threads(threads)
  for (int t = 0; t < threads; ++t) {
    const int64_t begin = std::min(elements, t * part);
    const int64_t end = std::min(elements, begin + part);
    std::memcpy(a.out + begin, a.x + begin, (end - begin) * sizeof(float));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!__builtin_cpu_supports("avx512f")) {
    std::fprintf(stderr, "needs AVX-512\n");
    return 1;
  }
  std::vector<int> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(std::atoi(argv[i]));
  if (sizes.empty()) sizes = {20, 24};
  std::printf("| loop | n | ms | GB/s |\n|---|---|---|---|\n");
  for (int log2 : sizes) {
    const int64_t n = int64_t{1} << log2, columns = 1024;
    // As lazyfuse bench: sets that together are 240 MB, at most 8.
    const int sets = static_cast<int>(std::clamp(std::ceil(240e6 / (12.0 * n)), 1.0, 8.0));
    const int per_batch = static_cast<int>(std::clamp<int64_t>((int64_t{1} << 26) / n, 1, 100));
    std::vector<Arrays> data(sets);
    float* bias = static_cast<float*>(std::aligned_alloc(64, columns * sizeof(float)));
    for (int64_t j = 0; j < columns; ++j) bias[j] = 0.001f * j - 0.5f;
    for (Arrays& a : data) {
      for (float** p : {&a.x, &a.y, &a.out}) {
        *p = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
        for (int64_t i = 0; i < n; ++i) (*p)[i] = 0.5f + 0.25f * static_cast<float>(i % 7);
      }
    }
    auto report = [&](const char* name, double ms, double bytes) {
      std::printf("| %s | 2^%d | %.3f | %.0f |\n", name, log2, ms, bytes / ms / 1e6);
    };
    for (bool stream : {false, true}) {
      // relu(x + b) * 0.5, b broadcast over rows of 1024.
      report(stream ? "bias_relu, non-temporal stores" : "bias_relu",
             time_ms(sets, per_batch,
                     [&](int s) {
                       const Arrays& a = data[s];
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < n; i += 16) {
                         __m512 v = _mm512_add_ps(_mm512_loadu_ps(a.x + i),
                                                  _mm512_loadu_ps(bias + i % columns));
                         const __m512 zero = _mm512_setzero_ps();
                         v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, zero);
                         store(a.out + i, _mm512_mul_ps(v, _mm512_set1_ps(0.5f)), stream);
                       }
                     }),
             8.0 * n);
      // (z + 2).exp() * y.
      report(stream ? "exp_mul, non-temporal stores" : "exp_mul",
             time_ms(sets, per_batch,
                     [&](int s) {
                       const Arrays& a = data[s];
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < n; i += 16) {
                         __m512 e =
                             exp16(_mm512_add_ps(_mm512_loadu_ps(a.x + i), _mm512_set1_ps(2.0f)));
                         store(a.out + i, _mm512_mul_ps(e, _mm512_loadu_ps(a.y + i)), stream);
                       }
                     }),
             12.0 * n);
      // GELU's tanh form, x * 0.5 * (1 + tanh(0.7978845608 * (x + 0.044715 * x^3))), op by op
      // as the benchmark writes it (no op contracted into another), with lazyfuse's 1-ULP tanh.
      report(stream ? "gelu, non-temporal stores" : "gelu",
             time_ms(sets, per_batch,
                     [&](int s) {
                       const Arrays& a = data[s];
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < n; i += 16) {
                         const __m512 x = _mm512_loadu_ps(a.x + i);
                         __m512 cube = _mm512_mul_ps(_mm512_set1_ps(0.044715f), x);
                         cube = _mm512_mul_ps(_mm512_mul_ps(cube, x), x);
                         const __m512 inner =
                             _mm512_mul_ps(_mm512_set1_ps(0.7978845608f), _mm512_add_ps(x, cube));
                         const __m512 one_plus = _mm512_add_ps(_mm512_set1_ps(1.0f), tanh16(inner));
                         store(a.out + i,
                               _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), one_plus),
                               stream);
                       }
                     }),
             8.0 * n);
      report(stream ? "copy loop, non-temporal stores" : "copy loop",
             time_ms(sets, per_batch,
                     [&](int s) {
                       const Arrays& a = data[s];
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < n; i += 16)
                         store(a.out + i, _mm512_loadu_ps(a.x + i), stream);
                     }),
             8.0 * n);
    }
    const int64_t rows = n / columns;
    for (bool wide : {true, false}) {
      for (bool with_exp : {true, false}) {
        if (!wide && !with_exp) continue;
        report(wide ? (with_exp ? "softmax rows, float64 sums"
                                : "softmax rows without exp, float64 sums")
                    : "softmax rows, float32 sums",
               time_ms(sets, per_batch,
                       [&](int s) {
                         const Arrays& a = data[s];
#pragma omp parallel for schedule(static)
                         for (int64_t r = 0; r < rows; ++r)
                           softmax_row(a.x + r * columns, a.out + r * columns, columns, wide,
                                       with_exp);
                       }),
               8.0 * n);
      }
      report(wide ? "layernorm rows, float64 sums" : "layernorm rows, float32 sums",
             time_ms(sets, per_batch,
                     [&](int s) {
                       const Arrays& a = data[s];
#pragma omp parallel for schedule(static)
                       for (int64_t r = 0; r < rows; ++r)
                         layer_norm_row(a.x + r * columns, bias, bias, a.out + r * columns, columns,
                                        wide);
                     }),
             8.0 * n);
    }
    // The rows again with lazyfuse's numerics, each row's first loop asking for the lines of
    // the rows after it (8 KiB on where the operand may sit in the caches, 16 KiB where it is
    // 16 MiB or more, the distances that measured fastest), the output stored as lazyfuse
    // stores it (non-temporal from 16 MiB).
    const bool from_memory = n * 4 >= (int64_t{16} << 20);
    const int64_t ahead = from_memory ? 16 << 10 : 8 << 10;
    // Times row(x, out) over every row of each input set.
    auto report_rows = [&](const char* name, auto&& row) {
      report(name,
             time_ms(sets, per_batch,
                     [&](int s) {
                       const Arrays& a = data[s];
#pragma omp parallel for schedule(static)
                       for (int64_t r = 0; r < rows; ++r)
                         row(a.x + r * columns, a.out + r * columns);
                     }),
             8.0 * n);
    };
    report_rows("softmax rows, float64 sums, prefetch", [&](const float* x, float* out) {
      softmax_row(x, out, columns, true, true, ahead, from_memory);
    });
    report_rows("layernorm rows, float64 sums, prefetch", [&](const float* x, float* out) {
      layer_norm_row(x, bias, bias, out, columns, true, ahead, from_memory);
    });
    // The sum of squares, read only: each thread its contiguous half, four float32 vectors of
    // accumulators (as many chains as the adds' latency needs), asking for the line `ahead`
    // bytes on (none where 0); then memcpy of half of those bytes. (The benchmark's roof stores
    // past the caches from 16 MiB: the copy loop with non-temporal stores above.)
    for (int64_t sum_ahead : {int64_t{0}, int64_t{1} << 10, int64_t{4} << 10, int64_t{16} << 10}) {
      volatile float sink = 0;
      const std::string name =
          sum_ahead == 0 ? std::string("sum of squares")
                         : "sum of squares, prefetch " + std::to_string(sum_ahead >> 10) + " KiB";
      report(name.c_str(),
             time_ms(sets, per_batch,
                     [&](int s) {
                       const float* x = data[s].x;
                       float total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
                       for (int64_t part = 0; part < 64; ++part) {
                         __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                                          _mm512_setzero_ps(), _mm512_setzero_ps()};
                         for (int64_t i = part * (n / 64); i < (part + 1) * (n / 64); i += 64) {
                           for (int k = 0; k < 4; ++k) {
                             prefetch(x + i + 16 * k, sum_ahead);
                             const __m512 v = _mm512_loadu_ps(x + i + 16 * k);
                             acc[k] = _mm512_fmadd_ps(v, v, acc[k]);
                           }
                         }
                         total += _mm512_reduce_add_ps(_mm512_add_ps(
                             _mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
                       }
                       sink = total;
                     }),
             4.0 * n);
    }
    report("memcpy of half the sum's bytes, a part per thread",
           time_ms(sets, per_batch, [&](int s) { copy_in_parts(data[s], n / 2); }), 4.0 * n);
    // memcpy of the same bytes, a part per thread: the benchmark's roof below 16 MiB.
    report("memcpy, a part per thread",
           time_ms(sets, per_batch, [&](int s) { copy_in_parts(data[s], n); }), 8.0 * n);
    // Adam as the benchmark's workload writes it, one loop: parameter, gradient and moments in,
    // parameter and moments out with non-temporal stores, each a separate array as lazyfuse's
    // tensors are; its own input sets, as many as lazyfuse bench makes for its 28 bytes an
    // element.
    {
      const int adam_sets = static_cast<int>(std::clamp(std::ceil(240e6 / (28.0 * n)), 1.0, 8.0));
      std::vector<std::vector<float*>> adam(adam_sets);
      for (std::vector<float*>& arrays : adam)
        for (int k = 0; k < 7; ++k) {
          float* array = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
          for (int64_t i = 0; i < n; ++i) array[i] = 0.5f + 0.125f * static_cast<float>(i % 7);
          arrays.push_back(array);
        }
      report("adam, non-temporal stores",
             time_ms(adam_sets, per_batch,
                     [&](int s) {
                       const std::vector<float*>& a = adam[s];
                       const float *p = a[0], *g = a[1], *m = a[2], *v = a[3];
                       float *p_out = a[4], *m_out = a[5], *v_out = a[6];
                       auto splat = [](float c) { return _mm512_set1_ps(c); };
#pragma omp parallel for schedule(static)
                       for (int64_t i = 0; i < n; i += 16) {
                         const __m512 gi = _mm512_loadu_ps(g + i);
                         const __m512 m2 =
                             _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), splat(0.9f)),
                                           _mm512_mul_ps(gi, splat(0.1f)));
                         const __m512 v2 =
                             _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), splat(0.999f)),
                                           _mm512_mul_ps(_mm512_mul_ps(gi, gi), splat(0.001f)));
                         const __m512 step =
                             _mm512_div_ps(_mm512_mul_ps(m2, splat(1e-3f)),
                                           _mm512_add_ps(_mm512_sqrt_ps(v2), splat(1e-8f)));
                         store(p_out + i, _mm512_sub_ps(_mm512_loadu_ps(p + i), step), true);
                         store(m_out + i, m2, true);
                         store(v_out + i, v2, true);
                       }
                     }),
             28.0 * n);
      for (std::vector<float*>& arrays : adam)
        for (float* array : arrays) std::free(array);
    }
    for (Arrays& a : data)
      for (float* p : {a.x, a.y, a.out}) std::free(p);
    std::free(bias);
  }
}
