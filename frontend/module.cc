// nn::Module's registry and walks (parameters, buffers, to, train), ModuleList, ModuleDict and
// skip_init.
#include "lazyfuse/frontend/module.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <typeinfo>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "lazyfuse/frontend/autograd.h"
#include "lazyfuse/ir/errors.h"

namespace lazyfuse::nn {
namespace {

thread_local int skip_init_depth = 0;

void check_registered_name(const std::string& name, const char* registering) {
  if (name.empty()) throw KeyError(absl::StrCat(registering, ": name can't be empty string \"\""));
  if (name.find('.') != std::string::npos)
    throw KeyError(absl::StrCat(registering, ": name can't contain \".\", got \"", name, "\""));
}

// Moves (or converts) `tensors` in one evaluation, and only then rebinds each to its new value,
// so that a failure (a missing GPU) leaves every one as it was. Gradients follow when `grads`.
template <typename Convert>
void rebind_all(std::vector<Tensor> tensors, bool grads, Convert convert) {
  NoGradGuard no_grad;
  std::vector<Tensor> moved, moved_grads, all;
  for (const Tensor& t : tensors) {
    moved.push_back(convert(t));
    const bool move_grad = grads && t.grad().defined();
    moved_grads.push_back(move_grad ? convert(t.grad()) : Tensor());
    all.push_back(moved.back());
    if (move_grad) all.push_back(moved_grads.back());
  }
  lazyfuse::eval(all);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (moved[i].is_same(tensors[i])) continue;  // already there
    tensors[i].set_data(moved[i]);
    if (moved_grads[i].defined()) tensors[i].mutable_grad() = moved_grads[i];
  }
}

}  // namespace

Module::~Module() = default;

Tensor Module::forward(const Tensor& input) {
  (void)input;
  throw UnsupportedError(absl::StrCat(
      name(),
      " has no forward(const Tensor&): call the forward it declares, with its arguments "
      "(a module without a one-tensor forward cannot be called with one tensor or put in "
      "a Sequential)"));
}

std::string Module::name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string full = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // "lazyfuse::nn::Linear" and "(anonymous namespace)::Block" name the class alone.
  const size_t colon = full.rfind("::");
  return colon == std::string::npos ? full : full.substr(colon + 2);
}

std::string Module::repr_with_children(const std::string& name) const {
  std::string out = absl::StrCat(name, "(");
  for (const auto& [key, child] : children_) {
    // Children's own lines are indented under their key, as PyTorch's _addindent.
    std::string text = absl::StrReplaceAll(child->repr(), {{"\n", "\n  "}});
    absl::StrAppend(&out, "\n  (", key, "): ", text);
  }
  absl::StrAppend(&out, children_.empty() ? "" : "\n", ")");
  return out;
}

std::string Module::repr() const { return repr_with_children(name()); }

std::ostream& operator<<(std::ostream& os, const Module& module) { return os << module.repr(); }

std::string Module::held_as(const std::string& name, const char* registering) const {
  check_registered_name(name, registering);
  for (const auto& entry : parameters_)
    if (entry.first == name) return "parameter";
  for (auto& [own, pointer] : const_cast<Module*>(this)->own_parameters())
    if (own == name) return "built-in parameter";
  for (const auto& entry : buffers_)
    if (entry.first == name) return "buffer";
  for (const auto& entry : children_)
    if (entry.first == name) return "module";
  return "";
}

void Module::add_child(std::string name, std::shared_ptr<Module> module) {
  if (module == nullptr)
    throw Error(absl::StrCat("register_module: module \"", name, "\" is a null pointer"));
  const std::string held = held_as(name, "register_module");
  if (held == "module") return replace_child(name, std::move(module));
  if (!held.empty())
    throw KeyError(absl::StrCat("register_module: attribute \"", name, "\" already exists as a ",
                                held, " of ", this->name()));
  children_.emplace_back(std::move(name), std::move(module));
}

