// Attributes, structural hashing and use lists.
#include "lazyfuse/ir/graph.h"

#include <algorithm>

#include <bit>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/stable_hash.h"

namespace lazyfuse {

std::string SourceLoc::str() const {
  if (!known()) return "<unknown>";
  std::string_view name = file;
  size_t slash = name.find_last_of('/');
  if (slash != std::string_view::npos) name.remove_prefix(slash + 1);
  return absl::StrCat(std::string(name), ":", line);
}

namespace {
std::string_view intern_key(std::string_view key) {
  for (std::string_view known : kAttrKeys) {
    if (known == key) return known;
  }
  throw VerifierError(absl::StrCat("unknown attribute '", std::string(key), "'"));
}
}  // namespace

void Attrs::set(std::string_view key, AttrValue value) {
  key = intern_key(key);
  auto it = std::lower_bound(entries_.begin(), entries_.end(), key,
                             [](const auto& entry, std::string_view k) { return entry.first < k; });
  if (it != entries_.end() && it->first == key) {
    it->second = std::move(value);
  } else {
    entries_.insert(it, {key, std::move(value)});
  }
}

bool Attrs::has(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return true;
  }
  return false;
}

const AttrValue& Attrs::get(std::string_view key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return v;
  }
  throw VerifierError(absl::StrCat("missing attribute '", std::string(key), "'"));
}

int64_t Attrs::get_int(std::string_view key) const {
  const AttrValue& v = get(key);
  if (auto* i = std::get_if<int64_t>(&v)) return *i;
  throw VerifierError(absl::StrCat("attribute '", std::string(key), "' must be an integer"));
}

double Attrs::get_float(std::string_view key) const {
  const AttrValue& v = get(key);
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  throw VerifierError(absl::StrCat("attribute '", std::string(key), "' must be a number"));
}

bool Attrs::get_bool(std::string_view key) const {
  const AttrValue& v = get(key);
  if (auto* b = std::get_if<bool>(&v)) return *b;
  throw VerifierError(absl::StrCat("attribute '", std::string(key), "' must be true or false"));
}

const std::vector<int64_t>& Attrs::get_ints(std::string_view key) const {
  const AttrValue& v = get(key);
  if (auto* list = std::get_if<std::vector<int64_t>>(&v)) return *list;
  throw VerifierError(
      absl::StrCat("attribute '", std::string(key), "' must be a list of integers"));
}

std::string Node::type_str() const {
  return absl::StrCat(std::string(dtype_ir_name(dtype)), "[", absl::StrJoin(shape, ","), "] @",
                      device.str());
}

int Graph::num_params() const {
  int n = 0;
  while (n < static_cast<int>(nodes.size()) && nodes[n].op == Op::Param) ++n;
  return n;
}

StableHash& StableHash::add(double x) { return add(std::bit_cast<uint64_t>(x)); }
StableHash& StableHash::add(std::string_view text) {
  add(text.size());
  for (char c : text) add(static_cast<uint64_t>(static_cast<unsigned char>(c)));
  return *this;
}

uint64_t hash_attrs(const Attrs& attrs) {
  StableHash h;
  for (const auto& [key, value] : attrs.entries()) {
    h.add(key).add(value.index());
    std::visit([&](const auto& v) { h.add(v); }, value);
  }
  return h.value();
}

std::vector<uint64_t> structural_hashes(const Graph& graph) {
  std::vector<uint64_t> hashes(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& node = graph.nodes[i];
    std::vector<uint64_t> input_hashes;
    input_hashes.reserve(node.inputs.size());
    for (ValueId input : node.inputs) input_hashes.push_back(hashes[input]);
    uint64_t attrs_hash = hash_attrs(node.attrs);
    hashes[i] = StableHash()
                    .add(node.op)
                    .add(node.dtype)
                    .add(node.shape)
                    .add(node.device)
                    .add(attrs_hash)
                    .add(input_hashes)
                    .add(node.op == Op::Param ? static_cast<int64_t>(i) : -1)
                    .value();
  }
  return hashes;
}

std::vector<std::vector<ValueId>> users_of(const Graph& graph) {
  std::vector<std::vector<ValueId>> users(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    for (ValueId input : graph.nodes[i].inputs) users[input].push_back(static_cast<ValueId>(i));
  }
  return users;
}

}  // namespace lazyfuse
