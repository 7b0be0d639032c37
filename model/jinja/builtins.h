// The filters, tests, methods and global functions templates call (filters.cc, tests.cc,
// methods.cc, globals.cc).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "model/jinja/value.h"

namespace fpa::jinja {

// The longest string a filter, method or operator may build (a bound on `'x' * n` and
// replace(), which grow without the output growing).
inline constexpr size_t kMaxStringBytes = 16 << 20;
// The most items range() may produce.
inline constexpr int64_t kMaxRange = 1 << 20;

bool has_filter(absl::string_view name);
Value apply_filter(absl::string_view name, const Value& subject, Args& args);

bool has_test(absl::string_view name);
bool apply_test(absl::string_view name, const Value& subject, Args& args);

// `receiver.name` when it names a str, dict or list method: a function bound to receiver;
// otherwise undefined.
Value method(const Value& receiver, absl::string_view name);

// The global functions: range, namespace, dict, raise_exception, strftime_now (reading `now`).
std::vector<std::pair<std::string, Value>> global_functions(
    std::function<std::chrono::system_clock::time_point()> now);

// Raised by raise_exception(msg): the template's own message, reported as it is.
struct RaisedError : Error {
  using Error::Error;
};

}  // namespace fpa::jinja
