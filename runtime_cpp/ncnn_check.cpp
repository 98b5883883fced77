// ncnn_check: does ncnn load a converted sub-model, and what does it compute?
//
//   ncnn_check MODEL.ncnn.param MODEL.ncnn.bin OUT_DIR [IN0.npy IN1.npy ...]
//   ncnn_check --devices
//
// `autodice gen` runs it on every sub-model pnnx converted, before anything is built or
// deployed: a layer type ncnn cannot create, or a conversion that computes something else than
// the ONNX sub-model, is then an error at gen time naming the rank, not a failed run on a board.
//
// First every layer type of the .param file is looked up in ncnn's registry; unknown ones are
// printed as `unknown-layer TYPE NAME` lines and the exit code is 3. Otherwise the net is loaded
// (fp32, one thread, CPU: the check is about the conversion, not the device) and, given inputs
// for in0.., every output out0.. is written as OUT_DIR/out<k>.npy. Exit 4 if loading fails.
// --devices prints the Vulkan devices ncnn finds, one `INDEX<TAB>NAME` line each.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autodice_runtime.h"
#include "layer.h"
#include "net.h"
#if NCNN_VULKAN
#include "gpu.h"
#endif

namespace {

// (type, name) of every layer line of an ncnn .param file (after the magic and the counts).
std::vector<std::pair<std::string, std::string>> param_layers(const std::string& path) {
  std::ifstream in(path);
  if (!in) autodice::abort_run("cannot read " + path, 4);
  std::string line;
  std::getline(in, line);  // magic 7767517
  std::getline(in, line);  // layer and blob counts
  std::vector<std::pair<std::string, std::string>> layers;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string type, name;
    if (words >> type >> name) layers.emplace_back(type, name);
  }
  return layers;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--devices") {
#if NCNN_VULKAN
    for (int i = 0; i < ncnn::get_gpu_count(); ++i)
      std::printf("%d\t%s\n", i, ncnn::get_gpu_info(i).device_name());
#endif
    return 0;
  }
  if (argc < 4) {
    std::fprintf(stderr, "usage: ncnn_check MODEL.param MODEL.bin OUT_DIR [IN.npy ...]\n");
    return 2;
  }
  const std::string param = argv[1], bin = argv[2], out = argv[3];
  int unknown = 0;
  for (const auto& [type, name] : param_layers(param)) {
    if (ncnn::layer_to_index(type.c_str()) < 0) {
      std::printf("unknown-layer %s %s\n", type.c_str(), name.c_str());
      ++unknown;
    }
  }
  if (unknown) return 3;

  ncnn::Net net;
  net.opt.num_threads = 1;
  net.opt.use_vulkan_compute = false;
  autodice::compute_in_fp32(net.opt);
  if (net.load_param(param.c_str()) != 0 || net.load_model(bin.c_str()) != 0) {
    std::printf("load-failed\n");
    return 4;
  }
  if (argc == 4) return 0;
  ncnn::Extractor ex = net.create_extractor();
  for (int k = 4; k < argc; ++k) {
    try {
      const autodice::NpyArray a = autodice::npy_load(argv[k]);
      ex.input(("in" + std::to_string(k - 4)).c_str(), autodice::mat_from_dense(a.f32(), a.shape));
    } catch (const std::exception& e) {
      autodice::abort_run(e.what(), 2);
    }
  }
  for (const char* blob : net.output_names()) {
    ncnn::Mat m;
    if (ex.extract(blob, m) != 0) autodice::abort_run(std::string("extracting ") + blob, 5);
    std::vector<float> dense(static_cast<size_t>(m.w) * m.h * m.d * m.c);
    autodice::dense_from_mat(m, dense.data());
    autodice::Shape shape = autodice::mat_shape(m);
    shape.insert(shape.begin(), 1);  // the batch axis ncnn does not keep
    autodice::npy_save(out + "/" + blob + ".npy", autodice::DType::Float32, shape, dense.data());
  }
  return 0;
}
