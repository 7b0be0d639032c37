// Values printed as Python prints them: str() for {{ }} output and |string, repr() inside
// containers, and json.dumps for the tojson filter.
#pragma once

#include <optional>
#include <string>

#include "model/jinja/value.h"

namespace fpa::jinja {

// str(v): strings as they are, undefined as "", None/True/False, 1.0, lists and dicts as repr.
std::string py_str(const Value& v);

// repr(j): 'quoted' strings, [1, 'a'], {'k': None}.
// TODO(issue 24): strings escape control and C1 characters only; Python also escapes other
// non-printable code points (U+200B, U+2028, ...) as \uXXXX.
std::string py_repr(const Json& j);

// repr(x) of a float: the shortest round trip, "1.0", "1e+16", "inf", "nan".
std::string float_repr(double x);

// Options of json.dumps as transformers' tojson filter passes them.
struct DumpOptions {
  std::optional<std::string> indent;          // None: one line
  std::optional<std::string> item_separator;  // None: ", ", or "," with an indent
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};

// json.dumps(j, ...) with Python's spacing and float spelling.
std::string json_dumps(const Json& j, const DumpOptions& options);

}  // namespace fpa::jinja
