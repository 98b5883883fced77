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

// How a float32 tensor travels between ranks on different hosts (gen --wire): as it is; as IEEE
// half floats, rounded to the nearest even (half the bytes); or as 8-bit steps between that
// frame's smallest and largest value of the tensor, which travel with it (a quarter, plus 8
// bytes). Within a host every tensor travels as it is.
enum class Wire { Fp32, Fp16, Int8 };

}  // namespace autodice
