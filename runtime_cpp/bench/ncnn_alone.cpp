// The baseline for the generated program's overhead: the same ncnn model, options and input,
// run frame after frame by a plain loop with no MPI, no plan and no packing.
//
//   ncnn_alone MODEL.ncnn.param MODEL.ncnn.bin INPUT.npy 1x3x224x224 THREADS FRAMES [pools]
//
// Prints {"frames": N, "seconds": S, "fps": F, "steady_fps": F1, "load_s": L, "peak_rss": B};
// the clock starts after loading, as the generated program's does. F1 counts the frames after the
// first from the end of the first, as the program's steady_fps does. Blobs come from where the
// program's do (autodice::allocate_activations), and the weights load as its do
// (autodice::LoadingHeap); with "pools", from ncnn's own pool allocators
// and glibc's default settings, as a plain ncnn program has them.
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "autodice_runtime.h"
#include "net.h"

namespace {

autodice::Shape parse_shape(const std::string& text) {
  autodice::Shape shape;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t x = text.find('x', start);
    shape.push_back(std::stoll(text.substr(start, x - start)));
    if (x == std::string::npos) break;
    start = x + 1;
  }
  return shape;
}

}  // namespace

int main(int argc, char** argv) {
  const bool pools = argc == 8 && std::string(argv[7]) == "pools";
  if (argc != 7 && !pools) {
    std::fprintf(stderr, "usage: %s PARAM BIN INPUT.npy SHAPE THREADS FRAMES [pools]\n",
                 argv[0]);
    return 2;
  }
  const autodice::Timer loading;
  ncnn::Net net;
  if (!pools) {
    autodice::use_heap_allocator();
    autodice::allocate_activations(net.opt);
  }
  net.opt.num_threads = std::atoi(argv[5]);
  net.opt.lightmode = true;
  // The generated program's fp32 options, so both run the same kernels.
  autodice::compute_in_fp32(net.opt);
  std::optional<autodice::LoadingHeap> as_program;
  if (!pools) as_program.emplace();
  if (net.load_param(argv[1]) != 0 || net.load_model(argv[2]) != 0) {
    std::fprintf(stderr, "cannot load %s / %s\n", argv[1], argv[2]);
    return 1;
  }
  as_program.reset();
  const autodice::Shape shape = parse_shape(argv[4]);
  const autodice::NpyArray input = autodice::npy_load(argv[3], autodice::DType::Float32, shape);
  const ncnn::Mat in = autodice::mat_from_dense(input.f32(), shape);
  const double load_s = loading.elapsed_ms() / 1e3;

  const int frames = std::atoi(argv[6]);
  const autodice::Timer clock;
  ncnn::Mat out;
  double first_end_s = 0;  // the steady state is what comes after the first frame, as a rank's
  for (int f = 0; f < frames; ++f) {
    ncnn::Extractor ex = net.create_extractor();
    ex.input("in0", in);
    if (ex.extract("out0", out) != 0) {
      std::fprintf(stderr, "extracting out0 failed\n");
      return 1;
    }
    if (f == 0) first_end_s = clock.elapsed_ms() / 1e3;
  }
  const double seconds = clock.elapsed_ms() / 1e3;
  std::printf("{\"frames\": %d, \"seconds\": %.6f, \"fps\": %.4f, \"steady_fps\": %.4f, "
              "\"load_s\": %.6f, \"peak_rss\": %lld}\n", frames, seconds, frames / seconds,
              frames > 1 ? (frames - 1) / (seconds - first_end_s) : frames / seconds, load_s,
              static_cast<long long>(autodice::peak_rss_bytes()));
  return 0;
}