void Module::replace_child(const std::string& name, std::shared_ptr<Module> module) {
  for (auto& [key, child] : children_)
    if (key == name) {
      child = std::move(module);
      return;
    }
  throw KeyError(
      absl::StrCat("replace_module: ", this->name(), " has no submodule \"", name, "\""));
}

Tensor& Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  const std::string held = held_as(name, "register_parameter");
  if (!held.empty() && held != "parameter")
    throw KeyError(absl::StrCat("register_parameter: attribute \"", name, "\" already exists as a ",
                                held, " of ", this->name()));
  if (tensor.defined()) {
    if (!tensor.is_leaf())
      throw GradError(
          absl::StrCat("register_parameter: cannot assign non-leaf Tensor to "
                       "parameter \"",
                       name, "\"; a parameter is a leaf (use .detach())"));
    // The drawn value is never computed: zeros take its place, and its node is dropped.
    if (detail::skipping_init())
      tensor = zeros(tensor.sizes(), TensorOptions(tensor.dtype()).device(tensor.device()));
    if (requires_grad || tensor.requires_grad()) tensor.requires_grad_(requires_grad);
  }
  for (auto& entry : parameters_)
    if (entry.first == name) return entry.second = std::move(tensor);
  return parameters_.emplace_back(std::move(name), std::move(tensor)).second;
}

Tensor& Module::register_buffer(std::string name, Tensor tensor) {
  const std::string held = held_as(name, "register_buffer");
  if (!held.empty() && held != "buffer")
    throw KeyError(absl::StrCat("register_buffer: attribute \"", name, "\" already exists as a ",
                                held, " of ", this->name()));
  for (auto& entry : buffers_)
    if (entry.first == name) return entry.second = std::move(tensor);
  return buffers_.emplace_back(std::move(name), std::move(tensor)).second;
}

void Module::collect(bool buffers, const std::string& prefix, bool recurse, bool remove_duplicate,
                     std::unordered_set<const TensorImpl*>* seen, NamedTensorList* out) const {
  auto add = [&](const std::string& name, const Tensor& t) {
    if (!t.defined()) return;
    if (remove_duplicate && !seen->insert(t.impl().get()).second) return;
    out->emplace_back(prefix + name, t);
  };
  if (buffers) {
    for (const auto& [name, t] : buffers_) add(name, t);
  } else {
    // own_parameters() hands out pointers so that to() could replace parameters; here they are
    // only copied (handles), so a const module may use it.
    for (auto& [name, t] : const_cast<Module*>(this)->own_parameters()) add(name, *t);
    for (const auto& [name, t] : parameters_) add(name, t);
  }
  if (!recurse) return;
  for (const auto& [key, child] : children_)
    child->collect(buffers, absl::StrCat(prefix, key, "."), true, remove_duplicate, seen, out);
}

NamedTensorList Module::named_parameters(bool recurse, bool remove_duplicate) const {
  NamedTensorList out;
  std::unordered_set<const TensorImpl*> seen;
  collect(false, "", recurse, remove_duplicate, &seen, &out);
  return out;
}

NamedTensorList Module::named_buffers(bool recurse, bool remove_duplicate) const {
  NamedTensorList out;
  std::unordered_set<const TensorImpl*> seen;
  collect(true, "", recurse, remove_duplicate, &seen, &out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& named : named_parameters(recurse)) out.push_back(std::move(named.second));
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& named : named_buffers(recurse)) out.push_back(std::move(named.second));
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& entry : children_) out.push_back(entry.second);
  return out;
}

void Module::to(Device device) {
  std::vector<Tensor> tensors = parameters();
  for (Tensor& buffer : buffers()) tensors.push_back(std::move(buffer));
  rebind_all(std::move(tensors), /*grads=*/true, [&](const Tensor& t) { return t.to(device); });
}

