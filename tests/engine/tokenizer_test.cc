// The tokenizer interface (model/tokenizer.h): the byte tokenizer, TokenStream's whole-character
// streaming, LongCrawl64's JSON escaping, and byte-level BPE on a small hand-made vocabulary
// (tests/tokenizer/parity.mjs checks a real GPT-2 vocabulary against Hugging Face's code).
#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "model/json_escape.h"
#include "model/model.h"
#include "model/pretokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/engine/model_files.h"

namespace fpa {
namespace {

using ::fpa::testing::TempDir;
using nlohmann::json;

const std::string kFffd = "\xEF\xBF\xBD";

std::vector<int32_t> ids_of(const std::string& bytes) {
  std::vector<int32_t> ids;
  for (unsigned char c : bytes) ids.push_back(c);
  return ids;
}

std::unique_ptr<Tokenizer> byte_tokenizer() {
  ModelConfig c;
  c.vocab_size = 259;
  return make_byte_tokenizer(c);
}

TEST(ByteTokenizer, BosThenBytesAndSpecialsCarryNoText) {
  auto tok = byte_tokenizer();
  EXPECT_EQ(tok->encode("h\xC3\xA9"), (std::vector<int32_t>{256, 104, 0xC3, 0xA9}));
  EXPECT_EQ(tok->encode(""), (std::vector<int32_t>{256}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{256, 'o', 257, 'k', 258}), "ok");
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_TRUE(tok->is_special(257));
}

TEST(TokenStream, HoldsBackASplitCharacter) {
  auto tok = byte_tokenizer();
  TokenStream d(*tok);
  EXPECT_EQ(d.push(ids_of("a\xE2")), "a");
  EXPECT_EQ(d.push(ids_of("\x82")), "");
  EXPECT_EQ(d.push(ids_of("\xAC!")), "\xE2\x82\xAC!");
  EXPECT_EQ(d.finish(), "");
  EXPECT_EQ(d.bytes(), "a\xE2\x82\xAC!");
}

TEST(TokenStream, InvalidBytesBecomeOneReplacementPerMaximalSubpart) {
  auto tok = byte_tokenizer();
  TokenStream d(*tok);
  // A lone continuation byte, an overlong lead, a truncated 3-byte sequence before ASCII and a
  // surrogate: the same answers as Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(d.push(ids_of("\x80")), kFffd);
  EXPECT_EQ(d.push(ids_of("\xC0\xAF")), kFffd + kFffd);
  EXPECT_EQ(d.push(ids_of("\xE2\x82"
                          "A")),
            kFffd + "A");
  EXPECT_EQ(d.push(ids_of("\xED\xA0\x80")), kFffd + kFffd + kFffd);
}

TEST(TokenStream, FinishFlushesATruncatedCharacter) {
  auto tok = byte_tokenizer();
  TokenStream d(*tok);
  EXPECT_EQ(d.push(ids_of("x\xF0\x9F")), "x");
  EXPECT_EQ(d.finish(), kFffd);
  EXPECT_EQ(d.finish(), "");
}

TEST(JsonEscape, MatchesPythonJsonDumps) {
  // json.dumps('é\n"\\😀\x01\x7f/ a')[1:-1]
  EXPECT_EQ(json_escape("\xC3\xA9\n\"\\\xF0\x9F\x98\x80\x01\x7F/ a"),
            R"(\u00e9\n\"\\\ud83d\ude00\u0001\u007f/ a)");
}

TEST(JsonUnescaper, AnySplitGivesTheWholeAnswer) {
  const std::string escaped = R"(a\u00e9\n\"\\\ud83d\ude00\/\t\u4e2dz)";
  const std::string want =
      "a\xC3\xA9\n\"\\\xF0\x9F\x98\x80/\t\xE4\xB8\xAD"
      "z";
  for (size_t cut = 0; cut <= escaped.size(); ++cut) {
    for (size_t cut2 = cut; cut2 <= escaped.size(); ++cut2) {
      JsonUnescaper u;
      std::string got = u.push(escaped.substr(0, cut));
      got += u.push(escaped.substr(cut, cut2 - cut));
      got += u.push(escaped.substr(cut2));
      got += u.finish();
      ASSERT_EQ(got, want) << "cuts " << cut << ", " << cut2;
    }
  }
}

TEST(JsonUnescaper, MalformedEscapesStayAsText) {
  JsonUnescaper u;
  std::string got = u.push(R"(\q \u12G4 \ud83d! \)");
  got += u.finish();
  EXPECT_EQ(got, "\\q \\u12G4 " + kFffd + "! \\");
}

TEST(Pretokenizer, SplitsAsGpt2) {
  auto pre = Pretokenizer::compile(kGpt2Pattern);
  ASSERT_TRUE(pre.ok()) << pre.status();
  std::vector<std::string_view> got =
      pre->split("Hello  world's 123\xC2\xA0\xD0\xBF\xD1\x80\xD0\xB8 \xF0\x9F\x98\x80!!\n\n x");
  std::vector<std::string_view> want = {"Hello",
                                        " ",
                                        " world",
                                        "'s",
                                        " 123",
                                        "\xC2\xA0",  // NBSP is \s
                                        "\xD0\xBF\xD1\x80\xD0\xB8",
                                        " \xF0\x9F\x98\x80!!",
                                        "\n\n",
                                        " x"};
  EXPECT_EQ(got, want);
  // NEL is \s and BOM is not, as for GPT-2's Python regex (which gives these very pieces).
  got = pre->split(
      "\n\n\xC2\x85\x01x a\xC2\x85"
      "b \xEF\xBB\xBF"
      "c");
  want = {"\n\n", "\xC2\x85", "\x01", "x", " a", "\xC2\x85", "b", " \xEF\xBB\xBF", "c"};
  EXPECT_EQ(got, want);
}

using ::fpa::testing::spell;

std::string spell(const std::string& bytes) {
  std::string s;
  for (unsigned char b : bytes) s += spell(b);
  return s;
}

// Ids 0-255: the bytes; then merges h+e, l+l, he+ll, hell+o, " "+w, " w"+o; then "<|end|>".
struct SmallVocab {
  json vocab = json::object();
  std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}, {" w", "o"}, {" ", " "}};
  SmallVocab() {
    for (int b = 0; b < 256; ++b) vocab[spell(static_cast<unsigned char>(b))] = b;
    int id = 256;
    for (const auto& [a, b] : merges) vocab[spell(a + b)] = id++;
    vocab["<|end|>"] = id;
  }
  void write_gpt2(const std::string& dir, const json& tokenizer_config) const {
    std::ofstream(dir + "/vocab.json") << vocab.dump();
    std::ofstream m(dir + "/merges.txt");
    m << "#version: 0.2\n";
    for (const auto& [a, b] : merges) m << spell(a) << " " << spell(b) << "\n";
    std::ofstream(dir + "/tokenizer_config.json") << tokenizer_config.dump();
  }
};

