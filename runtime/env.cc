#include "lazyfuse/runtime/env.h"

#include <cstdlib>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace lazyfuse {

namespace {

EnvConfig& mutable_env_config() {
  static EnvConfig config = [] {
    EnvConfig c;
    if (const char* dump = std::getenv("LAZYFUSE_DUMP")) {
      for (absl::string_view item : absl::StrSplit(dump, ',')) {
        c.dump_ir |= item == "ir";
        c.dump_fusion |= item == "fusion";
        c.dump_cuda |= item == "cuda";
      }
    }
    if (const char* debug = std::getenv("LAZYFUSE_DEBUG")) (void)absl::SimpleAtoi(debug, &c.debug);
    if (c.debug >= 2) c.dump_ir = true;
    if (const char* fusion = std::getenv("LAZYFUSE_FUSION"))
      c.fusion = std::string_view(fusion) != "0";
    if (const char* bound = std::getenv("LAZYFUSE_MAX_PENDING"))
      (void)absl::SimpleAtoi(bound, &c.max_pending);
    if (const char* blocks = std::getenv("LAZYFUSE_BLOCKS_PER_SM"))
      (void)absl::SimpleAtoi(blocks, &c.blocks_per_sm);
    if (const char* chunk = std::getenv("LAZYFUSE_REDUCE_CHUNK"))
      (void)absl::SimpleAtoi(chunk, &c.reduce_chunk);
    if (c.debug >= 3) c.dump_cuda = true;
    if (const char* dir = std::getenv("LAZYFUSE_DUMP_DIR")) c.dump_dir = dir;
    if (const char* sync = std::getenv("LAZYFUSE_SYNC")) c.sync = std::string_view(sync) == "1";
    if (const char* fast = std::getenv("LAZYFUSE_FAST_MATH"))
      c.fast_math = std::string_view(fast) == "1";
    if (const char* blas = std::getenv("LAZYFUSE_BLAS"))
      c.blas_cublaslt = std::string_view(blas) == "cublaslt";
    if (const char* attention = std::getenv("LAZYFUSE_ATTENTION"))
      c.fused_attention = std::string_view(attention) != "composite";
    if (const char* rounding = std::getenv("LAZYFUSE_HALF_ROUNDING"))
      c.half_rounding_at_stores = std::string_view(rounding) != "each_op";
    if (const char* skinny = std::getenv("LAZYFUSE_SKINNY_MATMUL"))
      c.skinny_matmul = std::string_view(skinny) != "0";
    if (const char* graphs = std::getenv("LAZYFUSE_CUDA_GRAPHS"))
      c.cuda_graphs = std::string_view(graphs) == "0"        ? 0
                      : std::string_view(graphs) == "always" ? 2
                                                             : 1;
    if (const char* graphs = std::getenv("LAZYFUSE_CUDA_GRAPH_CACHE"))
      (void)absl::SimpleAtoi(graphs, &c.cuda_graph_cache);
    if (const char* host = std::getenv("LAZYFUSE_HOST_CACHE_MB"))
      (void)absl::SimpleAtoi(host, &c.host_cache_mb);
    if (const char* cache = std::getenv("LAZYFUSE_CACHE_DIR")) {
      c.cache_dir = cache;
    } else if (const char* home = std::getenv("HOME")) {
      c.cache_dir = std::string(home) + "/.cache/lazyfuse";
    }
    return c;
  }();
  return config;
}

}  // namespace

const EnvConfig& env_config() { return mutable_env_config(); }

void set_cache_dir(std::string dir) { mutable_env_config().cache_dir = std::move(dir); }
void set_fast_math_for_testing(bool fast_math) { mutable_env_config().fast_math = fast_math; }

}  // namespace lazyfuse
