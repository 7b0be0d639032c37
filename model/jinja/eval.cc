// Interpreter: expressions.
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/jinja/builtins.h"
#include "model/jinja/interpreter.h"
#include "model/jinja/operators.h"

namespace fpa::jinja {
namespace {

// Lists and dicts a template builds nest at most this deep (printing and copying recurse).
constexpr int kMaxValueDepth = 100;

Value negate(const Value& v, absl::string_view op) {
  const Json& j = v.json(op);
  if (!j.is_number() && !j.is_boolean()) {
    fail(absl::StrCat("bad operand type for unary ", op, ": '", type_name(v), "'"));
  }
  if (op == "+") return j;
  if (j.is_number_float()) return -j.get<double>();
  const int64_t i = to_int(v, op);
  if (i == INT64_MIN) fail("unsupported: integers beyond 64 bits");
  return -i;
}

}  // namespace

const Value& Interpreter::eval_ref(const Expr& e, const std::shared_ptr<Scope>& scope,
                                   Value& holder) {
  if (e.kind == Expr::Kind::kName) {
    if (const Value* v = scope->find(e.name)) {
      step(e.line);
      return *v;
    }
  }
  holder = eval(e, scope);
  return holder;
}

Value Interpreter::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  Nested frame(frames_, kMaxFrames, "statements and expressions");
  step(e.line);
  Value holder;
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName: {
      const Value* v = scope->find(e.name);
      return v ? *v : Value::undefined(e.name);
    }
    case Expr::Kind::kList:
    case Expr::Kind::kDict:
      return eval_collection(e, scope);
    case Expr::Kind::kAttribute:
      return attribute(eval_ref(*e.items[0], scope, holder), e.name);
    case Expr::Kind::kSubscript:
      return subscript(eval_ref(*e.items[0], scope, holder), eval(*e.items[1], scope));
    case Expr::Kind::kSlice: {
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        if (e.items[i + 1]) parts[i] = eval(*e.items[i + 1], scope);
      }
      Value result = slice(eval_ref(*e.items[0], scope, holder), parts[0], parts[1], parts[2]);
      charge(result);
      return result;
    }
    case Expr::Kind::kCall:
      return eval_call(e, scope);
    case Expr::Kind::kFilter: {
      const Value& subject = eval_ref(*e.items[0], scope, holder);
      Args args = eval_args(e, scope, 1);
      Value result = apply_filter(e.name, subject, args);
      charge(result);
      return result;
    }
    case Expr::Kind::kTest: {
      const Value& subject = eval_ref(*e.items[0], scope, holder);
      Args args = eval_args(e, scope, 1);
      return apply_test(e.name, subject, args);
    }
    case Expr::Kind::kUnary:
      if (e.name == "not") return !truthy(eval(*e.items[0], scope));
      if (e.name == "*") fail("*args outside a call");
      return negate(eval(*e.items[0], scope), e.name);
    case Expr::Kind::kBinary: {
      Value result = binary_op(e.name, eval(*e.items[0], scope), eval(*e.items[1], scope));
      charge(result);
      return result;
    }
    case Expr::Kind::kAnd:
    case Expr::Kind::kOr: {  // Python's: the deciding operand itself
      Value left = eval(*e.items[0], scope);
      if (truthy(left) == (e.kind == Expr::Kind::kOr)) return left;
      return eval(*e.items[1], scope);
    }
    case Expr::Kind::kCondition:
      if (truthy(eval(*e.items[0], scope))) return eval(*e.items[1], scope);
      return e.items[2] ? eval(*e.items[2], scope) : Value::undefined("if-expression");
  }
  fail("unreachable");
}

Args Interpreter::eval_args(const Expr& e, const std::shared_ptr<Scope>& scope, size_t skip) {
  Args args;
  for (size_t i = skip; i < e.items.size(); ++i) {
    const Expr& arg = *e.items[i];
    if (arg.kind != Expr::Kind::kUnary || arg.name != "*") {
      args.positional.push_back(eval(arg, scope));
      continue;
    }
    for (const Json& item : iterate(eval(*arg.items[0], scope), "*args")) {
      args.positional.push_back(stored_function(Value(item)));
    }
  }
  for (const auto& [name, value] : e.named) args.named.emplace_back(name, eval(*value, scope));
  return args;
}

Value Interpreter::eval_collection(const Expr& e, const std::shared_ptr<Scope>& scope) {
  Json out = e.kind == Expr::Kind::kList ? Json::array() : Json::object();
  for (size_t i = 0; i < e.items.size(); ++i) {
    if (e.kind == Expr::Kind::kList) {
      out.push_back(storable(eval(*e.items[i], scope)));
      continue;
    }
    const Value key = eval(*e.items[i], scope);
    if (!key.is_string()) fail(absl::StrCat("unsupported: dict key of type ", type_name(key)));
    out[key.data.get<std::string>()] = eval(*e.items[++i], scope).json("dict value");
  }
  if (depth(out, kMaxValueDepth + 1) > kMaxValueDepth) fail("a list or dict nests too deeply");
  return out;
}

Json Interpreter::storable(const Value& v) {
  if (v.kind != Value::Kind::kFunction) return v.json("list item");
  functions_.push_back(v);
  return Json::binary({}, functions_.size() - 1);
}

Value Interpreter::stored_function(const Value& v) const {
  if (!v.is_data() || !v.data.is_binary()) return v;
  const uint64_t index = v.data.get_binary().subtype();
  if (index >= functions_.size()) fail("a function reference that this render did not make");
  return functions_[index];
}

Value Interpreter::eval_call(const Expr& e, const std::shared_ptr<Scope>& scope) {
  const Value callee = stored_function(eval(*e.items[0], scope));
  Args args = eval_args(e, scope, 1);
  if (callee.kind != Value::Kind::kFunction) {
    if (callee.is_undefined()) fail(absl::StrCat("'", callee.name, "' is undefined"));
    fail(absl::StrCat("'", type_name(callee), "' object is not callable"));
  }
  Value result = (*callee.fn)(args);
  charge(result);
  return result;
}

}  // namespace fpa::jinja
