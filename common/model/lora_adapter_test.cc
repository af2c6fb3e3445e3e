#include "common/model/lora_adapter.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/base/file_util.h"
#include "common/model/lora_registry.h"
#include "common/model/random_lora.h"
#include "common/model/safetensors.h"
#include "common/model/safetensors_writer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

ModelConfig Shape(int64_t hidden = 64) {
  ModelConfig c;
  c.vocab_size = 256;
  c.hidden_size = hidden;
  c.intermediate_size = 2 * hidden;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = hidden / 4;
  c.max_position_embeddings = 512;
  return c;
}

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp ? tmp : "/tmp", "pdserve_lora_test_" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

std::string Written(const std::string& name, RandomLoraSpec spec = {}, ModelConfig c = Shape()) {
  const std::string dir = FreshDir(name);
  EXPECT_TRUE(WriteRandomLora(spec, c, dir).ok());
  return dir;
}

void EditConfig(const std::string& dir, const char* field, const nlohmann::json& value) {
  std::ifstream in(dir + "/adapter_config.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j[field] = value;
  std::ofstream(dir + "/adapter_config.json") << j.dump();
}

// The error's message names `what`.
void ExpectRefused(const absl::StatusOr<std::shared_ptr<const LoraAdapter>>& r,
                   absl::StatusCode code, const std::string& what) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(r.status().message().find(what), std::string_view::npos) << r.status();
}

TEST(LoraAdapter, LoadsPeftMatricesWithTheScaleFoldedIntoB) {
  RandomLoraSpec spec;
  spec.rank = 8;
  spec.alpha = 16;
  spec.targets = {LoraTarget::kQ, LoraTarget::kV, LoraTarget::kDown};
  const std::string dir = Written("load", spec);
  auto a = LoraAdapter::Load("mine", dir, Shape(), 16);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->name(), "mine");
  EXPECT_EQ((*a)->rank(), 8);
  EXPECT_DOUBLE_EQ((*a)->scale(), 2.0);
  EXPECT_TRUE((*a)->targets(LoraTarget::kQ));
  EXPECT_FALSE((*a)->targets(LoraTarget::kK));
  EXPECT_EQ((*a)->matrices(1, LoraTarget::kK), nullptr);
  const LoraAdapter::Matrices* down = (*a)->matrices(1, LoraTarget::kDown);
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->a_ref.rows, 8);
  EXPECT_EQ(down->a_ref.cols, 128);
  EXPECT_EQ(down->b_ref.rows, 64);
  // B as stored in the file, times alpha / r.
  auto file = SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  ASSERT_TRUE(file.ok());
  const SafetensorsTensor* b = (*file)->Find("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
  ASSERT_NE(b, nullptr);
  float first;
  std::memcpy(&first, b->data, 4);
  EXPECT_EQ(down->b[0], first * 2.0f);
}

TEST(LoraAdapter, RsLoraScalesByTheSquareRootOfTheRank) {
  RandomLoraSpec spec;
  spec.rank = 16;
  spec.alpha = 8;
  spec.rslora = true;
  auto a = LoraAdapter::Load("r", Written("rslora", spec), Shape(), 64);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_DOUBLE_EQ((*a)->scale(), 2.0);
}

TEST(LoraAdapter, RefusesWhatItWouldComputeWrongNamingTheFieldOrTensor) {
  const std::string dir = Written("refuse");
  ExpectRefused(LoraAdapter::Load("x", dir + "/nowhere", Shape(), 16), absl::StatusCode::kNotFound,
                "adapter_config.json");
  ExpectRefused(LoraAdapter::Load("x", dir, Shape(), 4), absl::StatusCode::kInvalidArgument,
                "field 'r' is 8, above this server's --max-lora-rank 4");
  ExpectRefused(LoraAdapter::Load("x", dir, Shape(96), 16), absl::StatusCode::kInvalidArgument,
                "down_proj.lora_A.weight' has shape [8, 128]; this base model's down_proj at r=8 needs [8, 192]");
  for (auto [field, value, what] :
       {std::tuple{"use_dora", nlohmann::json(true), "DoRA"},
        {"bias", nlohmann::json("all"), "field 'bias'"},
        {"fan_in_fan_out", nlohmann::json(true), "fan_in_fan_out"},
        {"modules_to_save", nlohmann::json::array({"lm_head"}), "modules_to_save"},
        {"rank_pattern", nlohmann::json{{"q_proj", 4}}, "rank_pattern"},
        {"target_modules", nlohmann::json::array({"embed_tokens"}), "embed_tokens"},
        {"target_modules", nlohmann::json::array({"q_proj"}), "which target_modules does not list"},
        {"r", nlohmann::json(0), "field 'r' must be a positive integer"},
        {"peft_type", nlohmann::json("PREFIX_TUNING"), "peft_type"}}) {
    const std::string d = Written(std::string("field_") + field);
    EditConfig(d, field, value);
    ExpectRefused(LoraAdapter::Load("x", d, Shape(), 16), absl::StatusCode::kInvalidArgument, what);
  }
}

