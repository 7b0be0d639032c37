#include "model/jinja/parser.h"

#include <charconv>
#include <cstdlib>
#include <initializer_list>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "model/jinja/builtins.h"
#include "model/jinja/lexer.h"

namespace fpa::jinja {
namespace {

using T = Token::Type;

// Jinja's tags this subset does not implement.
constexpr absl::string_view kUnsupportedTags[] = {"raw",        "include", "import", "from",
                                                  "extends",    "block",   "with",   "filter",
                                                  "autoescape", "do",      "trans"};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body run() {
    std::string end_tag;
    Body body = parse_body({}, &end_tag);
    if (!end_tag.empty()) error(absl::StrCat("unexpected '", end_tag, "'"));
    return body;
  }

 private:
  // Counts nesting while parsing one construct.
  struct Nest {
    explicit Nest(Parser& p) : p(p) {
      if (++p.depth_ > kMaxNesting) p.error("the template nests too deeply");
    }
    ~Nest() { --p.depth_; }
    Parser& p;
  };

  const Token& peek(size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool at(T type, absl::string_view value = {}, size_t ahead = 0) const {
    return peek(ahead).type == type && (value.empty() || peek(ahead).value == value);
  }
  bool at_op(absl::string_view op) const { return at(T::kOperator, op); }
  bool at_name(absl::string_view name) const { return at(T::kName, name); }
  bool skip(T type, absl::string_view value) {
    if (!at(type, value)) return false;
    next();
    return true;
  }
  bool skip_op(absl::string_view op) { return skip(T::kOperator, op); }
  bool skip_name(absl::string_view name) { return skip(T::kName, name); }

  [[noreturn]] void error(const std::string& what) const {
    fail(absl::StrCat("line ", peek().line, ": ", what));
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case T::kEnd:
        return "end of template";
      case T::kVarEnd:
        return "'}}'";
      case T::kBlockEnd:
        return "'%}'";
      case T::kText:
        return "text";
      default:
        return absl::StrCat("'", t.value, "'");
    }
  }
  void expect(T type, absl::string_view value, absl::string_view what) {
    if (!skip(type, value)) error(absl::StrCat("expected ", what, ", got ", describe(peek())));
  }
  void expect_op(absl::string_view op) { expect(T::kOperator, op, absl::StrCat("'", op, "'")); }
  void expect_block_end() { expect(T::kBlockEnd, {}, "'%}'"); }
  std::string expect_name() {
    if (!at(T::kName)) error(absl::StrCat("expected a name, got ", describe(peek())));
    return next().value;
  }

  // Nodes up to a tag named in `ends` (its name is stored in *end_tag and the position left
  // after it) or the end of the template (*end_tag empty).
  Body parse_body(std::initializer_list<absl::string_view> ends, std::string* end_tag) {
    Nest nest(*this);
    Body body;
    while (true) {
      const Token& t = next();
      if (t.type == T::kEnd) {
        if (ends.size()) error(absl::StrCat("missing '", *ends.begin(), "'"));
        end_tag->clear();
        return body;
      }
      if (t.type == T::kText) {
        body.push_back(node(Node::Kind::kText, t.line));
        body.back()->text = t.value;
      } else if (t.type == T::kVarBegin) {
        body.push_back(node(Node::Kind::kOutput, t.line));
        body.back()->expr = parse_tuple(true);
        expect(T::kVarEnd, {}, "'}}'");
      } else {
        const std::string tag = expect_name();
        for (absl::string_view end : ends) {
          if (tag == end) {
            *end_tag = tag;
            return body;
          }
        }
        statement(tag, t.line, body);
      }
    }
  }

  static std::unique_ptr<Node> node(Node::Kind kind, int line) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = line;
    return n;
  }

  void statement(const std::string& tag, int line, Body& body) {
    if (tag == "if") return body.push_back(parse_if(line));
    if (tag == "for") return body.push_back(parse_for(line));
    if (tag == "set") return body.push_back(parse_set(line));
    if (tag == "macro") return body.push_back(parse_macro(line));
    if (tag == "call") return body.push_back(parse_call_block(line));
    if (tag == "break" || tag == "continue") {
      if (loops_ == 0) error(absl::StrCat("'", tag, "' outside a loop"));
      expect_block_end();
      return body.push_back(
          node(tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, line));
    }
    if (tag == "generation") {  // transformers' marker of assistant text: renders its body
      expect_block_end();
      std::string end;
      for (auto& n : parse_body({"endgeneration"}, &end)) body.push_back(std::move(n));
      return expect_block_end();
    }
    for (absl::string_view unsupported : kUnsupportedTags) {
      if (tag == unsupported) error(absl::StrCat("unsupported: {% ", tag, " %}"));
    }
    error(absl::StrCat("unexpected tag '", tag, "'"));
  }

