// Tokens -> the statement tree. Unknown filters and tests are refused here (as Jinja refuses
// them when it compiles), so a template's problems surface when a model loads. Constructs
// outside the supported subset fail with "unsupported: <construct>".
#pragma once

#include <string>

#include "model/jinja/ast.h"

namespace fpa::jinja {

// Bounds nesting (blocks inside blocks, parentheses, operators), so that neither parsing nor
// rendering the tree recurses without limit.
inline constexpr int kMaxNesting = 96;

// Fails (Error) naming the line and the problem.
Body parse(const std::string& source);

}  // namespace fpa::jinja
