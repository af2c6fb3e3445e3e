#include "common/model/model_config.h"

#include "gtest/gtest.h"

namespace pdserve {
namespace {

constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
  "vocab_size": 128256, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16"})";

TEST(ModelConfigTest, ParsesLlama31) {
  auto c = ModelConfig::FromJson(kLlama31, "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kLlama);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c->rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{128001, 128008, 128009}));
  EXPECT_EQ(*c->bos_token_id, 128000);
  EXPECT_FALSE(c->qkv_bias);
  // Llama 3.1 8B has 8.03e9 parameters.
  EXPECT_NEAR(static_cast<double>(c->NumParameters()), 8.03e9, 0.01e9);
}

TEST(ModelConfigTest, FamilyFlags) {
  auto qwen2 = ModelConfig::FromJson(R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "vocab_size": 300, "use_sliding_window": false,
      "sliding_window": 32768})", "q2");
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_TRUE(qwen2->qkv_bias);
  EXPECT_FALSE(qwen2->o_bias);
  EXPECT_EQ(qwen2->sliding_window, 0);
  auto qwen3 = ModelConfig::FromJson(R"({"architectures": ["Qwen3ForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "vocab_size": 300})", "q3");
  ASSERT_TRUE(qwen3.ok());
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_EQ(qwen3->head_dim, 128);  // Qwen3's default, not hidden/heads.
  auto mistral = ModelConfig::FromJson(R"({"architectures": ["MistralForCausalLM"],
      "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "vocab_size": 300})", "m");
  ASSERT_TRUE(mistral.ok());
  EXPECT_EQ(mistral->sliding_window, 4096);  // Transformers' default when the key is absent.
}

TEST(ModelConfigTest, ErrorsNameFileAndField) {
  auto unknown = ModelConfig::FromJson(R"({"architectures": ["GPT2LMHeadModel"]})", "dir/config.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("dir/config.json"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("GPT2LMHeadModel"), std::string::npos);

  auto negative = ModelConfig::FromJson(R"({"architectures": ["LlamaForCausalLM"],
      "hidden_size": -4, "intermediate_size": 1, "num_hidden_layers": 1,
      "num_attention_heads": 1, "vocab_size": 10})", "c.json");
  ASSERT_FALSE(negative.ok());
  EXPECT_NE(negative.status().message().find("hidden_size"), std::string::npos);

  auto gqa = ModelConfig::FromJson(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 1, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_key_value_heads": 3, "vocab_size": 10})", "c.json");
  ASSERT_FALSE(gqa.ok());
  EXPECT_NE(gqa.status().message().find("num_key_value_heads"), std::string::npos);

  auto yarn = ModelConfig::FromJson(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
      "intermediate_size": 1, "num_hidden_layers": 1, "num_attention_heads": 4,
      "vocab_size": 10, "rope_scaling": {"rope_type": "yarn", "factor": 4}})", "c.json");
  ASSERT_FALSE(yarn.ok());
  EXPECT_NE(yarn.status().message().find("yarn"), std::string::npos);

  EXPECT_FALSE(ModelConfig::FromJson("not json", "c.json").ok());
  EXPECT_FALSE(ModelConfig::FromJson("[1,2]", "c.json").ok());
}

// Sizes no model has are refused by name at load (they made `serve` die of std::bad_alloc and
// kv-calc print negative byte counts).
TEST(ModelConfigTest, AbsurdSizesAreRefusedByName) {
  for (const auto& [field, value] : std::vector<std::pair<std::string, std::string>>{
           {"num_hidden_layers", "1000000000"},
           {"num_hidden_layers", "100000000000000"},
           {"hidden_size", "1048576"},
           {"intermediate_size", "4000000000"},
           {"vocab_size", "2147483648"},
           {"num_attention_heads", "65536"},
           {"num_key_value_heads", "4096"},
           {"head_dim", "100000"},
           {"max_position_embeddings", "1000000000000"}}) {
    std::string json = kLlama31;
    const std::string key = "\"" + field + "\": ";
    if (const size_t at = json.find(key); at != std::string::npos) {
      json.replace(at, json.find_first_of(",}", at) - at, key + value);
    } else {
      json.replace(json.size() - 1, 1, ", " + key + value + "}");
    }
    auto c = ModelConfig::FromJson(json, "c.json");
    ASSERT_FALSE(c.ok()) << field << " " << value;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(field), std::string::npos) << c.status();
  }
  ASSERT_TRUE(ModelConfig::FromJson(kLlama31, "c.json").ok());
}

}  // namespace
}  // namespace pdserve