void Module::to(DType dtype) {
  // Integer and bool state (indices, masks) keeps its dtype, as PyTorch's Module.to(dtype).
  std::vector<Tensor> tensors;
  for (Tensor& t : parameters())
    if (is_floating(t.dtype())) tensors.push_back(std::move(t));
  for (Tensor& t : buffers())
    if (is_floating(t.dtype())) tensors.push_back(std::move(t));
  // A gradient of the old dtype would not fit the new value: it is dropped, not converted.
  for (Tensor& t : tensors)
    if (t.dtype() != dtype && t.grad().defined()) t.mutable_grad() = Tensor();
  rebind_all(std::move(tensors), /*grads=*/false, [&](const Tensor& t) { return t.to(dtype); });
}

void Module::train(bool on) {
  training_ = on;
  for (auto& child : children_) child.second->train(on);
}

void Module::zero_grad() {
  for (Tensor& parameter : parameters())
    if (parameter.grad().defined()) parameter.mutable_grad() = Tensor();
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  insert(modules_.size(), std::move(module));
}

void ModuleList::extend(const ModuleList& other) {
  // A copy first: extending a list by itself appends each module once.
  const std::vector<std::shared_ptr<Module>> more = other.modules_;
  for (const auto& module : more) push_back(module);
}

void ModuleList::insert(size_t index, std::shared_ptr<Module> module) {
  if (module == nullptr) throw Error("ModuleList: cannot hold a null module");
  if (index > modules_.size())
    throw IndexError(absl::StrCat("ModuleList.insert: index ", index,
                                  " is out of range for ModuleList of size ", modules_.size()));
  modules_.insert(modules_.begin() + static_cast<std::ptrdiff_t>(index), std::move(module));
  rename_children();
}

void ModuleList::rename_children() {
  children_.clear();
  for (size_t i = 0; i < modules_.size(); ++i)
    children_.emplace_back(std::to_string(i), modules_[i]);
}

std::shared_ptr<Module> ModuleList::operator[](size_t index) const {
  if (index >= modules_.size())
    throw IndexError(
        absl::StrCat("index ", index, " is out of range for ModuleList of size ", modules_.size()));
  return modules_[index];
}

std::shared_ptr<Module> ModuleDict::insert(const std::string& key, std::shared_ptr<Module> module) {
  check_registered_name(key, "ModuleDict");
  if (module == nullptr)
    throw Error(absl::StrCat("ModuleDict: module \"", key, "\" is a null pointer"));
  for (auto& [name, child] : children_)
    if (name == key) return child = std::move(module);
  return children_.emplace_back(key, std::move(module)).second;
}

void ModuleDict::update(
    const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& modules) {
  for (const auto& [key, module] : modules) insert(key, module);
}

bool ModuleDict::contains(const std::string& key) const {
  return std::any_of(children_.begin(), children_.end(),
                     [&](const auto& entry) { return entry.first == key; });
}

std::shared_ptr<Module> ModuleDict::operator[](const std::string& key) const {
  for (const auto& [name, child] : children_)
    if (name == key) return child;
  throw KeyError(absl::StrCat("ModuleDict has no module with key \"", key, "\""));
}

std::shared_ptr<Module> ModuleDict::pop(const std::string& key) {
  for (auto it = children_.begin(); it != children_.end(); ++it)
    if (it->first == key) {
      std::shared_ptr<Module> module = std::move(it->second);
      children_.erase(it);
      return module;
    }
  throw KeyError(absl::StrCat("ModuleDict.pop: no module with key \"", key, "\""));
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& entry : children_) out.push_back(entry.first);
  return out;
}

namespace detail {
bool skipping_init() { return skip_init_depth > 0; }
SkipInitGuard::SkipInitGuard() { ++skip_init_depth; }
SkipInitGuard::~SkipInitGuard() { --skip_init_depth; }
}  // namespace detail

}  // namespace lazyfuse::nn
