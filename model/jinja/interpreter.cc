#include "model/jinja/interpreter.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/jinja/operators.h"
#include "model/jinja/pyformat.h"

namespace fpa::jinja {
namespace {

// Binds `targets` to `value` (a list of as many items when there are several).
void bind_targets(Scope& scope, const std::vector<std::string>& targets, const Value& value) {
  if (targets.size() == 1) {
    scope.vars[targets[0]] = value;
    return;
  }
  const Json& items = value.json("unpacking");
  if (!items.is_array() || items.size() != targets.size()) {
    fail(absl::StrCat("cannot unpack ", type_name(value), " into ", targets.size(), " names"));
  }
  for (size_t i = 0; i < targets.size(); ++i) scope.vars[targets[i]] = Value(items[i]);
}

// Jinja's `loop` variable for item i of items.
Json loop_info(const Json& items, size_t i) {
  const size_t n = items.size();
  Json loop = {
      {"index", i + 1},  {"index0", i},        {"revindex", n - i}, {"revindex0", n - i - 1},
      {"first", i == 0}, {"last", i + 1 == n}, {"length", n},       {"depth", 1},
      {"depth0", 0}};
  if (i > 0) loop["previtem"] = items[i - 1];
  if (i + 1 < n) loop["nextitem"] = items[i + 1];
  return loop;
}

}  // namespace

Nested::Nested(int& depth, int max, const char* what) : depth_(depth) {
  if (++depth_ > max) {
    --depth_;
    fail(absl::StrCat(what, " nest deeper than ", max));
  }
}

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

std::string Interpreter::render(const Body& body) {
  auto top = std::make_shared<Scope>();
  top->parent = globals_;
  std::string out;
  run(body, top, out);
  return out;
}

void Interpreter::step(int line) {
  line_ = line;
  if (++steps_ > limits_.max_steps) {
    fail(absl::StrCat("the template runs past ", limits_.max_steps, " steps"));
  }
}

void Interpreter::charge(const Value& v) {
  if (!v.is_string()) return;
  work_bytes_ += v.data.get_ref<const std::string&>().size();
  if (work_bytes_ > limits_.max_work_bytes) {
    fail(absl::StrCat("the template builds more than ", limits_.max_work_bytes,
                      " bytes of strings"));
  }
}

void Interpreter::append(std::string& out, std::string_view text) {
  if (out.size() + text.size() > limits_.max_output_bytes) {
    fail(absl::StrCat("the output grows past ", limits_.max_output_bytes, " bytes"));
  }
  out.append(text);
}

Interpreter::Flow Interpreter::run(const Body& body, const std::shared_ptr<Scope>& scope,
                                   std::string& out) {
  for (const auto& node : body) {
    if (Flow flow = run(*node, scope, out); flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::run(const Node& node, const std::shared_ptr<Scope>& scope,
                                   std::string& out) {
  Nested frame(frames_, kMaxFrames, "statements and expressions");
  step(node.line);
  switch (node.kind) {
    case Node::Kind::kText:
      append(out, node.text);
      break;
    case Node::Kind::kOutput:
      append(out, py_str(eval(*node.expr, scope)));
      break;
    case Node::Kind::kIf:
      for (const auto& [condition, body] : node.branches) {
        if (!condition || truthy(eval(*condition, scope))) return run(body, scope, out);
      }
      break;
    case Node::Kind::kFor:
      return run_for(node, scope, out);
    case Node::Kind::kSet:
      run_set(node, scope);
      break;
    case Node::Kind::kSetBlock: {
      auto inner = std::make_shared<Scope>();
      inner->parent = scope;
      std::string text;
      run(node.body, inner, text);
      scope->vars[node.targets[0]] = Value(Json(std::move(text)));
      break;
    }
    case Node::Kind::kMacro:
      scope->vars[node.name] = macro(node, scope);
      break;
    case Node::Kind::kCallBlock: {
      const std::weak_ptr<Scope> here = scope;
      Args args = eval_args(*node.expr, scope, 1);
      args.named.emplace_back("caller", Value::function("caller", [this, &node, here](Args& a) {
                                return call_body(node, here, a, node.params);
                              }));
      const Value callee = eval(*node.expr->items[0], scope);
      if (callee.kind != Value::Kind::kFunction) fail("{% call %} of something not callable");
      append(out, py_str((*callee.fn)(args)));
      break;
    }
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::run_for(const Node& node, const std::shared_ptr<Scope>& scope,
                                       std::string& out) {
  Value holder;
  Json items = iterate(eval_ref(*node.expr, scope, holder), "for");
  if (node.filter) {  // `for x in y if cond`: the loop (and loop.length) sees only the kept
    Json kept = Json::array();
    for (const Json& item : items) {
      auto s = std::make_shared<Scope>();
      s->parent = scope;
      bind_targets(*s, node.targets, Value(item));
      if (truthy(eval(*node.filter, s))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return run(node.else_body, scope, out);
  for (size_t i = 0; i < items.size(); ++i) {
    step(node.line);
    auto s = std::make_shared<Scope>();  // a fresh scope per iteration, as Jinja's
    s->parent = scope;
    bind_targets(*s, node.targets, Value(items[i]));
    s->vars["loop"] = Value(loop_info(items, i));
    if (run(node.body, s, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interpreter::run_set(const Node& node, const std::shared_ptr<Scope>& scope) {
  Value value = eval(*node.expr, scope);
  if (node.attribute.empty()) return bind_targets(*scope, node.targets, value);
  const Value* target = scope->find(node.targets[0]);
  if (target == nullptr || target->kind != Value::Kind::kNamespace) {
    fail(absl::StrCat("set ", node.targets[0], ".", node.attribute,
                      ": attributes can be set only on a namespace"));
  }
  (*target->ns)[node.attribute] = value.json(absl::StrCat("set ", node.attribute));
}

Value Interpreter::macro(const Node& node, const std::shared_ptr<Scope>& scope) {
  const std::weak_ptr<Scope> defined = scope;
  return Value::function(node.name, [this, &node, defined](Args& args) {
    return call_body(node, defined, args, node.params);
  });
}

Value Interpreter::call_body(const Node& node, const std::weak_ptr<Scope>& defined, Args& args,
                             const Params& params) {
  Nested call(call_depth_, limits_.max_call_depth, "macro calls");
  auto s = std::make_shared<Scope>();
  s->parent = defined.lock();
  if (!s->parent) fail(absl::StrCat("'", node.name, "' is called outside its scope"));
  if (args.positional.size() > params.size()) {
    fail(absl::StrCat("macro '", node.name, "' takes ", params.size(), " arguments (",
                      args.positional.size(), " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) {
    s->vars[params[i].first] = std::move(args.positional[i]);
  }
  for (auto& [name, value] : args.named) {
    bool known = name == "caller";
    for (const auto& param : params) known = known || param.first == name;
    if (!known || s->vars.contains(name)) {
      fail(absl::StrCat("macro '", node.name, "': unexpected or repeated argument '", name, "'"));
    }
    s->vars[name] = std::move(value);
  }
  for (const auto& [name, default_value] : params) {
    if (s->vars.contains(name)) continue;
    s->vars[name] = default_value ? eval(*default_value, s) : Value::undefined(name);
  }
  std::string out;
  run(node.body, s, out);
  return Value(Json(std::move(out)));
}

}  // namespace fpa::jinja
