// The weights of a model directory: model.safetensors, or the shards a Hugging Face
// model.safetensors.index.json lists (its weight_map), as one name -> tensor lookup.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/safetensors.h"

namespace fpa {

class TensorFiles {
 public:
  // Errors name the file; a directory with only pytorch_model.bin is told how to convert it.
  static absl::StatusOr<TensorFiles> open(const std::string& dir);

  // NotFound naming the file (or the index) and the tensor.
  absl::StatusOr<TensorView> get(const std::string& name) const;
  // The file that holds `name` (the index's first shard when none does), for messages.
  const std::string& path_of(const std::string& name) const;
  // Every tensor name with its file.
  const std::map<std::string, const SafetensorsFile*>& tensors() const { return where_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

}  // namespace fpa
