#include "common/model/model_weights.h"

#include <cstdlib>
#include <filesystem>

#include "common/base/file_util.h"
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

}  // namespace
}  // namespace pdserve
