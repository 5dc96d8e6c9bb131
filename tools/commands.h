// The subcommands of the lazyfuse tool, one function each (tools/cmd_*.cc). Each returns the
// process's exit status and reports errors as FILE:LINE:COL: error: ... where a file is at fault.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "lazyfuse/ir/graph.h"
#include "tools/replay.h"

namespace lazyfuse::tools {

// Reads and parses an IR file ("-" is standard input); throws ToolError with the
// FILE:LINE:COL prefix on a parse error.
Graph load_graph(const std::string& path);

// `passes`: a comma-separated list of pass names; absent runs every pass, empty none.
int opt(const std::string& path, const std::optional<std::string>& passes, bool print_after_all,
        const std::vector<std::string>& print_after);
int codegen(const std::string& path, const std::string& target, bool with_prologue);
int compile(const std::string& path, const std::string& arch);
// Without a reference, prints the outputs; with one, also checks them against it.
int run(const std::string& path, const std::string& device, uint64_t seed,
        std::optional<Reference> reference);
int dot(const std::string& path, bool fused, const std::string& output);
int fuzz(uint64_t seed, int64_t graphs, const std::string& device, bool shrink, bool rows = false);
// Runs `command` as `nproc` processes of one job on this machine (tools/cmd_launch.cc).
int launch(int nproc, int master_port, double grace_seconds,
           const std::vector<std::string>& command);

}  // namespace lazyfuse::tools
