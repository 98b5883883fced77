// autodice types: the words the plan tables and the runtime share (a tensor's shape and dtype).
//
// Light on purpose: a generated program.cpp is only tables written in these words, and it is
// what a redeploy recompiles when a layer moves, so its headers must not pull in MPI or ncnn.
#pragma once

#include <cstdint>
#include <vector>

namespace autodice {

using Shape = std::vector<int64_t>;

enum class DType { Float32, Int64 };

}  // namespace autodice
