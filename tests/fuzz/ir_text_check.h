// What every input of the IR text fuzzer must satisfy, shared by the libFuzzer target
// (ir_parser_fuzzer.cc) and the test that replays its corpus (tests/ir_corpus_test.cc).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "lazyfuse/ir/graph.h"

namespace lazyfuse::fuzz {

// Parses `text`. Text that does not parse must be rejected with a lazyfuse::Error. A graph that
// parses goes to the verifier, which may reject it only with a lazyfuse::Error, and to the
// printer, with and without locations: the printed text must parse back, print the same and
// get the same verdict from the verifier. Returns what went wrong, or "" when nothing did.
// Exceptions other than lazyfuse::Error propagate: they are findings too.
std::string check_ir_text(std::string_view text);

// The graph `text` describes when it parses and verifies; nullopt when either rejects it with
// a lazyfuse::Error (the IR text fuzzer's ground, which the later fuzzers skip).
std::optional<Graph> parsed_and_verified(std::string_view text);

}  // namespace lazyfuse::fuzz