TEST(LoraAdapter, RefusesTensorsItDoesNotRun) {
  const ModelConfig c = Shape();
  auto write = [&](const std::string& name, const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
    const std::string d = Written(name);
    SafetensorsWriter w;
    for (const auto& [n, shape] : tensors) {
      int64_t count = 1;
      for (int64_t s : shape) count *= s;
      w.Add(n, DType::kF32, shape, std::vector<float>(static_cast<size_t>(count), 0.5f));
    }
    EXPECT_TRUE(w.WriteFile(d + "/adapter_model.safetensors").ok());
    return d;
  };
  const std::string p = "base_model.model.model.layers.0.self_attn.q_proj.";
  ExpectRefused(LoraAdapter::Load("x", write("dora", {{p + "lora_magnitude_vector", {64}}}), c, 16),
                absl::StatusCode::kInvalidArgument, "DoRA");
  ExpectRefused(LoraAdapter::Load("x", write("emb", {{"base_model.model.model.embed_tokens.lora_embedding_A", {8, 256}}}), c, 16),
                absl::StatusCode::kInvalidArgument, "embeddings or lm_head");
  ExpectRefused(LoraAdapter::Load("x", write("half", {{p + "lora_A.weight", {8, 64}}}), c, 16),
                absl::StatusCode::kInvalidArgument, "layer 0's q_proj has lora_A but not lora_B");
  ExpectRefused(LoraAdapter::Load("x", write("deep", {{"base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight", {8, 64}}}), c, 16),
                absl::StatusCode::kInvalidArgument, "is for layer 7; the base model has 2");
  ExpectRefused(LoraAdapter::Load("x", write("swap", {{"base_model.model.model.layers.0.mlp.q_proj.lora_A.weight", {8, 64}}}), c, 16),
                absl::StatusCode::kInvalidArgument, "mlp.q_proj");
  ExpectRefused(LoraAdapter::Load("x", write("empty", {}), c, 16), absl::StatusCode::kInvalidArgument,
                "holds no LoRA matrices");
  // A truncated file.
  const std::string d = Written("truncated");
  std::filesystem::resize_file(d + "/adapter_model.safetensors", 100);
  ExpectRefused(LoraAdapter::Load("x", d, c, 16), absl::StatusCode::kInvalidArgument,
                "adapter_model.safetensors");
}

TEST(LoraRegistry, ServesByNameAndKeepsAtMostMaxLoaded) {
  LoraRegistry reg(Shape(), {.max_rank = 16, .max_loaded = 2});
  for (const char* n : {"a", "b", "c"}) {
    RandomLoraSpec spec;
    spec.seed = n[0];
    ASSERT_TRUE(reg.Add(n, Written(std::string("reg_") + n, spec)).ok());
  }
  EXPECT_EQ(reg.Add("a", Written("reg_dup")).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(reg.Add("", Written("reg_noname")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reg.loaded(), 2);  // "a", the least recently added, was dropped.
  EXPECT_EQ(reg.Acquire("nope").status().code(), absl::StatusCode::kNotFound);
  auto a = reg.Acquire("a");  // Loaded again from its directory.
  ASSERT_TRUE(a.ok()) << a.status();
  auto c = reg.Acquire("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(reg.loaded(), 2);
  // Both loaded ones are held: "b" cannot be loaded now.
  EXPECT_EQ(reg.Acquire("b").status().code(), absl::StatusCode::kResourceExhausted);
  c->reset();
  EXPECT_TRUE(reg.Acquire("b").ok());
  // Removed while a request holds it: the request's copy stays valid; new requests are refused.
  ASSERT_TRUE(reg.Remove("a").ok());
  EXPECT_EQ((*a)->name(), "a");
  EXPECT_NE((*a)->matrices(0, LoraTarget::kQ), nullptr);
  EXPECT_EQ(reg.Acquire("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Remove("a").code(), absl::StatusCode::kNotFound);
  ASSERT_EQ(reg.List().size(), 2u);
  EXPECT_EQ(reg.List()[0].name, "b");
  EXPECT_EQ(reg.List()[0].rank, 8);
}

// The KV root is what the adapter computes: the same files give the same root, under any name;
// other values, or the same values at another scale, another root; never the base model's.
TEST(LoraAdapter, KvRootFollowsTheMatricesNotTheName) {
  const ModelConfig c = Shape();
  const std::string d = Written("root");
  auto a = LoraAdapter::Load("a", d, c, 16);
  auto twin = LoraAdapter::Load("twin", d, c, 16);
  ASSERT_TRUE(a.ok() && twin.ok());
  EXPECT_EQ((*a)->kv_root(), (*twin)->kv_root());
  EXPECT_NE((*a)->kv_root(), BlockHash{});
  RandomLoraSpec other;
  other.seed = 99;
  auto b = LoraAdapter::Load("a", Written("root_other", other), c, 16);
  ASSERT_TRUE(b.ok());
  EXPECT_NE((*a)->kv_root(), (*b)->kv_root());
  EditConfig(d, "lora_alpha", 3);
  auto rescaled = LoraAdapter::Load("a", d, c, 16);
  ASSERT_TRUE(rescaled.ok());
  EXPECT_NE((*a)->kv_root(), (*rescaled)->kv_root());
}

// Runtime loads count as loads; an adapter read again after its files changed takes their root.
TEST(LoraRegistry, CountsLoadsAndFollowsChangedFiles) {
  LoraRegistry reg(Shape(), {.max_rank = 16, .max_loaded = 1});
  const std::string da = Written("count_a");
  RandomLoraSpec spec;
  spec.seed = 5;
  ASSERT_TRUE(reg.Add("a", da).ok());
  ASSERT_TRUE(reg.Add("b", Written("count_b", spec)).ok());  // Drops "a".
  EXPECT_EQ(reg.loads(), 2);
  const BlockHash before = *reg.KvRoot("a");
  EXPECT_FALSE(reg.List()[0].loaded);
  EXPECT_TRUE(reg.List()[1].loaded);
  EditConfig(da, "lora_alpha", 5);
  auto a = reg.Acquire("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(reg.loads(), 3);
  EXPECT_EQ(*reg.KvRoot("a"), (*a)->kv_root());
  EXPECT_NE((*a)->kv_root(), before);
  EXPECT_FALSE(reg.KvRoot("nope").has_value());
  EXPECT_TRUE(reg.List()[0].loaded);
}

}  // namespace
}  // namespace pdserve