  std::unique_ptr<Node> parse_if(int line) {
    auto n = node(Node::Kind::kIf, line);
    std::string end = "elif";
    while (end == "elif") {
      ExprPtr condition = parse_expression(true);
      expect_block_end();
      Body body = parse_body({"elif", "else", "endif"}, &end);
      n->branches.emplace_back(std::move(condition), std::move(body));
    }
    if (end == "else") {
      expect_block_end();
      n->branches.emplace_back(nullptr, parse_body({"endif"}, &end));
    }
    expect_block_end();
    return n;
  }

  std::vector<std::string> parse_targets() {
    const bool parens = skip_op("(");
    std::vector<std::string> names = {expect_name()};
    while (skip_op(",")) {
      if (at_op("=") || at_name("in") || at_op(")")) break;
      names.push_back(expect_name());
    }
    if (parens) expect_op(")");
    return names;
  }

  std::unique_ptr<Node> parse_for(int line) {
    auto n = node(Node::Kind::kFor, line);
    n->targets = parse_targets();
    expect(T::kName, "in", "'in'");
    n->expr = parse_tuple(false);
    if (skip_name("if")) n->filter = parse_expression(true);
    if (at_name("recursive")) error("unsupported: recursive loops");
    expect_block_end();
    std::string end;
    ++loops_;
    n->body = parse_body({"endfor", "else"}, &end);
    --loops_;
    if (end == "else") {
      expect_block_end();
      n->else_body = parse_body({"endfor"}, &end);
    }
    expect_block_end();
    return n;
  }

  std::unique_ptr<Node> parse_set(int line) {
    auto n = node(Node::Kind::kSet, line);
    if (at(T::kName) && at(T::kOperator, ".", 1)) {
      n->targets = {next().value};
      next();
      n->attribute = expect_name();
    } else {
      n->targets = parse_targets();
    }
    if (skip_op("=")) {
      n->expr = parse_tuple(true);
      expect_block_end();
      return n;
    }
    if (at_op("|")) error("unsupported: filtered block set");
    if (n->targets.size() != 1 || !n->attribute.empty()) error("a block set assigns one name");
    expect_block_end();
    n->kind = Node::Kind::kSetBlock;
    std::string end;
    n->body = parse_body({"endset"}, &end);
    expect_block_end();
    return n;
  }

  Params parse_params() {
    Params params;
    expect_op("(");
    while (!skip_op(")")) {
      if (!params.empty()) expect_op(",");
      if (skip_op(")")) break;
      std::string name = expect_name();
      ExprPtr default_value;
      if (skip_op("=")) default_value = parse_expression(true);
      params.emplace_back(std::move(name), std::move(default_value));
    }
    return params;
  }

  // A macro or caller body: loops outside it do not enclose it.
  Body parse_callable_body(absl::string_view end_tag) {
    const int loops = loops_;
    loops_ = 0;
    std::string end;
    Body body = parse_body({end_tag}, &end);
    loops_ = loops;
    expect_block_end();
    return body;
  }

  std::unique_ptr<Node> parse_macro(int line) {
    auto n = node(Node::Kind::kMacro, line);
    n->name = expect_name();
    n->params = parse_params();
    expect_block_end();
    n->body = parse_callable_body("endmacro");
    return n;
  }

  std::unique_ptr<Node> parse_call_block(int line) {
    auto n = node(Node::Kind::kCallBlock, line);
    if (at_op("(")) n->params = parse_params();
    n->expr = parse_expression(true);
    if (n->expr->kind != Expr::Kind::kCall) error("{% call %} needs a call");
    expect_block_end();
    n->body = parse_callable_body("endcall");
    return n;
  }

  // Expressions, lowest precedence first, as Jinja's parser orders them.

  static ExprPtr make(Expr::Kind kind, int line, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    e->name = std::move(name);
    return e;
  }
  static ExprPtr make(Expr::Kind kind, int line, std::string name, ExprPtr a, ExprPtr b = {}) {
    ExprPtr e = make(kind, line, std::move(name));
    e->items.push_back(std::move(a));
    if (b) e->items.push_back(std::move(b));
    return e;
  }

