// Where a GPU rank's time goes: the whole model on Vulkan device 0 (zero weights: only its
// .param is read) timed isolated (the GPU idle 50 ms before each run), back to back (as a rank's
// frames run, and again after 2 s of that), and between runs of every layer alone (as
// profile_layers timed it before it took the whole model back to back); an empty submission; and
// a frame's upload and a 1000-float result's download, isolated and back to back. For a machine
// with a GPU (bench/RESULTS.md, runs 4-5), built by hand against autodice's ncnn:
//   g++ -O2 -std=c++17 -fopenmp -I$NCNN/include/ncnn gpu_probe.cpp -o gpu_probe
//       -Wl,--start-group $NCNN/lib/*.a -Wl,--end-group -lpthread -ldl   (one line)
//   gpu_probe MODEL.param W H C fp32|fp16
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "command.h"
#include "datareader.h"
#include "gpu.h"
#include "net.h"

namespace {
double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
class Zeros : public ncnn::DataReader {
 public:
  int scan(const char*, void*) const override { return 0; }
  size_t read(void* buf, size_t size) const override {
    std::memset(buf, 0, size);
    return size;
  }
};
void idle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }
}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) return 2;
  const bool fp32 = std::string(argv[5]) == "fp32";
  ncnn::Net net;
  net.opt.use_vulkan_compute = true;
  net.set_vulkan_device(0);
  net.opt.lightmode = true;
  net.opt.num_threads = 1;
  if (fp32) {
    net.opt.use_fp16_packed = net.opt.use_fp16_storage = net.opt.use_fp16_arithmetic = false;
    net.opt.use_bf16_storage = false;
  }
  if (net.load_param(argv[1]) != 0) return 3;
  Zeros zeros;
  if (net.load_model(zeros) != 0) return 4;
  ncnn::Mat in(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
  in.fill(0.5f);
  auto whole = [&] {
    const double t = now_ms();
    ncnn::Extractor ex = net.create_extractor();
    ex.input("in0", in);
    for (int blob : net.output_indexes()) {
      ncnn::Mat m;
      ex.extract(blob, m, 1);
    }
    return now_ms() - t;
  };
  auto layers = [&] {
    const double t = now_ms();
    ncnn::Extractor ex = net.create_extractor();
    ex.input("in0", in);
    for (const ncnn::Layer* l : net.layers()) {
      if (l->type == "Input" || l->tops.empty()) continue;
      ncnn::Mat m;
      ex.extract(l->tops[0], m, 1);
    }
    return now_ms() - t;
  };
  for (int i = 0; i < 10; ++i) whole();
  std::vector<double> iso, b2b, later, inter, lay, first;
  for (int i = 0; i < 15; ++i) {
    idle();
    iso.push_back(whole());
  }
  for (int i = 0; i < 60; ++i) {
    const double w = whole();
    if (i >= 10) b2b.push_back(w);
  }
  const double t0 = now_ms();
  while (now_ms() - t0 < 3000) (now_ms() - t0 > 2000 ? later : first).push_back(whole());
  for (int i = 0; i < 10; ++i) {
    inter.push_back(whole());
    lay.push_back(layers());
  }
  std::printf("%s %s whole ms: isolated %.3f back-to-back %.3f, after 2 s of it %.3f (its first "
              "%.2f, last %.2f) between-layer-runs %.3f; every layer alone, summed %.3f\n",
              argv[1], argv[5], median(iso), median(b2b), median(later), first.front(),
              first.back(), median(inter), median(lay));
  std::vector<double> empty;
  for (int i = 0; i < 50; ++i) {
    const double t = now_ms();
    ncnn::VkCompute cmd(ncnn::get_gpu_device(0));
    cmd.submit_and_wait();
    empty.push_back(now_ms() - t);
  }
  std::printf("  empty submit_and_wait back-to-back %.3f ms (min %.3f)\n", median(empty),
              *std::min_element(empty.begin(), empty.end()));
  // Copies of the input and of a 1000-float result, as profile_layers times them.
  const ncnn::VulkanDevice* vkdev = ncnn::get_gpu_device(0);
  ncnn::VkAllocator* blobs = vkdev->acquire_blob_allocator();
  ncnn::VkAllocator* staging = vkdev->acquire_staging_allocator();
  ncnn::Option opt = net.opt;
  opt.blob_vkallocator = blobs;
  opt.workspace_vkallocator = blobs;
  opt.staging_vkallocator = staging;
  ncnn::Mat small(1000);
  small.fill(1.0f);
  auto low = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  for (const ncnn::Mat* host : {&in, &small}) {
    std::vector<double> up[2], down[2];  // [0]: isolated, [1]: back to back
    for (int pass = 0; pass < 2; ++pass)
      for (int i = 0; i < 23; ++i) {
        ncnn::VkMat dev;
        ncnn::Mat back;
        if (pass == 0) idle();
        double t = now_ms();
        {
          ncnn::VkCompute cmd(vkdev);
          cmd.record_upload(*host, dev, opt);
          cmd.submit_and_wait();
        }
        const double u = now_ms() - t;
        if (pass == 0) idle();
        t = now_ms();
        {
          ncnn::VkCompute cmd(vkdev);
          cmd.record_download(dev, back, opt);
          cmd.submit_and_wait();
        }
        if (i < 3) continue;  // the first copies allocate
        up[pass].push_back(u);
        down[pass].push_back(now_ms() - t);
      }
    std::printf("  %zu bytes: upload isolated %.3f (min %.3f) back-to-back %.3f (min %.3f); "
                "download isolated %.3f (min %.3f) back-to-back %.3f (min %.3f)\n",
                host->total() * 4, median(up[0]), low(up[0]), median(up[1]), low(up[1]),
                median(down[0]), low(down[0]), median(down[1]), low(down[1]));
  }
  vkdev->reclaim_blob_allocator(blobs);
  vkdev->reclaim_staging_allocator(staging);
  return 0;
}
