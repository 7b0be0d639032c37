#include "server/http/api_key.h"

namespace fpa::server {

bool bearer_matches(std::string_view authorization, std::string_view key) {
  constexpr std::string_view kScheme = "Bearer ";
  const bool scheme = authorization.starts_with(kScheme);
  const std::string_view given = scheme ? authorization.substr(kScheme.size()) : authorization;
  // Every byte of the key is compared, whatever the length or content of `given`.
  unsigned diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(key[i]);
  }
  return scheme && diff == 0;
}

}  // namespace fpa::server