  // `a, b` without brackets is a tuple (a list at run time).
  ExprPtr parse_tuple(bool with_condition) {
    const int line = peek().line;
    ExprPtr first = parse_expression(with_condition);
    if (!at_op(",")) return first;
    ExprPtr list = make(Expr::Kind::kList, line);
    list->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (at(T::kVarEnd) || at(T::kBlockEnd) || at_op(")") || at_name("if")) break;
      list->items.push_back(parse_expression(with_condition));
    }
    return list;
  }

  ExprPtr parse_expression(bool with_condition) {
    Nest nest(*this);
    return with_condition ? parse_condition() : parse_or();
  }

  ExprPtr parse_condition() {
    ExprPtr value = parse_or();
    while (at_name("if")) {
      const int line = next().line;
      ExprPtr condition = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_condition() : nullptr;
      ExprPtr e = make(Expr::Kind::kCondition, line);
      e->items.push_back(std::move(condition));
      e->items.push_back(std::move(value));
      e->items.push_back(std::move(otherwise));
      value = std::move(e);
    }
    return value;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const int line = next().line;
      left = make(Expr::Kind::kOr, line, "", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const int line = next().line;
      left = make(Expr::Kind::kAnd, line, "", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      Nest nest(*this);
      const int line = next().line;
      return make(Expr::Kind::kUnary, line, "not", parse_not());
    }
    return parse_compare();
  }

  // One comparison: Python chains `a < b < c` as `a < b and b < c`, which this does not.
  // TODO(issue 24): chained comparisons.
  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    for (int n = 0;; ++n) {
      const int line = peek().line;
      std::string op;
      if (at(T::kOperator) &&
          (peek().value == "==" || peek().value == "!=" || peek().value == "<" ||
           peek().value == ">" || peek().value == "<=" || peek().value == ">=")) {
        op = next().value;
      } else if (skip_name("in")) {
        op = "in";
      } else if (at_name("not") && at(T::kName, "in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return left;
      }
      if (n > 0) error(absl::StrCat("unsupported: chained comparison ('", op, "' after another)"));
      left = make(Expr::Kind::kBinary, line, op, std::move(left), parse_math1());
    }
  }

  // One precedence level of left-associative binary operators.
  template <typename Next>
  ExprPtr binary_level(std::initializer_list<absl::string_view> ops, Next next_level) {
    ExprPtr left = (this->*next_level)();
    while (true) {
      bool matched = false;
      for (absl::string_view op : ops) {
        if (at_op(op)) {
          const int line = next().line;
          left = make(Expr::Kind::kBinary, line, std::string(op), std::move(left),
                      (this->*next_level)());
          matched = true;
          break;
        }
      }
      if (!matched) return left;
    }
  }

  ExprPtr parse_math1() { return binary_level({"+", "-"}, &Parser::parse_concat); }
  ExprPtr parse_concat() { return binary_level({"~"}, &Parser::parse_math2); }
  ExprPtr parse_math2() { return binary_level({"*", "/", "//", "%"}, &Parser::parse_pow); }
  ExprPtr parse_pow() { return binary_level({"**"}, &Parser::parse_filtered_unary); }
  ExprPtr parse_filtered_unary() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    Nest nest(*this);
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      e = make(Expr::Kind::kUnary, t.line, t.value, parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    switch (t.type) {
      case T::kName: {
        if (t.value == "true" || t.value == "True") return literal(true, t.line);
        if (t.value == "false" || t.value == "False") return literal(false, t.line);
        if (t.value == "none" || t.value == "None") return literal(nullptr, t.line);
        return make(Expr::Kind::kName, t.line, t.value);
      }
      case T::kString: {
        std::string s = t.value;
        while (at(T::kString)) s += next().value;  // adjacent literals join, as in Python
        return literal(s, t.line);
      }
      case T::kInteger:
        return literal(integer(t.value), t.line);
      case T::kFloat:
        return literal(std::strtod(t.value.c_str(), nullptr), t.line);  // 1e999: inf
      case T::kOperator:
        if (t.value == "(") return parse_parenthesized(t.line);
        if (t.value == "[") return parse_list(t.line);
        if (t.value == "{") return parse_dict(t.line);
        [[fallthrough]];
      default:
        --pos_;
        error(absl::StrCat("unexpected ", describe(t)));
    }
  }

  int64_t integer(const std::string& digits) const {
    int64_t n = 0;
    const char* end = digits.data() + digits.size();
    const auto [ptr, ec] = std::from_chars(digits.data(), end, n);
    if (ec != std::errc() || ptr != end) {
      error(absl::StrCat("unsupported: integer ", digits, " (out of 64-bit range)"));
    }
    return n;
  }

  static ExprPtr literal(Json value, int line) {
    ExprPtr e = make(Expr::Kind::kLiteral, line);
    e->value = std::move(value);
    return e;
  }

  ExprPtr parse_parenthesized(int line) {
    if (skip_op(")")) return make(Expr::Kind::kList, line);  // ()
    ExprPtr e = parse_expression(true);
    if (at_op(",")) {  // a tuple
      ExprPtr list = make(Expr::Kind::kList, line);
      list->items.push_back(std::move(e));
      while (skip_op(",") && !at_op(")")) list->items.push_back(parse_expression(true));
      e = std::move(list);
    }
    expect_op(")");
    return e;
  }

  ExprPtr parse_list(int line) {
    ExprPtr list = make(Expr::Kind::kList, line);
    while (!skip_op("]")) {
      if (!list->items.empty()) expect_op(",");
      if (skip_op("]")) break;
      list->items.push_back(parse_expression(true));
    }
    return list;
  }

  ExprPtr parse_dict(int line) {
    ExprPtr dict = make(Expr::Kind::kDict, line);
    while (!skip_op("}")) {
      if (!dict->items.empty()) expect_op(",");
      if (skip_op("}")) break;
      dict->items.push_back(parse_expression(true));
      expect_op(":");
      dict->items.push_back(parse_expression(true));
    }
    return dict;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (skip_op(".")) {
        if (at(T::kInteger)) {
          e = make(Expr::Kind::kSubscript, line, "", std::move(e),
                   literal(integer(next().value), line));
        } else {
          e = make(Expr::Kind::kAttribute, line, expect_name(), std::move(e));
        }
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), line);
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr subject, int line) {
    ExprPtr parts[3];
    int part = 0;
    bool slice = false;
    while (!skip_op("]")) {
      if (skip_op(":")) {
        if (++part > 2) error("a slice has at most three parts");
        slice = true;
        continue;
      }
      if (parts[part]) error("expected ']'");
      parts[part] = parse_expression(true);
    }
    if (!slice) {
      if (!parts[0]) error("empty subscript");
      return make(Expr::Kind::kSubscript, line, "", std::move(subject), std::move(parts[0]));
    }
    ExprPtr e = make(Expr::Kind::kSlice, line);
    e->items.push_back(std::move(subject));
    for (ExprPtr& p : parts) e->items.push_back(std::move(p));
    return e;
  }

  // `(args...)` after a callee, a filter or a test: appended to e's items and named.
  void parse_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (at_op("**")) error("unsupported: **kwargs in calls");
      if (at_op("*")) {  // *list: its items as positional arguments
        const int line = next().line;
        if (!e.named.empty()) error("*args follows a keyword argument");
        e.items.push_back(make(Expr::Kind::kUnary, line, "*", parse_expression(true)));
        continue;
      }
      if (at(T::kName) && at(T::kOperator, "=", 1)) {
        std::string name = next().value;
        next();
        e.named.emplace_back(std::move(name), parse_expression(true));
      } else {
        if (!e.named.empty()) error("a positional argument follows a keyword argument");
        e.items.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr e = make(Expr::Kind::kCall, peek().line, "", std::move(callee));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (skip_op("|")) {
        std::string name = expect_name();
        if (!has_filter(name)) error(absl::StrCat("unsupported: filter '", name, "'"));
        e = make(Expr::Kind::kFilter, line, std::move(name), std::move(e));
        if (at_op("(")) parse_args(*e);
      } else if (skip_name("is")) {
        e = parse_test(std::move(e), line);
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr subject, int line) {
    const bool negated = skip_name("not");
    std::string name = expect_name();
    if (!has_test(name)) error(absl::StrCat("unsupported: test '", name, "'"));
    ExprPtr e = make(Expr::Kind::kTest, line, std::move(name), std::move(subject));
    if (at_op("(")) {
      parse_args(*e);
    } else if ((at(T::kName) || at(T::kString) || at(T::kInteger) || at(T::kFloat) || at_op("[") ||
                at_op("{") || at_op("(")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      if (at_name("is")) error("tests cannot be chained with 'is'");
      e->items.push_back(parse_postfix(parse_primary()));
    }
    return negated ? make(Expr::Kind::kUnary, line, "not", std::move(e)) : std::move(e);
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loops_ = 0;
};

}  // namespace

Body parse(const std::string& source) { return Parser(lex(source)).run(); }

}  // namespace fpa::jinja
