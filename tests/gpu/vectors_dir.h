// Where the GPU tests find tests/vectors (and, through its grandparent, the model folders a case
// names relative to the repository root). The device bundle (tests/gpu/bundle.sh) carries them
// beside its binaries, so the source tree fixed at compile time is only the last resort.
#pragma once

#include <string>

namespace fpa {

// $FPA_VECTORS_DIR if set; else <binary's folder>/../tests/vectors if it exists (the bundle's
// layout); else the source tree's tests/vectors.
std::string vectors_dir();

// A path relative to the repository root, resolved beside vectors_dir().
std::string repo_path(const std::string& relative);

}  // namespace fpa
