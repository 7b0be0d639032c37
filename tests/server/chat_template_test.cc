// chat_to_completion with and without a model's own chat template: the own template's prompt is
// token ids without an added BOS and no "<|im_end|>" stop; the default keeps ChatML. A chat's
// max_tokens defaults to the server's cap, a completion's to 16.
#include "server/openai/chat_template.h"

#include "gtest/gtest.h"
#include "model/model.h"
#include "model/model_chat_template.h"
#include "server/openai/openai_request.h"

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

TEST(ChatTemplate, ChatWithoutMaxTokensRunsToTheServerCapCompletionsTo16) {
  std::unique_ptr<Tokenizer> tokenizer = byte_tokenizer();
  RequestLimits limits;
  limits.tokenizer = tokenizer.get();
  limits.max_new_tokens = 300;
  const auto max_tokens = [&](std::string_view body, bool chat) {
    absl::StatusOr<CompletionRequest> r = parse_completion_body(body, chat, limits);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->generate.max_new_tokens() : -1;
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(max_tokens("{" + messages + "}", true), 300);
  EXPECT_EQ(max_tokens("{" + messages + R"(, "max_tokens": null})", true), 300);
  EXPECT_EQ(max_tokens("{" + messages + R"(, "max_completion_tokens": 7})", true), 7);
  EXPECT_EQ(max_tokens(R"({"prompt": "hi"})", false), kOpenAiDefaultMaxTokens);
}

}  // namespace
}  // namespace fpa::server
