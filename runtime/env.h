// The environment variables lazyfuse reads, parsed once per process (README lists them).
#pragma once

#include <cstdint>
#include <string>

namespace lazyfuse {

struct EnvConfig {
  bool dump_ir = false;        // LAZYFUSE_DUMP contains "ir": each graph before and after each pass
  int debug = 0;               // LAZYFUSE_DEBUG=1: one line per evaluation
  bool fusion = true;          // LAZYFUSE_FUSION=0: one kernel per op
  int64_t max_pending = 4096;  // LAZYFUSE_MAX_PENDING: pending nodes that trigger evaluation
};

const EnvConfig& env_config();

}  // namespace lazyfuse
