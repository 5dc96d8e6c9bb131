// nn::Module, the base of every layer and of a user's model, as LibTorch's torch::nn::Module:
// parameters, buffers and submodules registered by name, and the containers ModuleList and
// ModuleDict. Layers are in nn.h.
#pragma once

#include <concepts>
#include <deque>
#include <memory>
#include <ostream>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "lazyfuse/frontend/tensor.h"

namespace lazyfuse::nn {

using NamedTensorList = std::vector<std::pair<std::string, Tensor>>;

class Module;
// A module given by value or reference (to be held as a copy).
template <typename M>
concept ModuleValue = std::derived_from<std::decay_t<M>, Module>;
// Any argument but an object of class C: a container's one-argument constructor is not its copy
// constructor.
template <typename T, typename C>
concept NotA = !std::same_as<std::decay_t<T>, C>;

class Module {
 public:
  // Pure, so that Module stays abstract with forward and repr no longer pure: only a subclass
  // is a module, and `{}` never converts to a Module (save_safetensors(path, {}) is a list).
  virtual ~Module() = 0;

  // The one-tensor forward that Sequential and operator() call. It is not pure: a module whose
  // forward takes other arguments declares its own (Tensor forward(const Tensor& x, const
  // Tensor& mask)), which hides this one, and is called by it, as LibTorch's are
  // (block->forward(x, mask)). Calling this one on a module that did not override it is an
  // UnsupportedError naming the module; Sequential refuses such a module when it is built.
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }

  // Registration, for a user's modules. A name is not empty and has no "."; registering a name
  // this module already holds as the same kind replaces that entry in place (as PyTorch's
  // register_parameter and add_module do: how a user module ties or swaps a parameter), and a
  // name held as another kind is a KeyError.
  //
  // A submodule: its parameters are named "name.weight". Returns it, so a member can hold it:
  // fc_ = register_module("fc", std::make_shared<nn::Linear>(3, 4)) or
  // register_module("fc", nn::Linear(3, 4)).
  template <std::derived_from<Module> M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    add_child(std::move(name), module);
    return module;
  }
  template <ModuleValue M>
  std::shared_ptr<std::decay_t<M>> register_module(std::string name, M&& module) {
    return register_module(std::move(name),
                           std::make_shared<std::decay_t<M>>(std::forward<M>(module)));
  }
  // LibTorch's name for replacing a submodule that is already registered (a KeyError if none
  // is).
  template <std::derived_from<Module> M>
  std::shared_ptr<M> replace_module(const std::string& name, std::shared_ptr<M> module) {
    replace_child(name, module);
    return module;
  }
  // A parameter: a leaf tensor that parameters() lists and optimizers update; requires_grad is
  // set as asked (floating dtypes only). The tensor is kept as given, not copied: the handle
  // returned and the caller's are the same tensor. Not evaluated here (the first use computes
  // it); under skip_init its value is replaced by zeros of its shape, never computed.
  Tensor& register_parameter(std::string name, Tensor tensor, bool requires_grad = true);
  // A buffer: state that is not a parameter (a causal mask, running statistics): saved and
  // loaded with the parameters, moved by to(), never given a gradient.
  Tensor& register_buffer(std::string name, Tensor tensor);

  // Every parameter, this module's and (when recurse) its submodules', in registration order,
  // with PyTorch's dotted names ("0.weight", "encoder.bias"). A tensor held under several names
  // (tied weights) is listed once, under its first name, as PyTorch's named_parameters does,
  // so an optimizer updates it once; remove_duplicate = false lists every name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensorList named_parameters(bool recurse = true, bool remove_duplicate = true) const;
  // The same for buffers.
  std::vector<Tensor> buffers(bool recurse = true) const;
  NamedTensorList named_buffers(bool recurse = true, bool remove_duplicate = true) const;
  // Direct submodules, in registration order.
  std::vector<std::shared_ptr<Module>> children() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // This module as M (nullptr if it is not one): net[0]->as<Linear>()->weight().
  template <typename M>
  M* as() {
    return dynamic_cast<M*>(this);
  }
  template <typename M>
  const M* as() const {
    return dynamic_cast<const M*>(this);
  }

  // Moves every parameter and buffer to `device` (computing them there). They stay the same
  // tensors (an optimizer made before still holds them), with their requires_grad.
  virtual void to(Device device);
  // Converts every floating parameter and buffer to `dtype`, keeping them the same tensors.
  void to(DType dtype);
  // Training mode (the default) or evaluation mode, for this module and its children: what
  // Dropout looks at.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Forgets every parameter's gradient.
  void zero_grad();
  // PyTorch's repr: "Linear(in_features=3, out_features=1, bias=True)". By default the class's
  // name and each submodule on a line of its own, as PyTorch prints a module without
  // extra_repr: "Block(\n  (fc): Linear(...)\n)".
  virtual std::string repr() const;
  // The class's name without namespaces ("Linear", "Block"), as LibTorch's name().
  std::string name() const;

 protected:
  // A built-in module's parameters that live in its members (not its children's), named.
  // Asked for each time rather than stored, so that a module that is copied or moved never
  // points into its old self, and so that assigning the member (head.weight() = wte.weight())
  // is what the module holds. A user's module registers its own instead.
  virtual std::vector<std::pair<std::string, Tensor*>> own_parameters() { return {}; }
  // Children, named as named_parameters() prefixes them.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  // The repr of a container: `name`, then each child as "(key): repr" on its own line.
  std::string repr_with_children(const std::string& name) const;

 private:
  void add_child(std::string name, std::shared_ptr<Module> module);
  void replace_child(const std::string& name, std::shared_ptr<Module> module);
  // What `name` is held as here ("parameter", "buffer", "module"), or "" when it is free; a
  // KeyError for a name that may not be registered.
  std::string held_as(const std::string& name, const char* registering) const;
  void collect(bool buffers, const std::string& prefix, bool recurse, bool remove_duplicate,
               std::unordered_set<const TensorImpl*>* seen, NamedTensorList* out) const;

  // Registered parameters and buffers. A deque, so that the references register_* return stay
  // valid as more are registered.
  std::deque<std::pair<std::string, Tensor>> parameters_, buffers_;
};

