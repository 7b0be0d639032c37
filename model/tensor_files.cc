#include "model/tensor_files.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "model/json_fields.h"

namespace fpa {
namespace {

// The shard files an index names, in order of first mention, each checked to stay in `dir`.
absl::StatusOr<std::vector<std::string>> shard_names(const std::string& index_path) {
  absl::StatusOr<nlohmann::json> index = read_json_object(index_path);
  if (!index.ok()) return index.status();
  auto map = index->find("weight_map");
  if (map == index->end() || !map->is_object() || map->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": 'weight_map' must be a non-empty object"));
  }
  std::vector<std::string> names;
  for (const auto& [tensor, file] : map->items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos ||
        file.get<std::string>().starts_with(".")) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": 'weight_map' entry '", tensor,
                                                     "' must name a file in the directory"));
    }
    if (std::find(names.begin(), names.end(), file.get<std::string>()) == names.end()) {
      names.push_back(file.get<std::string>());
    }
  }
  return names;
}

}  // namespace

absl::StatusOr<TensorFiles> TensorFiles::open(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(dir + "/model.safetensors") || !fs::exists(index)) {
    if (!fs::exists(dir + "/model.safetensors") && fs::exists(dir + "/pytorch_model.bin")) {
      return absl::NotFoundError(
          absl::StrCat(dir,
                       ": no model.safetensors, only pytorch_model.bin: convert it with "
                       "train/convert_bin.py (it reads tensors only, never code)"));
    }
    paths.push_back(dir + "/model.safetensors");
  } else {
    absl::StatusOr<std::vector<std::string>> shards = shard_names(index);
    if (!shards.ok()) return shards.status();
    for (const std::string& s : *shards) paths.push_back(dir + "/" + s);
  }
  TensorFiles files;
  for (const std::string& path : paths) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::open(path);
    if (!file.ok()) return file.status();
    files.files_.push_back(std::move(*file));
    for (const auto& [name, view] : files.files_.back()->tensors()) {
      if (!files.where_.emplace(name, files.files_.back().get()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", name, "' is also in ", files.path_of(name)));
      }
    }
  }
  return files;
}

absl::StatusOr<TensorView> TensorFiles::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return files_.front()->get(name);  // its NotFound names the file
  return it->second->get(name);
}

const std::string& TensorFiles::path_of(const std::string& name) const {
  auto it = where_.find(name);
  return (it == where_.end() ? files_.front().get() : it->second)->path();
}

}  // namespace fpa
