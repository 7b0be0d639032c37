// Runs a parsed template: statements (interpreter.cc) and expressions (eval.cc) under Jinja's
// scoping (a for loop's body, a macro and a block set get their own scope; if does not;
// namespaces are shared) and the render's bounds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/jinja/ast.h"
#include "model/jinja/value.h"

namespace fpa::jinja {

// Bounds one render, so that no template (nor fuzz input) runs away.
struct Limits {
  size_t max_output_bytes = 16 << 20;
  // Statements run plus expressions evaluated plus loop iterations.
  uint64_t max_steps = 20'000'000;
  // Bytes of strings built by operators, filters and calls, all together.
  uint64_t max_work_bytes = uint64_t{1} << 30;
  // Nested macro calls (recursive macros recurse through this).
  int max_call_depth = 64;
};

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;

  // The innermost binding of name, or null.
  const Value* find(const std::string& name) const;
};

// Counts one level of a recursion for as long as it runs; fails past `max`.
class Nested {
 public:
  Nested(int& depth, int max, const char* what);
  ~Nested() { --depth_; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;

 private:
  int& depth_;
};

class Interpreter {
 public:
  Interpreter(const Limits& limits, std::shared_ptr<Scope> globals)
      : limits_(limits), globals_(std::move(globals)) {}

  std::string render(const Body& body);
  // The line of the statement or expression running when an error was raised.
  int line() const { return line_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow run(const Body& body, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow run(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out);
  Flow run_for(const Node& node, const std::shared_ptr<Scope>& scope, std::string& out);
  void run_set(const Node& node, const std::shared_ptr<Scope>& scope);
  Value macro(const Node& node, const std::shared_ptr<Scope>& scope);
  Value call_body(const Node& node, const std::weak_ptr<Scope>& defined, Args& args,
                  const Params& params);
  void append(std::string& out, std::string_view text);
  void step(int line);
  void charge(const Value& v);

  // eval.cc
  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  // eval(e), without copying a variable's value when e names one (`messages[0]`).
  const Value& eval_ref(const Expr& e, const std::shared_ptr<Scope>& scope, Value& holder);
  Args eval_args(const Expr& e, const std::shared_ptr<Scope>& scope, size_t skip);
  Value eval_collection(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_call(const Expr& e, const std::shared_ptr<Scope>& scope);
  // Macros kept in lists (`[handle_docs, handle_tools]`, called as `fns[i](*args[i])`): JSON
  // cannot hold a function, so a list holds a reference into functions_ (a binary value, which
  // no request or file can produce), and calls and *args resolve it.
  Json storable(const Value& v);
  Value stored_function(const Value& v) const;

  const Limits limits_;
  std::shared_ptr<Scope> globals_;
  std::vector<Value> functions_;
  uint64_t steps_ = 0;
  uint64_t work_bytes_ = 0;
  int call_depth_ = 0;
  // Statements and expressions being evaluated, nested: what bounds the stack, whatever mix of
  // nesting and macro recursion a template has.
  static constexpr int kMaxFrames = 1500;
  int frames_ = 0;
  int line_ = 0;
};

}  // namespace fpa::jinja
