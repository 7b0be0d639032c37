// Jinja's operators and element access with Python's semantics: arithmetic, comparison,
// `in`, attribute and subscript lookup (Jinja's order: a dict's methods before its keys for
// `.name`, keys before methods for `[key]`), slices, and iteration.
#pragma once

#include <string>
#include <string_view>

#include "model/jinja/value.h"

namespace fpa::jinja {

// a op b for op in + - * / // % ** ~ == != < > <= >= "in" "not in".
Value binary_op(absl::string_view op, const Value& a, const Value& b);

// item in container (a substring, an element, a key; nothing is in undefined).
bool contains(const Value& container, const Value& item);

Value attribute(const Value& subject, const std::string& name);
Value subscript(const Value& subject, const Value& key);
// subject[start:stop:step]; undefined parts are absent.
Value slice(const Value& subject, const Value& start, const Value& stop, const Value& step);

// The elements a for loop visits: a list's items, a dict's keys, a string's characters,
// nothing for undefined. `what` names the value in errors.
Json iterate(const Value& v, absl::string_view what);

// The integer of an int or bool; fails naming `what` otherwise.
int64_t to_int(const Value& v, absl::string_view what);

}  // namespace fpa::jinja
