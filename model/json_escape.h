// The JSON escaping LongCrawl64 applied to text before tokenizing (Python's json.dumps with
// ensure_ascii, quotes stripped) and its inverse, incremental for streamed tokens.
#pragma once

#include <string>
#include <string_view>

namespace fpa {

// json.dumps(text)[1:-1]: ", \ and control characters escaped, every non-ASCII character as
// \uXXXX (UTF-16 surrogate pairs above U+FFFF). `utf8` must be valid UTF-8.
std::string json_escape(std::string_view utf8);

// json.loads('"' + text + '"') one piece at a time. Where json.loads would fail (an unknown
// escape, a lone surrogate) the text is kept literally or as U+FFFD: best effort, as the FoX
// tokenizer's fallback is.
class JsonUnescaper {
 public:
  // The unescaped bytes of `in`, holding back an escape that is not complete yet.
  std::string push(std::string_view in);
  // What is held back, literally.
  std::string finish();

 private:
  std::string drain(bool at_end);
  // Consumes one complete escape at the start of pending_ into out; false if incomplete.
  bool take_escape(std::string& out, bool at_end);

  std::string pending_;
};

}  // namespace fpa
