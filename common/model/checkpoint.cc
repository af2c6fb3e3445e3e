#include "common/model/checkpoint.h"

#include <map>

#include "common/base/strings.h"
#include "common/base/file_util.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pdserve {

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  const std::string index_path = JoinPath(dir, "model.safetensors.index.json");
  const std::string single_path = JoinPath(dir, "model.safetensors");
  // shard file name -> names the index assigns to it
  std::map<std::string, std::vector<std::string>> shards;
  if (FileExists(index_path)) {
    PD_ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return absl::DataLossError(
          Str(index_path, ": not a JSON object with a 'weight_map' object"));
    }
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::DataLossError(Str(index_path, ": weight_map entry '", it.key(),
                                                "' is not a file name"));
      }
      const std::string file = it.value().get<std::string>();
      if (file.empty() || file.find('/') != std::string::npos || file == "..") {
        return absl::InvalidArgumentError(Str(
            index_path, ": weight_map entry '", it.key(), "' names '", file,
            "', which is not a plain file name in the model directory"));
      }
      shards[file].push_back(it.key());
    }
    if (shards.empty()) return absl::DataLossError(Str(index_path, ": empty weight_map"));
    ckpt->expected_in_ = "the shards listed in " + index_path;
  } else if (FileExists(single_path)) {
    shards["model.safetensors"] = {};
    ckpt->expected_in_ = single_path;
  } else {
    return absl::NotFoundError(Str(dir, ": no model.safetensors or ",
                                            "model.safetensors.index.json (is this a Hugging "
                                            "Face model directory?)"));
  }

  for (const auto& [file_name, names] : shards) {
    PD_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                        SafetensorsFile::Open(JoinPath(dir, file_name)));
    ckpt->files_.push_back(std::move(file));
    const SafetensorsFile& f = *ckpt->files_.back();
    for (const std::string& name : names) {
      if (f.Find(name) == nullptr) {
        return absl::DataLossError(Str(index_path, " says tensor '", name, "' is in ",
                                                f.path(), ", which does not hold it"));
      }
    }
    for (const SafetensorsTensor& t : f.tensors()) {
      // With an index, only the shard it names is authoritative.
      if (!names.empty() && std::find(names.begin(), names.end(), t.name) == names.end()) continue;
      if (!ckpt->tensors_.emplace(t.name, Found{&t, &f.path()}).second) {
        return absl::DataLossError(Str(f.path(), ": tensor '", t.name,
                                                "' is also in another shard"));
      }
    }
  }
  return ckpt;
}

absl::StatusOr<Checkpoint::Found> Checkpoint::Find(std::string_view name) const {
  auto it = tensors_.find(AsAbsl(name));
  if (it == tensors_.end()) {
    return absl::NotFoundError(Str("tensor '", name, "' is missing from ", expected_in_));
  }
  return it->second;
}

}  // namespace pdserve
