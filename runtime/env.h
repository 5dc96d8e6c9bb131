// The environment variables lazyfuse reads, parsed once per process (README lists them).
#pragma once

#include <cstdint>
#include <string>

namespace lazyfuse {

struct EnvConfig {
  bool dump_ir = false;  // LAZYFUSE_DUMP contains "ir": each graph before and after each pass
  int debug = 0;         // LAZYFUSE_DEBUG=1: one line per evaluation
  bool fusion = true;    // LAZYFUSE_FUSION=0: one kernel per op
  // LAZYFUSE_HALF_ROUNDING=each_op: half-type values rounded after every op inside fused
  // kernels, as one kernel per op does, rather than kept in float32 and rounded where stored,
  // the default (ir/schedule.h).
  bool half_rounding_at_stores = true;
  // LAZYFUSE_MAX_PENDING: pending values made since the last evaluation that trigger one
  // (Note [Bounding pending work] in lazy.cc).
  int64_t max_pending = 65536;
  bool dump_fusion = false;  // LAZYFUSE_DUMP contains "fusion": each graph's kernels
  bool dump_cuda = false;    // LAZYFUSE_DUMP contains "cuda": each generated kernel's source
  std::string dump_dir;      // LAZYFUSE_DUMP_DIR: also write generated sources there as files
  bool sync = false;         // LAZYFUSE_SYNC=1: wait for each kernel, so errors name it
  std::string cache_dir;     // LAZYFUSE_CACHE_DIR (default ~/.cache/lazyfuse; "" disables)
  bool fast_math = false;    // LAZYFUSE_FAST_MATH=1: hardware approximations on the GPU
  bool blas_cublaslt =
      false;  // LAZYFUSE_BLAS=cublaslt: products by cuBLASLt (runtime/cuda/cublas.h)
  // LAZYFUSE_SKINNY_MATMUL=0: products of few rows by the BLAS library too, not lazyfuse's own
  // kernel (Note [Products of few rows] in codegen/cuda/cuda_matmul.cc).
  bool skinny_matmul = true;
  // LAZYFUSE_CUDA_GRAPHS (runtime/cuda/cuda_graphs.h): 0 off, 1 on (the default), 2 ("always") for
  // every schedule from its first run that can be.
  int cuda_graphs = 1;
  // LAZYFUSE_CUDA_GRAPH_CACHE: the CUDA graphs kept in all, least recently used dropped first.
  int64_t cuda_graph_cache = 64;
  // LAZYFUSE_HOST_CACHE_MB: the most freed host memory kept for reuse (runtime/host_memory.h);
  // -1, the default, is a quarter of physical memory.
  int64_t host_cache_mb = -1;
  // LAZYFUSE_BLOCKS_PER_SM: a cap on an elementwise kernel's grid, in blocks per
  // multiprocessor (each thread loops over the rest); 0, the default: no cap, a thread per
  // element or vector, which measured fastest on the H200 (docs/benchmarks.md).
  int64_t blocks_per_sm = 0;
  // LAZYFUSE_REDUCE_CHUNK: the columns of a GPU reduction's row that one block reduces before
  // the partials are combined (0, the default: codegen's cuda_reduce_chunk, by size). The result's
  // bits depend on it, so it is a tuning knob for measurements, not a setting to vary in
  // production.
  int64_t reduce_chunk = 0;
  // LAZYFUSE_ATTENTION=composite: attention as its matmuls and softmax, not one attention step
  // (nn::functional::set_fused_attention_enabled).
  bool fused_attention = true;
};

const EnvConfig& env_config();

// The environment is parsed once per process; tests and the benchmark's compile-latency
// measurement, which need their own cache directory (or fast math), set them here. Not safe
// while another thread evaluates.
void set_cache_dir(std::string dir);
void set_fast_math_for_testing(bool fast_math);

}  // namespace lazyfuse
