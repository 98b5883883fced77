// profile_layers on a Vulkan device (profile_gpu.cpp): what --gpu N measures besides the CPU.
#pragma once

#include <string>

#include "net.h"

// A GPU rank's net: Vulkan device `index`, ncnn's default precision there (fp16 where the device
// has it) unless `fp32`, as the generated program loads it. Ends the run naming the device when
// there is none, or the net does not load there.
void load_gpu(ncnn::Net& net, const std::string& param, const std::string& bin, bool fp32,
              int index);

// Whether Vulkan device `index` is a CPU (lavapipe): its work takes the CPU's cores.
bool vulkan_on_cpu(int index);

// "[{bytes, upload_s, download_s}, ...]": the fastest of 15 copies of 4 KB..4 MiB tensors
// between host memory and Vulkan device `index`, with a GPU rank's options.
std::string gpu_transfer_rows(int index);
