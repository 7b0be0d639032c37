#include "model/jinja/lexer.h"

#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "model/jinja/value.h"
#include "model/utf8.h"

namespace fpa::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Jinja's newline normalization and its default keep_trailing_newline=False.
std::string normalize(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t at = src_.find('{', pos_);
      while (at != std::string::npos && !opens_tag(at)) at = src_.find('{', at + 1);
      if (at == std::string::npos) {
        emit_text(src_.substr(pos_));
        break;
      }
      tag(at);
    }
    out_.push_back({Token::Type::kEnd, "", line_});
    return std::move(out_);
  }

 private:
  bool opens_tag(size_t at) const {
    return at + 1 < src_.size() && std::strchr("{%#", src_[at + 1]) != nullptr;
  }

  [[noreturn]] void error(const std::string& what) const {
    fail(absl::StrCat("line ", line_, ": ", what));
  }

  void advance(size_t to) {
    for (; pos_ < to; ++pos_) line_ += src_[pos_] == '\n';
  }

  void emit_text(std::string text) {
    if (!text.empty()) out_.push_back({Token::Type::kText, std::move(text), line_});
  }

  // The text before the tag at `at`, whitespace control applied, then the tag.
  void tag(size_t at) {
    const char kind = src_[at + 1];
    const char mod = at + 2 < src_.size() ? src_[at + 2] : '\0';
    std::string text = src_.substr(pos_, at - pos_);
    if (mod == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (mod != '+' && kind != '{') {
      lstrip(text);
    }
    emit_text(std::move(text));
    advance(at + 2 + (mod == '-' || mod == '+'));
    if (kind == '#') return comment();
    out_.push_back({kind == '{' ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", line_});
    expression(kind == '{');
  }

  // lstrip_blocks: drops spaces and tabs between the start of the line and the tag.
  void lstrip(std::string& text) const {
    const size_t nl = text.rfind('\n');
    const size_t start = nl == std::string::npos ? 0 : nl + 1;
    if (start == 0 && !line_starting_) return;
    for (size_t i = start; i < text.size(); ++i) {
      if (!is_space(text[i])) return;
    }
    text.resize(start);
  }

  void comment() {
    const size_t content = pos_;
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) error("unterminated comment");
    const char mod = end > content ? src_[end - 1] : '\0';
    advance(end + 2);
    close_tag(mod, true);
  }

  // After a tag's closer: `-` strips the whitespace that follows, trim_blocks drops a newline.
  void close_tag(char mod, bool block) {
    const size_t start = pos_;
    if (mod == '-') {
      size_t to = pos_;
      while (to < src_.size() && is_space(src_[to])) ++to;
      advance(to);
    } else if (mod != '+' && block && pos_ < src_.size() && src_[pos_] == '\n') {
      advance(pos_ + 1);
    }
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  // Tokens up to the tag's closer; brackets must balance before it counts.
  void expression(bool variable) {
    int depth = 0;
    while (true) {
      size_t to = pos_;
      while (to < src_.size() && is_space(src_[to])) ++to;
      advance(to);
      if (pos_ >= src_.size()) error(variable ? "unterminated {{" : "unterminated {%");
      if (depth == 0 && closes(variable)) return;
      const char c = src_[pos_];
      if (is_name_start(c)) {
        name();
      } else if (is_digit(c)) {
        number();
      } else if (c == '\'' || c == '"') {
        string_literal(c);
      } else {
        depth += op();
        if (depth < 0) depth = 0;  // an unbalanced closer: the parser reports it
      }
    }
  }

  bool closes(bool variable) {
    const std::string_view rest(src_.data() + pos_, src_.size() - pos_);
    const char* closer = variable ? "}}" : "%}";
    char mod = '\0';
    if ((rest.starts_with('-') || (!variable && rest.starts_with('+'))) &&
        rest.substr(1).starts_with(closer)) {
      mod = rest[0];
    } else if (!rest.starts_with(closer)) {
      return false;
    }
    out_.push_back({variable ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "", line_});
    advance(pos_ + 2 + (mod != '\0'));
    close_tag(mod, !variable);
    return true;
  }

  void name() {
    size_t end = pos_;
    while (end < src_.size() && is_name_char(src_[end])) ++end;
    out_.push_back({Token::Type::kName, src_.substr(pos_, end - pos_), line_});
    advance(end);
  }

  void number() {
    size_t end = pos_;
    auto digits = [&] {
      while (end < src_.size() && (is_digit(src_[end]) || src_[end] == '_')) ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && is_digit(src_[e])) {
        is_float = true;
        end = e;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    out_.push_back({is_float ? Token::Type::kFloat : Token::Type::kInteger, text, line_});
    advance(end);
  }

  // Python's escapes, as Jinja decodes string literals ("unicode-escape").
  void string_literal(char quote) {
    std::string value;
    size_t i = pos_ + 1;
    for (; i < src_.size() && src_[i] != quote; ++i) {
      if (src_[i] != '\\' || i + 1 >= src_.size()) {
        value += src_[i];
        continue;
      }
      i = escape(i + 1, value);
    }
    if (i >= src_.size()) error("unterminated string");
    out_.push_back({Token::Type::kString, std::move(value), line_});
    advance(i + 1);
  }

  static std::optional<char> simple_escape(char c) {
    switch (c) {
      case 'n':
        return '\n';
      case 't':
        return '\t';
      case 'r':
        return '\r';
      case 'a':
        return '\a';
      case 'b':
        return '\b';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '\\':
      case '\'':
      case '"':
        return c;
      default:
        return std::nullopt;
    }
  }

  // The escape whose letter is at `i`, appended to `value`; returns the index of its last byte.
  size_t escape(size_t i, std::string& value) const {
    const char c = src_[i];
    if (std::optional<char> simple = simple_escape(c)) {
      value += *simple;
      return i;
    }
    if (c == '\n') return i;  // a backslash-newline continues the line
    const int hex_digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (hex_digits) {
      const std::string hex = src_.substr(i + 1, hex_digits);
      if (hex.size() != static_cast<size_t>(hex_digits) ||
          hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
        error("truncated string escape");
      }
      const unsigned long cp = std::stoul(hex, nullptr, 16);
      if (cp > 0x10FFFF) error("string escape out of range");
      utf8::append(value, static_cast<char32_t>(cp));
      return i + hex_digits;
    }
    value += '\\';  // unknown escapes stay as written
    value += c;
    return i;
  }

  // An operator; returns the change in bracket depth.
  int op() {
    static constexpr const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* two : kTwo) {
      if (src_.compare(pos_, 2, two) == 0) {
        out_.push_back({Token::Type::kOperator, two, line_});
        advance(pos_ + 2);
        return 0;
      }
    }
    const char c = src_[pos_];
    if (std::strchr("+-*/%~<>()[]{},.:|=", c) == nullptr) {
      error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
    out_.push_back({Token::Type::kOperator, std::string(1, c), line_});
    advance(pos_ + 1);
    return std::strchr("([{", c) ? 1 : std::strchr(")]}", c) ? -1 : 0;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(const std::string& source) { return Lexer(normalize(source)).run(); }

}  // namespace fpa::jinja
