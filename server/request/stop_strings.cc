#include "server/request/stop_strings.h"

#include <algorithm>

namespace fpa::server {

bool stop_in_tail(std::string_view text, size_t new_bytes, const std::vector<std::string>& stops) {
  return std::any_of(stops.begin(), stops.end(), [&](const std::string& s) {
    const size_t window = std::min(text.size(), new_bytes + s.size() - 1);
    return text.substr(text.size() - window).find(s) != std::string_view::npos;
  });
}

std::string StopTrimmer::push(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);
  // The earliest stop wins, as in vLLM; among stops starting there, the longest is cut.
  size_t at = std::string::npos, len = 0;
  for (const std::string& s : stops_) {
    size_t pos = pending_.find(s);
    if (pos < at || (pos == at && pos != std::string::npos && s.size() > len)) {
      at = pos;
      len = s.size();
    }
  }
  std::string out;
  if (at != std::string::npos) {
    stopped_ = true;
    out = pending_.substr(0, include_stop_ ? at + len : at);
    pending_.clear();
    return out;
  }
  const size_t ready = pending_.size() - held_suffix();
  out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StopTrimmer::finish(std::string_view tail) {
  std::string out = push(tail);
  if (stopped_) return out;
  out += pending_;
  pending_.clear();
  return out;
}

size_t StopTrimmer::held_suffix() const {
  size_t held = 0;
  for (const std::string& s : stops_) {
    // The longest proper prefix of s that pending_ ends with.
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > held; --n) {
      if (std::string_view(pending_).ends_with(std::string_view(s).substr(0, n))) {
        held = n;
        break;
      }
    }
  }
  return held;
}

}  // namespace fpa::server
