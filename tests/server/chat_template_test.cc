// chat_to_completion with and without a model's own chat template: the own template's prompt is
// token ids without an added BOS and no "<|im_end|>" stop; the default keeps ChatML.
#include "server/openai/chat_template.h"

#include "gtest/gtest.h"
#include "model/model.h"
#include "model/model_chat_template.h"

namespace fpa::server {
namespace {

using json = nlohmann::json;

std::unique_ptr<Tokenizer> byte_tokenizer() {
  ModelConfig config;
  config.vocab_size = 259;  // bytes, then BOS 256 and EOS 257
  return make_byte_tokenizer(config);
}

const json kBody = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                    {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
                    {"stop", "x"}};

TEST(ChatTemplate, OwnTemplateGivesIdsWithoutAddedBosAndNoChatmlStop) {
  std::unique_ptr<Tokenizer> tokenizer = byte_tokenizer();
  auto own = std::make_shared<ModelChatTemplate>();
  own->parsed = jinja::Template::parse(
      "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"
      "{{ tools[0].function.name }}{% if add_generation_prompt %}>{% endif %}");
  ASSERT_TRUE(own->parsed.ok());
  tokenizer->set_chat_template(own);
  absl::StatusOr<json> out = chat_to_completion(kBody, *tokenizer);
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<int32_t> want;
  for (char c : std::string("user:hi;f>")) want.push_back(static_cast<unsigned char>(c));
  EXPECT_EQ((*out)["prompt"], json(want));  // the byte tokenizer adds BOS 256; not here
  EXPECT_EQ((*out)["stop"], json::array({"x"}));
  EXPECT_FALSE(out->contains("tools"));
}

TEST(ChatTemplate, UnusableOwnTemplateIsNamed) {
  std::unique_ptr<Tokenizer> tokenizer = byte_tokenizer();
  auto own = std::make_shared<ModelChatTemplate>();
  own->parsed = absl::InvalidArgumentError("tokenizer_config.json: chat template: line 1: x");
  tokenizer->set_chat_template(own);
  absl::StatusOr<json> out = chat_to_completion(kBody, *tokenizer);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(std::string(out.status().message()).find("chat template: line 1: x"),
            std::string::npos);
}

TEST(ChatTemplate, WithoutOwnTemplateChatmlStopsAtImEnd) {
  std::unique_ptr<Tokenizer> tokenizer = byte_tokenizer();
  absl::StatusOr<json> out = chat_to_completion(kBody, *tokenizer);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)["prompt"], "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ((*out)["stop"], json::array({"x", "<|im_end|>"}));
}

TEST(ChatTemplate, ChatmlReadsNullContentAsEmptyAndNamesOtherTypes) {
  std::unique_ptr<Tokenizer> tokenizer = byte_tokenizer();
  const json body = json::parse(R"({"messages": [{"role": "user", "content": "q"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function",
        "function": {"name": "f", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "1", "content": "r"}]})");
  absl::StatusOr<json> out = chat_to_completion(body, *tokenizer);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)["prompt"],
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
            "<|im_start|>tool\nr<|im_end|>\n<|im_start|>assistant\n");
  absl::StatusOr<json> bad =
      chat_to_completion({{"messages", {{{"role", "user"}, {"content", 5}}}}}, *tokenizer);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "messages[0].content: must be a string, null or an array of text parts");
}

}  // namespace
}  // namespace fpa::server
