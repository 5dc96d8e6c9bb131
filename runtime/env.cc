#include "runtime/env.h"

#include <cstdlib>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace lazyfuse {

const EnvConfig& env_config() {
  static const EnvConfig config = [] {
    EnvConfig c;
    if (const char* dump = std::getenv("LAZYFUSE_DUMP")) {
      for (absl::string_view item : absl::StrSplit(dump, ',')) c.dump_ir |= item == "ir";
    }
    if (const char* debug = std::getenv("LAZYFUSE_DEBUG")) (void)absl::SimpleAtoi(debug, &c.debug);
    if (c.debug >= 2) c.dump_ir = true;
    if (const char* fusion = std::getenv("LAZYFUSE_FUSION"))
      c.fusion = std::string_view(fusion) != "0";
    if (const char* bound = std::getenv("LAZYFUSE_MAX_PENDING"))
      (void)absl::SimpleAtoi(bound, &c.max_pending);
    return c;
  }();
  return config;
}

}  // namespace lazyfuse
