// The IR text parser: reads what printer.cc prints, tolerating extra whitespace, blank lines
// and `//` comments. It checks only what it needs to build a Graph (syntax, names that resolve,
// known ops, dtypes, devices and attribute keys); types and arity are the verifier's job.
//
// Grammar (whitespace and comments may appear between any two tokens; %N, @name and @device
// are single tokens):
//   graph  := 'graph' '@' NAME '(' [param (',' param)*] ')' '{' (node | kernel)* return '}'
//   param  := '%N' ':' type [loc]
//   node   := '%N' '=' OP [value (',' value)*] ['{' [attr (',' attr)*] '}'] ':' type [loc]
//   kernel := 'kernel' [KIND] '@' NAME '(' [value (',' value)*] ')' '->'
//             '(' [value (',' value)*] ')' '{' node* '}'
//   return := 'return' [value (',' value)*]
//   type   := DTYPE '[' [INT (',' INT)*] ']' '@' DEVICE
//   attr   := KEY '=' (INT | FLOAT | 'true' | 'false' | '[' [INT (',' INT)*] ']')
//   loc    := 'loc' '(' STRING ':' INT ':' INT ')'
//
// Note [Definition order]: params are %0, %1, ... in order. Body nodes may be defined in any
// order that defines each value before its uses, because fused IR (print_schedule) lists
// nodes in the order of the schedule's steps, and a kernel's members need not be consecutive
// numbers (exp %1 and sin %3 in one kernel, the sum %2 of exp in a step after it). Node %i is
// still the graph's i-th node: each operand must have a smaller number than its user, and the
// numbers must run from %0 without gaps, so the Graph is the one that was printed.
//
// A kernel region groups nodes and defines no values of its own: its members are ordinary
// nodes, and the Graph does not keep the grouping, the kind (a step_kind_name) or the roles
// printed beside the members as comments (fusion recomputes them). Its header is checked
// against the members: each operand is a value defined before the region, each result is
// computed in the region (or is a constant defined before it: a scalar constant that several
// kernels recompute prints once, outside them), and a member reads only the operands, other
// members and constants.
#include <charconv>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lazyfuse/ir/errors.h"
#include "lazyfuse/ir/graph.h"
#include "lazyfuse/ir/schedule.h"

