// Test-case reduction for IR graphs: given a graph that makes some check fail, find a smaller
// graph that still makes it fail. `lazyfuse fuzz` shrinks each failing random graph this way
// before printing it, so that a report is a handful of nodes rather than dozens.
#pragma once

#include <functional>

#include "lazyfuse/ir/graph.h"

namespace lazyfuse::tools {

struct ShrinkOptions {
  // The most calls of the predicate; shrinking then stops with the smallest graph found so far.
  // Each call may evaluate a graph on a GPU, so the bound is what keeps a report timely.
  int max_attempts = 4000;
};

struct ShrinkResult {
  Graph graph;
  int attempts = 0;        // calls of the predicate
  int accepted = 0;        // reductions kept
  bool exhausted = false;  // stopped by max_attempts rather than because nothing more shrank
};

// Shrinks `graph`, which is taken to fail, by steps that each keep the graph failing: dropping
// outputs, replacing a node by one of its operands or by a fresh param of its type, dropping
// what the outputs no longer need, shrinking sizes and dropping dims of size 1. After each step
// the dtype and shape of every node follow from its new operands by the ops' rules, and
// `still_fails` is asked only about graphs that pass the verifier. Every kept step makes the
// graph strictly smaller (fewer computed nodes, then fewer nodes, outputs, elements and dims),
// so shrinking ends; it ends at a graph from which no single step keeps the failure.
ShrinkResult shrink_graph(const Graph& graph, const std::function<bool(const Graph&)>& still_fails,
                          const ShrinkOptions& options = {});

}  // namespace lazyfuse::tools
