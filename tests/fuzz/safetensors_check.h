// What every input of the safetensors fuzzer must satisfy, shared by the libFuzzer target
// (safetensors_fuzzer.cc) and the test that replays its corpus (tests/serialize_test.cc).
#pragma once

#include <string>
#include <string_view>

namespace lazyfuse::fuzz {

// Loads `bytes` as a safetensors file onto the CPU. A file the loader refuses must be refused
// with a SerializationError. A file it accepts must save again to bytes that load to the same
// names, dtypes, shapes and bytes, and saving those must give the same bytes again (the writer's
// layout is canonical). Returns what went wrong, or "" when nothing did. Exceptions other than
// SerializationError propagate: they are findings too.
std::string check_safetensors(std::string_view bytes);

}  // namespace lazyfuse::fuzz
