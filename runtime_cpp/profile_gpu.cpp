// profile_layers on a Vulkan device: a GPU rank's net and the copies to and from the device;
// see profile_gpu.h.
#include "profile_gpu.h"

#include <algorithm>
#include <cstdio>

#include "autodice_runtime.h"
#if NCNN_VULKAN
#include "command.h"
#include "gpu.h"
#endif

void load_gpu(ncnn::Net& net, const std::string& param, const std::string& bin, bool fp32,
              int index) {
#if NCNN_VULKAN
  if (index >= ncnn::get_gpu_count())
    autodice::abort_run("no Vulkan device " + std::to_string(index) + " (ncnn found " +
                        std::to_string(ncnn::get_gpu_count()) + ")", 7);
  net.opt.use_vulkan_compute = true;
  net.set_vulkan_device(index);
  net.opt.num_threads = 1;  // a GPU rank's host side has one core (partition.py)
  net.opt.lightmode = true;
  autodice::allocate_activations(net.opt);
  if (fp32) autodice::compute_in_fp32(net.opt);
  if (net.load_param(param.c_str()) != 0 || net.load_model(bin.c_str()) != 0)
    autodice::abort_run("cannot load " + param + " on Vulkan device " +
                        std::to_string(index), 4);
  if (!net.opt.use_vulkan_compute)
    autodice::abort_run("ncnn could not use Vulkan device " + std::to_string(index), 7);
#else
  (void)net;
  (void)param;
  (void)bin;
  (void)fp32;
  (void)index;
  autodice::abort_run("this ncnn has no Vulkan: --gpu needs a build with NCNN_VULKAN", 7);
#endif
}

bool vulkan_on_cpu(int index) {
#if NCNN_VULKAN
  return ncnn::get_gpu_info(index).type() == 3;  // VK_PHYSICAL_DEVICE_TYPE_CPU, as ncnn counts
#else
  (void)index;
  return true;
#endif
}

std::string gpu_transfer_rows(int index) {
  std::string json = "[";
#if NCNN_VULKAN
  const ncnn::VulkanDevice* vkdev = ncnn::get_gpu_device(index);
  ncnn::VkAllocator* blobs = vkdev->acquire_blob_allocator();
  ncnn::VkAllocator* staging = vkdev->acquire_staging_allocator();
  ncnn::Option opt;
  opt.blob_vkallocator = blobs;
  opt.workspace_vkallocator = blobs;
  opt.staging_vkallocator = staging;
  const std::vector<autodice::Shape> shapes = {
      {1, 1000}, {1, 64, 16, 16}, {1, 128, 28, 28}, {1, 256, 32, 32}, {1, 256, 64, 64}};
  for (size_t s = 0; s < shapes.size(); ++s) {
    ncnn::Mat host = autodice::alloc_mat(shapes[s]);
    host.fill(1.0f);
    double up = 1e30, down = 1e30;
    for (int i = 0; i < 18; ++i) {
      ncnn::VkMat dev;
      ncnn::Mat back;
      autodice::Timer t1;
      {
        ncnn::VkCompute cmd(vkdev);
        cmd.record_upload(host, dev, opt);
        cmd.submit_and_wait();
      }
      const double u = t1.elapsed_ms() / 1e3;
      autodice::Timer t2;
      {
        ncnn::VkCompute cmd(vkdev);
        cmd.record_download(dev, back, opt);
        cmd.submit_and_wait();
      }
      const double d = t2.elapsed_ms() / 1e3;
      if (i >= 3) {  // warm-up: the first copies allocate
        up = std::min(up, u);
        down = std::min(down, d);
      }
    }
    char row[128];
    std::snprintf(row, sizeof row, "%s{\"bytes\": %lld, \"upload_s\": %.9f, \"download_s\": %.9f}",
                  s ? ", " : "", static_cast<long long>(autodice::element_count(shapes[s]) * 4),
                  up, down);
    json += row;
  }
  vkdev->reclaim_blob_allocator(blobs);
  vkdev->reclaim_staging_allocator(staging);
#else
  (void)index;
#endif
  return json + "]";
}
