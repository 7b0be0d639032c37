// Reading JSON files (config.json, tokenizer files) with errors that name the file and key.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace fpa {

// The whole file; NotFound when it cannot be opened.
absl::StatusOr<std::string> read_text_file(const std::string& path);

// The JSON object in `path`, or an error naming the file.
absl::StatusOr<nlohmann::json> read_json_object(const std::string& path);

// Typed field readers: an absent (or null) field keeps the default, a wrong type is an error
// naming the file and the key (nlohmann's own accessors would throw instead).
class JsonFields {
 public:
  JsonFields(const nlohmann::json& j, std::string path) : j_(j), path_(std::move(path)) {}

  absl::Status integer(const char* key, int* out, int min_value, int max_value) const {
    if (const nlohmann::json* v = find(key)) {
      if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > INT_MAX) ||
          v->get<int64_t>() < min_value || v->get<int64_t>() > max_value) {
        return error(key, absl::StrCat("must be an integer in [", min_value, ", ", max_value, "]"));
      }
      *out = v->get<int>();
    }
    return absl::OkStatus();
  }
  absl::Status required_dim(const char* key, int* out, int max_value) const {
    if (find(key) == nullptr) return error(key, "is missing");
    return integer(key, out, 1, max_value);
  }
  // A finite float in [min_value, max_value] (read as a double first: 1e300 is no float).
  absl::Status number(const char* key, float* out, double min_value, double max_value) const {
    if (const nlohmann::json* v = find(key)) {
      if (!v->is_number() || !(v->get<double>() >= min_value && v->get<double>() <= max_value)) {
        return error(key, absl::StrCat("must be a number in [", min_value, ", ", max_value, "]"));
      }
      *out = v->get<float>();
    }
    return absl::OkStatus();
  }
  absl::Status boolean(const char* key, bool* out) const {
    if (const nlohmann::json* v = find(key)) {
      if (!v->is_boolean()) return error(key, "must be true or false");
      *out = v->get<bool>();
    }
    return absl::OkStatus();
  }
  absl::Status string(const char* key, std::string* out) const {
    if (const nlohmann::json* v = find(key)) {
      if (!v->is_string()) return error(key, "must be a string");
      *out = v->get<std::string>();
    }
    return absl::OkStatus();
  }
  const std::string& path() const { return path_; }
  absl::Status error(const char* key, const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": '", key, "' ", what));
  }

  // The key's value; null when absent or null.
  const nlohmann::json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

 private:
  const nlohmann::json& j_;
  std::string path_;
};

}  // namespace fpa
