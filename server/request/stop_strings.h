// Stop sequences as OpenAI and vLLM apply them: generation ends at the first occurrence of any
// stop string, and the text a client sees ends just before it (or just after it with vLLM's
// include_stop_str_in_output). The scheduler uses stop_in_tail to end a request; the HTTP layer
// uses StopTrimmer to cut the text, holding back streamed text that could still become a stop.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace fpa::server {

// Whether a stop string occurs in `text` overlapping its last `new_bytes` bytes: a stop can end
// inside a multi-byte token, not only at its end.
bool stop_in_tail(std::string_view text, size_t new_bytes, const std::vector<std::string>& stops);

class StopTrimmer {
 public:
  StopTrimmer(std::vector<std::string> stops, bool include_stop)
      : stops_(std::move(stops)), include_stop_(include_stop) {}

  // The text that can be sent now: everything up to a stop (then nothing more, ever), less a
  // suffix that is the start of some stop string.
  std::string push(std::string_view text);
  // The held-back text once generation has ended without a stop string (plus `tail`).
  std::string finish(std::string_view tail);
  // Drops what is held back and ends the text (a stop token id ended generation).
  void stop_here() { stopped_ = true; }

 private:
  size_t held_suffix() const;  // bytes at the end of pending_ that could start a stop string

  std::vector<std::string> stops_;
  bool include_stop_;
  std::string pending_;  // pushed, not yet returned
  bool stopped_ = false;
};

}  // namespace fpa::server
