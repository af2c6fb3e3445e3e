#include "common/model/model_weights.h"
#include "common/model/model_shapes.h"
#include "common/base/rng.h"
#include "common/base/dtype.h"

#include <cstdlib>
#include <filesystem>

#include "common/base/dtype.h"
#include "common/base/file_util.h"
#include "common/base/rng.h"
#include "common/model/model_shapes.h"
#include "common/model/random_model.h"
#include "common/model/safetensors_writer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve {
namespace {

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = JoinPath(tmp ? tmp : "/tmp", "pdserve_weights_test_" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadDir(const std::string& dir) {
  auto config = ModelConfig::FromFile(JoinPath(dir, "config.json"));
  if (!config.ok()) return config.status();
  return ModelWeights::Load(*config, dir);
}

TEST(ModelWeightsTest, LoadsEveryFamilyAndDtypeSharded) {
  for (std::string arch : {"llama", "mistral", "qwen2", "qwen3"}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (int shards : {1, 3}) {
        RandomModelSpec spec;
        spec.arch = arch;
        spec.dtype = dtype;
        spec.shards = shards;
        spec.tie_embeddings = arch == "qwen2";
        const std::string dir = FreshDir(arch + std::to_string(shards));
        ASSERT_TRUE(WriteRandomModel(spec, dir).ok());
        auto w = LoadDir(dir);
        ASSERT_TRUE(w.ok()) << arch << ": " << w.status();
        EXPECT_EQ((*w)->lm_head().dtype, dtype);
        EXPECT_EQ((*w)->layer(1).q_bias.empty(), arch != "qwen2");
        EXPECT_EQ((*w)->layer(0).q_norm.empty(), arch != "qwen3");
        if (spec.tie_embeddings) {
          EXPECT_EQ((*w)->lm_head().data, (*w)->embed_tokens().data);
        }
      }
    }
  }
}

// Rewrites the model with one tensor changed by `edit` (return false to drop it).
void RewriteTensor(const std::string& dir, const std::string& name,
                   const std::function<bool(std::vector<int64_t>*, std::string*)>& edit) {
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  // Read every tensor of the single-file model, write back with the edit.
  auto file = SafetensorsFile::Open(JoinPath(dir, "model.safetensors"));
  ASSERT_TRUE(file.ok());
  SafetensorsWriter w;
  for (const SafetensorsTensor& t : (*file)->tensors()) {
    std::vector<int64_t> shape = t.shape;
    std::string dtype = t.dtype_name;
    std::vector<float> values(t.nbytes / 4);
    std::memcpy(values.data(), t.data, t.nbytes);
    if (t.name == name && !edit(&shape, &dtype)) continue;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    values.resize(n);
    w.Add(t.name, DType::kF32, shape, values);
  }
  file->reset();
  ASSERT_TRUE(w.WriteFile(JoinPath(dir, "model.safetensors")).ok());
}

TEST(ModelWeightsTest, MissingTensorNamesTensorAndFile) {
  const std::string dir = FreshDir("missing");
  ASSERT_TRUE(WriteRandomModel(RandomModelSpec{}, dir).ok());
  RewriteTensor(dir, "model.layers.1.mlp.up_proj.weight", [](auto*, auto*) { return false; });
  auto w = LoadDir(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos);
  EXPECT_NE(w.status().message().find("model.safetensors"), std::string::npos);
}

TEST(ModelWeightsTest, WrongShapeNamesTensorShapesAndFile) {
  const std::string dir = FreshDir("shape");
  ASSERT_TRUE(WriteRandomModel(RandomModelSpec{}, dir).ok());
  RewriteTensor(dir, "model.layers.0.self_attn.k_proj.weight", [](std::vector<int64_t>* s, auto*) {
    (*s)[0] = 16;
    return true;
  });
  auto w = LoadDir(dir);
  ASSERT_FALSE(w.ok());
  const std::string msg(w.status().message());
  EXPECT_NE(msg.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[16, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[32, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
}

TEST(ModelWeightsTest, TruncatedShardNamesTheFile) {
  RandomModelSpec spec;
  spec.shards = 2;
  const std::string dir = FreshDir("truncated");
  ASSERT_TRUE(WriteRandomModel(spec, dir).ok());
  const std::string shard = JoinPath(dir, "model-00002-of-00002.safetensors");
  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 100);
  auto w = LoadDir(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(w.status().message().find("model-00002-of-00002.safetensors"), std::string::npos);
  EXPECT_NE(w.status().message().find("truncated"), std::string::npos);
}

TEST(ModelWeightsTest, IndexPointingAtWrongShardIsReported) {
  RandomModelSpec spec;
  spec.shards = 2;
  const std::string dir = FreshDir("index");
  ASSERT_TRUE(WriteRandomModel(spec, dir).ok());
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  auto j = nlohmann::json::parse(*ReadFileToString(index_path));
  j["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  ASSERT_TRUE(WriteStringToFile(index_path, j.dump()).ok());
  auto w = LoadDir(dir);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("model.norm.weight"), std::string::npos) << w.status();
}

TEST(ModelWeightsTest, MissingCheckpointIsNotFound) {
  const std::string dir = FreshDir("empty");
  ASSERT_TRUE(MakeDirectories(dir).ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_FALSE(ckpt.ok());
  EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
}


// Synthetic weights: every tensor the config implies, with the documented values (an element of
// each matrix recomputed here from the formula), and the shapes alone when not materialized.
TEST(ModelWeightsTest, SyntheticWeightsHaveTheDocumentedShapesAndValues) {
  auto config = ModelShape("qwen3-8b");
  ASSERT_TRUE(config.ok()) << config.status();
  ModelConfig c = *config;
  c.num_layers = 2;  // Two layers of the real widths are enough.
  c.vocab_size = 1000;
  const auto shapes = ModelWeights::Synthetic(c, 7, /*materialize=*/false);
  EXPECT_EQ(shapes->layer(1).q_proj.rows, 4096);
  EXPECT_EQ(shapes->layer(1).k_proj.rows, 1024);
  EXPECT_EQ(shapes->layer(1).down_proj.cols, 12288);
  EXPECT_EQ(shapes->layer(0).q_proj.data, nullptr);
  EXPECT_EQ(shapes->layer(0).q_norm, std::vector<float>(128, 1.0f));
  EXPECT_EQ(shapes->DecodeWeightBytes(),
            2u * (2 * (4096 * 4096 + 2 * 1024 * 4096 + 4096 * 4096 + 3 * 4096 * 12288) + 1000 * 4096));

  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  const auto w = ModelWeights::Synthetic(c, 7, /*materialize=*/true);
  // Matrix k of the stream order holds sqrt(3 / fan-in) * u(7 * 1000003 + k + 1, i).
  // Element i of m is element i + first of matrix k's stream.
  auto expect = [](const MatrixRef& m, uint64_t k, int64_t i, float scale, int64_t first = 0) {
    uint16_t got;
    std::memcpy(&got, static_cast<const uint8_t*>(m.data) + 2 * i, 2);
    EXPECT_EQ(got, F32ToBf16(scale * SymmetricUniform24(7 * 1000003 + k + 1, i + first))) << k;
  };
  const float s64 = static_cast<float>(std::sqrt(3.0 / 64)), s96 = static_cast<float>(std::sqrt(3.0 / 96));
  expect(w->layer(0).q_proj, 0, 5, s64);
  expect(w->layer(0).o_proj, 3, 100, s64);
  expect(w->layer(0).gate_proj, 4, 7, s64);
  expect(w->layer(0).up_proj, 4, 7, s64, 96 * 64);  // gate|up: one stream.
  expect(w->layer(0).down_proj, 5, 11, s96);
  expect(w->layer(1).k_proj, 7, 3, s64);
  expect(w->lm_head(), 12, 999, s64);
  expect(w->embed_tokens(), 13, 64 * 999 + 63, 1.0f);
  EXPECT_NE(w->lm_head().data, w->embed_tokens().data);  // Never tied.
  // The values are spread over [-scale, scale) with mean ~0.
  double sum = 0, sq = 0;
  const auto* q = static_cast<const uint16_t*>(w->layer(0).q_proj.data);
  for (int64_t i = 0; i < 64 * 64; ++i) {
    const double v = Bf16ToF32(q[i]);
    sum += v;
    sq += v * v;
  }
  EXPECT_NEAR(sum / 4096, 0, 0.02);
  EXPECT_NEAR(sq / 4096, s64 * s64 / 3, 0.003);  // Var of U(-a, a) = a^2 / 3.
}

TEST(ModelShapesTest, NamedShapesParseAndOthersAreNamed) {
  for (const std::string& name : ModelShapeNames()) {
    auto c = ModelShape(name);
    ASSERT_TRUE(c.ok()) << name << ": " << c.status();
  }
  auto llama = ModelShape("llama3.1-8b");
  EXPECT_EQ(llama->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(llama->NumParameters(), 8030261248);  // Meta-Llama-3.1-8B's published count.
  EXPECT_EQ(ModelShape("mistral-7b")->sliding_window, 4096);
  EXPECT_TRUE(ModelShape("qwen2.5-7b")->qkv_bias);
  EXPECT_TRUE(ModelShape("qwen3-8b")->qk_norm);
  const absl::Status missing = ModelShape("llama-9000").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("smollm-135m"), std::string::npos) << missing;
  // A model directory: its config.json.
  RandomModelSpec spec;
  const std::string dir = FreshDir("shape");
  ASSERT_TRUE(WriteRandomModel(spec, dir).ok());
  EXPECT_EQ(ModelShape(dir)->hidden_size, 64);
  EXPECT_EQ(ModelShape(JoinPath(dir, "config.json"))->num_layers, 2);
}

}  // namespace
}  // namespace pdserve