namespace lazyfuse {
namespace {

// Message building without absl::StrCat, which in the installed abseil does not take
// std::string_view (its absl::string_view is a distinct class).
void append_part(std::string* out, std::string_view text) { out->append(text); }
void append_part(std::string* out, int64_t number) { out->append(std::to_string(number)); }
void append_part(std::string* out, int number) { out->append(std::to_string(number)); }

template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (append_part(&out, parts), ...);
  return out;
}

// SourceLoc::file must outlive every graph that points at it, and parsed graphs may be copied
// anywhere, so file names live for the rest of the process. The set only grows by the distinct
// file names ever parsed, which is small.
const char* intern_file_name(std::string_view name) {
  static std::mutex* mutex = new std::mutex;
  static auto* names = new std::set<std::string, std::less<>>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = names->find(name);
  if (it == names->end()) it = names->emplace(name).first;
  // std::set nodes never move, so the pointer stays valid as the set grows.
  return it->c_str();
}

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c); }

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Graph parse() {
    Graph graph;
    skip_space();
    expect_keyword("graph");
    parse_graph_name(&graph);
    expect('(');
    if (!accept(')')) {
      do {
        parse_param(&graph);
      } while (accept(','));
      expect(')');
    }
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '%') {
        parse_node(graph, nullptr);
        continue;
      }
      size_t at = pos_;
      std::string_view word = read_ident();
      if (word == "return") break;
      if (word == "kernel") {
        parse_kernel(graph);
        continue;
      }
      fail(at, "expected a value definition '%N = ...' or 'return'");
    }
    skip_space();
    if (peek() == '%') {
      do {
        graph.outputs.push_back(parse_use(graph, std::nullopt));
      } while (accept(','));
    }
    add_body_nodes(&graph);
    expect('}');
    skip_space();
    if (pos_ != text_.size()) fail(pos_, "unexpected text after the end of the graph");
    return graph;
  }

 private:
  // The error's position is that of the offending token, counted in bytes from 1.
  [[noreturn]] void fail(size_t at, std::string_view message) const {
    int line = 1;
    int column = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw ParseError(cat(line, ":", column, ": error: ", message), line, column);
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  void skip_space() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        ++pos_;
      } else if (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  bool accept(char c) {
    skip_space();
    if (peek() != c) return false;
    ++pos_;
    return true;
  }

  void expect(char c) {
    if (!accept(c)) fail(pos_, cat("expected '", std::string_view(&c, 1), "'"));
  }

  // An identifier at the current position (no space skipped), or "" when there is none.
  std::string_view read_ident() {
    size_t start = pos_;
    if (pos_ < text_.size() && is_ident_start(text_[pos_])) {
      while (pos_ < text_.size() && is_ident_char(text_[pos_])) ++pos_;
    }
    return text_.substr(start, pos_ - start);
  }

  // Characters of `allowed` at the current position (no space skipped).
  template <typename Pred>
  std::string_view read_while(Pred allowed) {
    size_t start = pos_;
    while (pos_ < text_.size() && allowed(text_[pos_])) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  void expect_keyword(std::string_view keyword) {
    skip_space();
    size_t at = pos_;
    if (read_ident() != keyword) fail(at, cat("expected '", keyword, "'"));
  }

  // A "..." literal with the printer's escapes; the opening quote is at the current position.
  std::string read_string() {
    size_t open = pos_;
    ++pos_;
    std::string value;
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') fail(open, "unterminated string");
      char c = text_[pos_++];
      if (c == '"') return value;
      if (c != '\\') {
        value.push_back(c);
        continue;
      }
      size_t escape = pos_ - 1;
      char e = peek();
      ++pos_;
      switch (e) {
        case '"':
          value.push_back('"');
          break;
        case '\\':
          value.push_back('\\');
          break;
        case 'n':
          value.push_back('\n');
          break;
        case 't':
          value.push_back('\t');
          break;
        case 'x': {
          // Two hex digits and nothing else: from_chars alone would take "-1" as a number.
          auto hex = [](char h) {
            return is_digit(h) || (h >= 'a' && h <= 'f') || (h >= 'A' && h <= 'F');
          };
          if (pos_ + 2 > text_.size() || !hex(text_[pos_]) || !hex(text_[pos_ + 1]))
            fail(escape, "invalid escape in string (expected \\xHH)");
          int byte = 0;
          std::from_chars(text_.data() + pos_, text_.data() + pos_ + 2, byte, 16);
          value.push_back(static_cast<char>(byte));
          pos_ += 2;
          break;
        }
        default:
          fail(escape, "invalid escape in string");
      }
    }
  }

  void parse_graph_name(Graph* graph) {
    skip_space();
    size_t at = pos_;
    if (peek() != '@') fail(at, "expected '@' and the graph's name");
    ++pos_;
    if (peek() == '"') {
      graph->name = read_string();
      return;
    }
    std::string_view name =
        read_while([](char c) { return is_ident_char(c) || c == '.' || c == '$'; });
    if (name.empty() || !is_ident_start(name[0])) fail(at, "expected the graph's name after '@'");
    graph->name = std::string(name);
  }

  // An integer token (optional '-', then digits) at the current position, after space.
  int64_t parse_int(std::string_view what) {
    skip_space();
    size_t at = pos_;
    std::string_view digits = read_while(
        [](char c) { return is_digit(c) || c == '-' || c == '.' || is_ident_char(c) || c == '+'; });
    int64_t value = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || end != digits.data() + digits.size() || ec == std::errc::invalid_argument)
      fail(at, cat("expected ", what));
    if (ec == std::errc::result_out_of_range) fail(at, cat("integer out of range: ", digits));
    return value;
  }

  // "%N" at the current position, after space; returns N and where the token began.
  std::pair<int64_t, size_t> parse_value_name() {
    skip_space();
    size_t at = pos_;
    if (peek() != '%') fail(at, "expected a value name (%N)");
    ++pos_;
    std::string_view digits = read_while(is_digit);
    if (digits.empty()) fail(at, "expected a value name (%N)");
    int64_t number = 0;
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
    // Too large to be any node's number: undefined, like any other number past the last node.
    if (ec != std::errc()) number = INT64_MAX;
    return {number, at};
  }

  // A body node as parsed, before the numbers are known to run without gaps.
  struct Definition {
    Node node;
    size_t at = 0;  // where its %N is
  };

  // The kernel region being parsed: what its members may read.
  struct Region {
    std::string_view name;
    std::set<ValueId> operands;
    std::set<ValueId> members;
  };

  bool is_defined(const Graph& graph, int64_t number) const {
    return (number >= 0 && number < static_cast<int64_t>(graph.nodes.size())) ||
           (number >= 0 && number <= INT32_MAX && body_.count(static_cast<ValueId>(number)) > 0);
  }

  // The node that defines `id`, a defined value.
  const Node& node_of(const Graph& graph, ValueId id) const {
    if (id < static_cast<ValueId>(graph.nodes.size())) return graph.nodes[id];
    return body_.at(id).node;
  }

  // A use of a defined value; `user`, when the use is an operand, is the number of the node
  // being defined, which must be larger (Note [Definition order]).
  ValueId parse_use(const Graph& graph, std::optional<ValueId> user) {
    auto [number, at] = parse_value_name();
    std::string_view name = text_.substr(at, pos_ - at);
    if (!is_defined(graph, number)) fail(at, cat("use of undefined value ", name));
    if (user && number > *user)
      fail(at, cat("operand ", name, " of %", static_cast<int64_t>(*user),
                   " has a larger number than its user (operands are numbered below their users)"));
    return static_cast<ValueId>(number);
  }

  // The lowest number at or past the params that no body node defines yet.
  int64_t lowest_undefined(const Graph& graph) const {
    int64_t number = static_cast<int64_t>(graph.nodes.size());
    for (auto it = body_.lower_bound(static_cast<ValueId>(number));
         it != body_.end() && it->first == number; ++it)
      ++number;
    return number;
  }

  // A param must name the next value: param i defines %i.
  void parse_param_definition(const Graph& graph) {
    auto [number, at] = parse_value_name();
    int64_t expected = static_cast<int64_t>(graph.nodes.size());
    std::string_view name = text_.substr(at, pos_ - at);
    if (number < expected) fail(at, cat("redefinition of value ", name));
    if (number > expected)
      fail(at, cat("value ", name, " defined out of order (expected %", expected, ")"));
  }

  // A body node may name any value not defined yet (Note [Definition order]); gaps are found
  // once the body is read (add_body_nodes). Returns the number and where it was.
  std::pair<ValueId, size_t> parse_body_definition(const Graph& graph) {
    auto [number, at] = parse_value_name();
    std::string_view name = text_.substr(at, pos_ - at);
    if (is_defined(graph, number)) fail(at, cat("redefinition of value ", name));
    // A ValueId is 32 bits; no graph has that many nodes, so a number past them leaves a gap.
    if (number >= INT32_MAX)
      fail(at,
           cat("value ", name, " defined out of order (expected %", lowest_undefined(graph), ")"));
    return {static_cast<ValueId>(number), at};
  }

  void parse_param(Graph* graph) {
    parse_param_definition(*graph);
    Node node;
    node.op = Op::Param;
    expect(':');
    parse_type_and_loc(&node);
    graph->add(std::move(node));
  }

  // A node of the body, or of `region` when inside a kernel.
  void parse_node(const Graph& graph, Region* region) {
    auto [id, def_at] = parse_body_definition(graph);
    Node node;
    expect('=');
    skip_space();
    size_t op_at = pos_;
    std::string_view op = read_ident();
    if (op.empty()) fail(op_at, "expected an op name");
    std::optional<Op> parsed_op = op_from_name(op);
    if (!parsed_op) fail(op_at, cat("unknown op '", op, "'"));
    node.op = *parsed_op;
    skip_space();
    if (peek() == '%') {
      do {
        skip_space();
        size_t use_at = pos_;
        ValueId input = parse_use(graph, id);
        if (region && !region->operands.count(input) && !region->members.count(input) &&
            node_of(graph, input).op != Op::Const)
          fail(use_at, cat("kernel @", region->name, " reads ", text_.substr(use_at, pos_ - use_at),
                           ", which is neither one of its operands nor computed in it"));
        node.inputs.push_back(input);
      } while (accept(','));
    }
    if (accept('{')) parse_attrs(&node.attrs);
    expect(':');
    parse_type_and_loc(&node);
    if (region) region->members.insert(id);
    body_.emplace(id, Definition{std::move(node), def_at});
  }

  // After 'kernel': the header, then the member nodes up to the closing '}'.
  void parse_kernel(const Graph& graph) {
    Region region;
    skip_space();
    if (peek() != '@') {
      const size_t kind_at = pos_;
      const std::string_view kind = read_ident();
      if (!step_kind_named(kind))
        fail(kind_at, cat("expected a kernel kind (elementwise, reduction, row, ...) or '@' and "
                          "the kernel's name, not '",
                          kind, "'"));
      skip_space();
    }
    size_t name_at = pos_;
    if (peek() != '@') fail(name_at, "expected '@' and the kernel's name");
    ++pos_;
    region.name = read_ident();
    if (region.name.empty()) fail(name_at, "expected the kernel's name after '@'");
    expect('(');
    if (!accept(')')) {
      do {
        auto [number, at] = parse_value_name();
        std::string_view name = text_.substr(at, pos_ - at);
        if (!is_defined(graph, number))
          fail(at, cat("kernel operand ", name, " is not defined before the kernel"));
        if (!region.operands.insert(static_cast<ValueId>(number)).second)
          fail(at, cat("kernel operand ", name, " is listed twice"));
      } while (accept(','));
      expect(')');
    }
    skip_space();
    if (text_.substr(pos_, 2) != "->") fail(pos_, "expected '->' and the kernel's results");
    pos_ += 2;
    expect('(');
    // Results are checked at the closing '}', once the members that compute them are read.
    struct Result {
      int64_t number;
      size_t at;
      std::string_view name;
    };
    std::vector<Result> results;
    if (!accept(')')) {
      do {
        auto [number, at] = parse_value_name();
        Result result{number, at, text_.substr(at, pos_ - at)};
        for (const Result& earlier : results)
          if (earlier.number == number)
            fail(at, cat("kernel result ", result.name, " is listed twice"));
        results.push_back(result);
      } while (accept(','));
      expect(')');
    }
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '%') {
        parse_node(graph, &region);
        continue;
      }
      if (accept('}')) break;
      fail(pos_, "expected a value definition '%N = ...' or '}' to end the kernel");
    }
    for (const Result& result : results) {
      const bool defined = is_defined(graph, result.number);
      const bool computed = defined && region.members.count(static_cast<ValueId>(result.number));
      // A constant defined before the region: one that several kernels recompute.
      const bool shared_constant =
          defined && node_of(graph, static_cast<ValueId>(result.number)).op == Op::Const;
      if (!computed && !shared_constant)
        fail(result.at, cat("kernel result ", result.name, " is not computed in the kernel"));
    }
  }

  // The body's nodes into `graph`, in order of their numbers, which must run from the params
  // on without gaps.
  void add_body_nodes(Graph* graph) {
    for (auto it = body_.begin(); it != body_.end(); ++it) {
      const int64_t expected = static_cast<int64_t>(graph->nodes.size());
      if (it->first != expected) {
        // Where the text first went past the missing number: the earliest definition above it.
        size_t at = it->second.at;
        ValueId number = it->first;
        for (auto later = it; later != body_.end(); ++later) {
          if (later->second.at < at) {
            at = later->second.at;
            number = later->first;
          }
        }
        fail(at, cat("value %", static_cast<int64_t>(number), " defined out of order (expected %",
                     expected, ")"));
      }
      graph->add(std::move(it->second.node));
    }
    body_.clear();
  }

  // After the opening '{'.
  void parse_attrs(Attrs* attrs) {
    if (accept('}')) return;
    do {
      skip_space();
      size_t key_at = pos_;
      std::string_view key = read_ident();
      if (key.empty()) fail(key_at, "expected an attribute name");
      if (attrs->has(key)) fail(key_at, cat("duplicate attribute '", key, "'"));
      expect('=');
      AttrValue value = parse_attr_value();
      try {
        attrs->set(key, std::move(value));
      } catch (const VerifierError& e) {
        fail(key_at, e.what());
      }
    } while (accept(','));
    expect('}');
  }

  AttrValue parse_attr_value() {
    skip_space();
    if (accept('[')) return parse_int_list_rest();
    size_t at = pos_;
    std::string_view word =
        read_while([](char c) { return is_ident_char(c) || c == '.' || c == '-' || c == '+'; });
    if (word.empty()) fail(at, "expected an attribute value");
    if (word == "true") return true;
    if (word == "false") return false;
    std::string_view digits = word.substr(word[0] == '-' ? 1 : 0);
    bool integer_syntax = !digits.empty();
    for (char c : digits) integer_syntax = integer_syntax && is_digit(c);
    if (integer_syntax) {
      int64_t value = 0;
      auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
      if (ec != std::errc()) fail(at, cat("integer out of range: ", word));
      return value;
    }
    double value = 0;
    auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    if (ec == std::errc::invalid_argument || end != word.data() + word.size())
      fail(at, cat("invalid attribute value '", word, "'"));
    if (ec == std::errc::result_out_of_range) fail(at, cat("float out of range: ", word));
    return value;
  }

  // "INT, INT]" after the opening '['.
  std::vector<int64_t> parse_int_list_rest() {
    std::vector<int64_t> values;
    if (accept(']')) return values;
    do {
      values.push_back(parse_int("an integer"));
    } while (accept(','));
    expect(']');
    return values;
  }

  void parse_type_and_loc(Node* node) {
    skip_space();
    size_t dtype_at = pos_;
    std::string_view dtype = read_while(is_ident_char);
    if (dtype.empty()) fail(dtype_at, "expected a dtype");
    try {
      node->dtype = parse_dtype(dtype);
    } catch (const ParseError& e) {
      // parse_dtype knows no position; its message says what is accepted.
      fail(dtype_at, e.what());
    }
    expect('[');
    std::vector<int64_t> sizes = parse_int_list_rest();
    node->shape.assign(sizes.begin(), sizes.end());
    skip_space();
    size_t device_at = pos_;
    if (peek() != '@') fail(device_at, "expected '@' and a device");
    ++pos_;
    std::string_view device = read_while([](char c) { return is_ident_char(c) || c == ':'; });
    if (device.empty()) fail(pos_, "expected a device after '@'");
    try {
      node->device = Device(device);
    } catch (const DeviceStringError& e) {
      fail(device_at, e.what());
    }
    skip_space();
    size_t loc_at = pos_;
    if (read_ident() == "loc") {
      node->where = parse_loc_rest();
    } else {
      pos_ = loc_at;
    }
  }

  // "(\"FILE\":LINE:COL)" after 'loc'.
  SourceLoc parse_loc_rest() {
    expect('(');
    skip_space();
    if (peek() != '"') fail(pos_, "expected a file name string");
    std::string file = read_string();
    expect(':');
    uint32_t line = parse_loc_number("line number");
    expect(':');
    uint32_t column = parse_loc_number("column number");
    expect(')');
    return {intern_file_name(file), line, column};
  }

  uint32_t parse_loc_number(std::string_view what) {
    skip_space();
    size_t at = pos_;
    int64_t value = parse_int(cat("a ", what));
    if (value < 0 || value > UINT32_MAX) fail(at, cat(what, " out of range"));
    return static_cast<uint32_t>(value);
  }

  std::string_view text_;
  size_t pos_ = 0;
  // Body nodes by number, until add_body_nodes moves them into the graph.
  std::map<ValueId, Definition> body_;
};

}  // namespace

Graph parse_graph(std::string_view text) { return Parser(text).parse(); }

}  // namespace lazyfuse
