// The parsed template: expressions and statements, as model/jinja/parser.cc builds them and
// model/jinja/interpreter.cc runs them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja/value.h"

namespace fpa::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // [items...], and tuples (a, b), which are lists at run time.
                 // TODO(issue 24): tuples print as [a, b], where Python prints (a, b).
    kDict,       // {items[0]: items[1], items[2]: items[3], ...}
    kAttribute,  // items[0].name
    kSubscript,  // items[0][items[1]]
    kSlice,      // items[0][items[1]:items[2]:items[3]], absent parts null
    kCall,       // items[0](items[1...], named)
    kFilter,     // items[0] | name(items[1...], named)
    kTest,       // items[0] is name(items[1...], named)
    kUnary,      // name items[0]; name is "-", "+", "not", or "*" (a call's *args)
    kBinary,     // items[0] name items[1]: arithmetic, "~", comparisons, "in", "not in"
    kAnd,
    kOr,
    kCondition,  // items[1] if items[0] else items[2] (a null else: undefined)
  };
  Kind kind;
  int line = 0;
  Json value;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> named;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

// A macro's or caller's parameters, with their defaults (null: none).
using Params = std::vector<std::pair<std::string, ExprPtr>>;

struct Node {
  enum class Kind {
    kText,       // text
    kOutput,     // {{ expr }}
    kIf,         // branches; a null condition is the else
    kFor,        // for targets in expr [if filter]: body [else: else_body]
    kSet,        // set targets = expr, or set targets[0].attribute = expr
    kSetBlock,   // set targets[0]: body rendered into it
    kMacro,      // macro name(params): body
    kCallBlock,  // call(params) expr: body is the caller
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::string> targets;
  std::string attribute;
  std::string name;
  Params params;
  Body body;
  Body else_body;
};

}  // namespace fpa::jinja
