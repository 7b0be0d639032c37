// The nesting depth of a JSON text, measured before nlohmann-json builds a value from it: the
// library parses deep texts fine, but copying or walking the value recurses once per level, so
// a few hundred kilobytes of brackets overflow the stack (and a deep safetensors header costs
// far more memory than its size).
#pragma once

#include <cstddef>
#include <string_view>

namespace fpa {

// Deep enough for every request and file format read here (the deepest use is 3 levels).
inline constexpr size_t kMaxJsonDepth = 64;

// Whether no array or object in `text` nests deeper than `max_depth` levels. Brackets inside
// strings do not count; the text is not otherwise validated (the parser does that).
bool json_depth_within(std::string_view text, size_t max_depth = kMaxJsonDepth);

}  // namespace fpa
