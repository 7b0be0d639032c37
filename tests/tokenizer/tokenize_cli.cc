// The tokenizer of a model directory as a filter, for tests/tokenizer/parity.mjs:
//   tokenize_cli DIR < {"encode": [hex bytes...], "decode": [[ids]...]}
//   -> {"kind": ..., "encode": [[ids]...], "decode": [hex bytes...]}
// Hex carries invalid UTF-8 both ways.
#include <iostream>
#include <iterator>
#include <string>

#include "model/model.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace {

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string to_hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 15]);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenize_cli DIR < requests.json\n";
    return 2;
  }
  fpa::ModelConfig config;
  config.vocab_size = 259;
  auto tokenizer = fpa::load_tokenizer(argv[1], config);
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  const nlohmann::json in = nlohmann::json::parse(std::cin);
  nlohmann::json out = {{"kind", (*tokenizer)->kind()},
                        {"encode", nlohmann::json::array()},
                        {"decode", nlohmann::json::array()}};
  for (const auto& hex : in["encode"]) {
    out["encode"].push_back((*tokenizer)->encode(from_hex(hex.get<std::string>())));
  }
  for (const auto& ids : in["decode"]) {
    out["decode"].push_back(to_hex((*tokenizer)->decode(ids.get<std::vector<int32_t>>())));
  }
  std::cout << out.dump() << "\n";
  return 0;
}
