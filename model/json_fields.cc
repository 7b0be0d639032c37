#include "model/json_fields.h"

#include <fstream>
#include <sstream>

namespace fpa {

absl::StatusOr<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<nlohmann::json> read_json_object(const std::string& path) {
  absl::StatusOr<std::string> text = read_text_file(path);
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a valid JSON object"));
  }
  return j;
}

}  // namespace fpa
