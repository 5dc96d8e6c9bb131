// Included before every file of the fuzzer build. clang 14 lacks the builtin that libstdc++'s
// std::source_location needs, so with it the type does not exist; ir/graph.h names it in
// SourceLoc::from, which nothing in the IR core calls. A stand-in lets the header compile.
#pragma once

#include <source_location>

#if !defined(__cpp_lib_source_location)
namespace std {
struct source_location {
  static constexpr source_location current() noexcept { return {}; }
  constexpr const char* file_name() const noexcept { return ""; }
  constexpr const char* function_name() const noexcept { return ""; }
  constexpr unsigned line() const noexcept { return 0; }
  constexpr unsigned column() const noexcept { return 0; }
};
}  // namespace std
#endif