std::ostream& operator<<(std::ostream& os, const Module& module);

// A module with a one-tensor forward: what Sequential can chain.
template <typename M>
concept OneTensorModule = std::derived_from<std::decay_t<M>, Module> &&
    requires(std::decay_t<M>& module, const Tensor& x) {
  { module.forward(x) } -> std::convertible_to<Tensor>;
};

// Submodules held in a list, as torch.nn.ModuleList: indexed, iterated and registered (their
// parameters are "0.weight", "1.weight"), with no forward of its own.
class ModuleList : public Module {
 public:
  ModuleList() = default;
  template <NotA<ModuleList> M>
  explicit ModuleList(M&& module) {
    push_back(std::forward<M>(module));
  }
  template <typename M1, typename M2, typename... M>
  ModuleList(M1&& first, M2&& second, M&&... more) {
    push_back(std::forward<M1>(first));
    push_back(std::forward<M2>(second));
    (push_back(std::forward<M>(more)), ...);
  }
  void push_back(std::shared_ptr<Module> module);
  template <ModuleValue M>
  void push_back(M&& module) {
    push_back(std::make_shared<std::decay_t<M>>(std::forward<M>(module)));
  }
  // Appends other's modules (the same modules, not copies).
  void extend(const ModuleList& other);
  // Inserts before position `index` (size() appends); later modules' names shift.
  void insert(size_t index, std::shared_ptr<Module> module);
  size_t size() const { return modules_.size(); }
  bool is_empty() const { return modules_.empty(); }
  // An IndexError past the end.
  std::shared_ptr<Module> operator[](size_t index) const;
  std::shared_ptr<Module> ptr(size_t index) const { return (*this)[index]; }
  // The module at `index` as M, nullptr if it is not one.
  template <typename M>
  std::shared_ptr<M> at(size_t index) const {
    return std::dynamic_pointer_cast<M>((*this)[index]);
  }
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  void rename_children();
  std::vector<std::shared_ptr<Module>> modules_;
};

// Submodules held by name, in insertion order, as torch.nn.ModuleDict. Keys are module names
// (not empty, no "."); inserting a key already held replaces its module in place.
class ModuleDict : public Module {
 public:
  ModuleDict() = default;
  explicit ModuleDict(const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& modules) {
    update(modules);
  }
  std::shared_ptr<Module> insert(const std::string& key, std::shared_ptr<Module> module);
  template <ModuleValue M>
  std::shared_ptr<std::decay_t<M>> insert(const std::string& key, M&& module) {
    auto held = std::make_shared<std::decay_t<M>>(std::forward<M>(module));
    insert(key, std::shared_ptr<Module>(held));
    return held;
  }
  void update(const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& modules);
  bool contains(const std::string& key) const;
  // A KeyError naming the key when it is not held.
  std::shared_ptr<Module> operator[](const std::string& key) const;
  template <typename M>
  std::shared_ptr<M> at(const std::string& key) const {
    return std::dynamic_pointer_cast<M>((*this)[key]);
  }
  // Removes the key and returns its module (a KeyError when it is not held).
  std::shared_ptr<Module> pop(const std::string& key);
  void clear() { children_.clear(); }
  size_t size() const { return children_.size(); }
  bool empty() const { return children_.empty(); }
  std::vector<std::string> keys() const;
  std::vector<std::shared_ptr<Module>> values() const { return children(); }
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& items() const {
    return children_;
  }
  auto begin() const { return children_.begin(); }
  auto end() const { return children_.end(); }
};

namespace detail {
// Whether modules made on this thread now skip their random initialisation (skip_init).
bool skipping_init();
// A new parameter's initial value: `draw()`, or zeros of its shape when the module is made by
// skip_init: nothing is drawn then, so the random stream is as if the module were not made.
template <typename Draw>
Tensor initial(const Shape& shape, Draw draw) {
  return skipping_init() ? zeros(shape) : draw();
}
// Computes a new module's parameters in one evaluation, unless they are skip_init's zeros, which
// stay uncomputed until a loaded value replaces them.
inline void compute_initial(const std::vector<Tensor>& parameters) {
  if (!skipping_init()) lazyfuse::eval(parameters);
}
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;
};
}  // namespace detail

// A module made without its initialisation, for weights that will be loaded next, as PyTorch's
// torch.nn.utils.skip_init(Linear, 3, 4): its parameters are zeros of their shapes, left
// uncomputed (a loaded value replaces them before anything computes them), and built-in layers
// draw no random numbers, so the generator's stream is what it would be without the module. A
// user module's constructor gets the same through register_parameter.
//   auto head = nn::skip_init<nn::Linear>(768, 50257);
//   lf::load_safetensors(head, "head.safetensors");
template <std::derived_from<Module> M, typename... Args>
M skip_init(Args&&... args) {
  detail::SkipInitGuard guard;
  return M(std::forward<Args>(args)...);
}

}  // namespace lazyfuse::nn
