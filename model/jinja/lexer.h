// Template source -> tokens, with Hugging Face's whitespace settings applied as Jinja's lexer
// applies them: trim_blocks (one newline after a block or comment tag is dropped),
// lstrip_blocks (spaces and tabs before a block or comment tag on its own line are dropped),
// `-` on a tag strips all whitespace on that side, `+` on a block opener keeps it. As Jinja does
// by default, newlines are normalized to \n and one trailing newline is dropped.
#pragma once

#include <string>
#include <vector>

namespace fpa::jinja {

struct Token {
  enum class Type {
    kText,        // template text outside tags
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // value: the literal with escapes resolved
    kInteger,
    kFloat,
    kOperator,  // value: the operator's spelling
    kEnd,
  };
  Type type;
  std::string value;
  int line;
};

// Fails (Error) naming the line on an unterminated tag, comment or string, or a stray character.
std::vector<Token> lex(const std::string& source);

}  // namespace fpa::jinja
