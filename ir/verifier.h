// The verifier: every invariant of the IR, checked between passes in debug builds and on every
// graph that is parsed from text.
#pragma once

#include "lazyfuse/ir/graph.h"

namespace lazyfuse {

struct VerifyOptions {
  // After placement: every node's operands are on its device, except across a transfer.
  bool placed = false;
};

// Throws VerifierError naming the node (%i, its op and its origin) and the broken rule.
void verify(const Graph& graph, const VerifyOptions& options = {});

}  // namespace lazyfuse
