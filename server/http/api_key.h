// --api-key: the HTTP API's Bearer check, as vLLM's --api-key does it.
#pragma once

#include <string_view>

namespace fpa::server {

// Whether `authorization` (the header's value) is "Bearer <key>". The comparison takes the same
// time whatever the bytes sent, so the key cannot be guessed a byte at a time.
bool bearer_matches(std::string_view authorization, std::string_view key);

}  // namespace fpa::server
