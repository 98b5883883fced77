// A 2-stage pipeline's ceiling without autodice: the plan's two sub-models, each looped by a
// plain ncnn process on its own core, both at once, on the real activations (stage 1 is fed
// what stage 0 computes of the input frame). "free": each runs at its own pace, as two
// independent processes do; "meet:NAME": the two meet at the start of every frame (two POSIX
// semaphores named NAME-0 and NAME-1), as a pipeline's stages are tied by their data, with no
// MPI, no copies and no plan.
//
//   stages_alone STAGE FRAMES free|meet:NAME INPUT.npy S0.param S0.bin OUTS S1.param S1.bin
//
// Stage 0 reads in0 and writes out0..out{OUTS-1}; stage 1 reads in0..in{OUTS-1}, in that order,
// and writes out0. Prints {"stage": S, "steady_ms": T}: milliseconds a frame after the first.
// Options and allocator as the generated program's (fp32, light mode, blobs from malloc).
#include <fcntl.h>
#include <semaphore.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autodice_runtime.h"
#include "net.h"

namespace {

void load(ncnn::Net& net, const char* param, const char* bin) {
  autodice::allocate_activations(net.opt);
  net.opt.num_threads = 1;
  net.opt.lightmode = true;
  autodice::compute_in_fp32(net.opt);
  autodice::LoadingHeap loading;  // as the program loads
  if (net.load_param(param) != 0 || net.load_model(bin) != 0) {
    std::fprintf(stderr, "cannot load %s / %s\n", param, bin);
    std::exit(1);
  }
}

std::vector<ncnn::Mat> run(ncnn::Net& net, const std::vector<ncnn::Mat>& ins, int outs) {
  ncnn::Extractor ex = net.create_extractor();
  for (size_t i = 0; i < ins.size(); ++i) ex.input(("in" + std::to_string(i)).c_str(), ins[i]);
  std::vector<ncnn::Mat> got(static_cast<size_t>(outs));
  for (int o = 0; o < outs; ++o)
    if (ex.extract(("out" + std::to_string(o)).c_str(), got[static_cast<size_t>(o)]) != 0) {
      std::fprintf(stderr, "extracting out%d failed\n", o);
      std::exit(1);
    }
  return got;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: %s STAGE FRAMES free|meet:NAME INPUT.npy S0.param S0.bin OUTS "
                 "S1.param S1.bin\n", argv[0]);
    return 2;
  }
  const int stage = std::atoi(argv[1]), frames = std::atoi(argv[2]), outs = std::atoi(argv[7]);
  const std::string mode = argv[3];
  autodice::use_heap_allocator();
  const autodice::NpyArray input = autodice::npy_load(argv[4]);
  ncnn::Net first, second;
  load(first, argv[5], argv[6]);
  std::vector<ncnn::Mat> ins{autodice::mat_from_dense(input.f32(), input.shape)};
  if (stage == 1) {
    ins = run(first, ins, outs);  // the real activations, computed once
    load(second, argv[8], argv[9]);
  }
  ncnn::Net& net = stage == 0 ? first : second;
  const int net_outs = stage == 0 ? outs : 1;
  sem_t *mine = nullptr, *other = nullptr;
  if (mode.rfind("meet:", 0) == 0) {
    const std::string name = mode.substr(5);
    mine = sem_open((name + "-" + std::to_string(stage)).c_str(), O_CREAT, 0600, 0);
    other = sem_open((name + "-" + std::to_string(1 - stage)).c_str(), O_CREAT, 0600, 0);
    if (mine == SEM_FAILED || other == SEM_FAILED) {
      std::perror("sem_open");
      return 1;
    }
  }
  const autodice::Timer clock;
  double first_end_ms = 0;
  for (int f = 0; f < frames; ++f) {
    if (mine) {
      sem_post(mine);
      sem_wait(other);
    }
    run(net, ins, net_outs);
    if (f == 0) first_end_ms = clock.elapsed_ms();
  }
  const double steady_ms = (clock.elapsed_ms() - first_end_ms) / (frames - 1);
  if (mine && stage == 0) {
    const std::string name = mode.substr(5);
    sem_unlink((name + "-0").c_str());
    sem_unlink((name + "-1").c_str());
  }
  std::printf("{\"stage\": %d, \"steady_ms\": %.4f}\n", stage, steady_ms);
  return 0;
}