std::unique_ptr<Tokenizer> load(const std::string& dir) {
  ModelConfig c;
  auto tok = load_tokenizer(dir, c);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

TEST(BpeTokenizer, MergesByRankAndSplitsOutSpecialTokens) {
  TempDir dir;
  SmallVocab v;
  v.write_gpt2(dir.path(), {{"bos_token", "<|end|>"}, {"eos_token", "<|end|>"}});
  auto tok = load(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->special().eos, 263);
  // "hello" -> he, ll -> hell -> hello; " wo" -> " w" -> " wo"; "rld" stays bytes.
  EXPECT_EQ(tok->encode("hello world<|end|>hell"),
            (std::vector<int32_t>{259, 261, 'r', 'l', 'd', 263, 258}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{259, 261, 263, 'r'}), "hello wor");
}

TEST(BpeTokenizer, AddsBosAndJsonEscapesForLongCrawl64) {
  TempDir dir;
  SmallVocab v;
  v.write_gpt2(dir.path(), {{"tokenizer_class", "JSONGPT2Tokenizer"},
                            {"add_bos_token", true},
                            {"bos_token", {{"content", "<|end|>"}}}});
  auto tok = load(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->kind(), "bpe-json");
  std::vector<int32_t> ids = tok->encode("hello\n\xC3\xA9");
  // BOS, hello, then the escapes' ASCII: \ n \ u 0 0 e 9.
  std::vector<int32_t> want = {263, 259};
  for (char c : std::string(R"(\n\u00e9)")) want.push_back(c);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok->decode(ids), "hello\n\xC3\xA9");
  TokenStream s(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += s.push(std::vector<int32_t>{id});
  EXPECT_EQ(streamed + s.finish(), "hello\n\xC3\xA9");
}

TEST(BpeTokenizer, InvalidUtf8IsReadAsReplacementCharacters) {
  TempDir dir;
  SmallVocab v;
  v.write_gpt2(dir.path(), json::object());
  auto tok = load(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->decode(tok->encode("a\xFF\xC3")), "a" + kFffd + kFffd);
}

TEST(BpeTokenizer, LongWhitespaceRunsEncodeQuickly) {
  TempDir dir;
  SmallVocab v;
  v.write_gpt2(dir.path(), json::object());
  auto tok = load(dir.path());
  ASSERT_NE(tok, nullptr);
  const std::string spaces(200000, ' ');  // one piece: quadratic merging would take minutes
  std::vector<int32_t> ids = tok->encode(spaces + "x");
  EXPECT_EQ(ids.size(), 100002u);  // 99999 double spaces, one space; " ", "x"
  EXPECT_EQ(tok->decode(ids), spaces + "x");
}

TEST(BpeTokenizer, TokenizerJsonWithTemplateBos) {
  TempDir dir;
  SmallVocab v;
  json merges = json::array();
  for (const auto& [a, b] : v.merges) merges.push_back({spell(a), spell(b)});
  json t = {{"model", {{"type", "BPE"}, {"vocab", v.vocab}, {"merges", merges}}},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"post_processor",
             {{"type", "TemplateProcessing"},
              {"single", {{{"SpecialToken", {{"id", "<|end|>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
              {"special_tokens", {{"<|end|>", {{"id", "<|end|>"}, {"ids", {263}}}}}}}},
            {"added_tokens", {{{"id", 263}, {"content", "<|end|>"}, {"special", true}}}}};
  std::ofstream(dir.path() + "/tokenizer.json") << t.dump();
  auto tok = load(dir.path());
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->encode("hello"), (std::vector<int32_t>{263, 259}));
}

TEST(LoadTokenizer, RefusesWhatItDoesNotImplementNamingTheKey) {
  TempDir dir;
  json t = {{"normalizer", {{"type", "NFC"}}}, {"model", {{"type", "BPE"}}}};
  std::ofstream(dir.path() + "/tokenizer.json") << t.dump();
  ModelConfig c;
  auto tok = load_tokenizer(dir.path(), c);
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("tokenizer.json: 'normalizer'"), std::string::npos)
      << tok.status();
}

TEST(LoadTokenizer, NoTokenizerFilesMeansTheByteTokenizer) {
  TempDir dir;
  ModelConfig c;
  c.vocab_size = 259;
  auto tok = load_tokenizer(dir.path(), c);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->kind(), "byte");
}

}  // namespace
}  // namespace fpa
