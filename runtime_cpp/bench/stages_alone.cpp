// A 2-stage pipeline's ceiling without autodice: the plan's two sub-models, each looped by a
// plain ncnn process on its own core, both at once, on the real activations (stage 1 is fed
// what stage 0 computes of the input frame). "free:NAME": each runs at its own pace, as two
// independent processes do, from a common start. "meet:NAME": the two meet at the start of every
// frame, in lockstep. "pipe:NAME": tied by their data as the generated program's ranks are,
// with as many frames in flight: stage 1 starts a frame once stage 0 has finished it, and stage
// 0 starts one once stage 1 has taken the one two frames before (the program's receiver posts
// the next frame's receive before it computes, and its sender reuses a buffer once the frame
// sent from it was taken). No MPI, no copies, no plan. In free and pipe mode the stage done
// first keeps computing (untimed) until the other is done too, so neither times a frame with
// the other core idle. NAME names the POSIX semaphores they meet by (NAME-0, NAME-1, and
// NAME-done-0, NAME-done-1).
//
//   stages_alone STAGE FRAMES free|meet|pipe:NAME INPUT.npy S0.param S0.bin OUTS S1.param S1.bin
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
    std::fprintf(stderr, "usage: %s STAGE FRAMES free|meet|pipe:NAME INPUT.npy S0.param S0.bin "
                 "OUTS S1.param S1.bin\n", argv[0]);
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
  const bool meet = mode.rfind("meet:", 0) == 0, pipe = mode.rfind("pipe:", 0) == 0;
  if (!meet && !pipe && mode.rfind("free:", 0) != 0) {
    std::fprintf(stderr, "%s: the mode is free:NAME, meet:NAME or pipe:NAME\n", argv[0]);
    return 2;
  }
  const std::string name = mode.substr(5);
  const auto open = [&](const std::string& what, int s) {
    sem_t* sem = sem_open((name + what + std::to_string(s)).c_str(), O_CREAT, 0600, 0);
    if (sem == SEM_FAILED) {
      std::perror("sem_open");
      std::exit(1);
    }
    return sem;
  };
  sem_t *mine = open("-", stage), *other = open("-", 1 - stage);
  sem_t *done = open("-done-", stage), *other_done = open("-done-", 1 - stage);
  const auto meet_other = [&] {
    sem_post(mine);
    sem_wait(other);
  };
  meet_other();  // both have opened every semaphore: their names can go
  if (stage == 0)
    for (const char* what : {"-", "-done-"})
      for (int s : {0, 1}) sem_unlink((name + what + std::to_string(s)).c_str());
  // Pipe: NAME-0 counts the frames stage 0 finished, NAME-1 the frames stage 0 may start.
  constexpr int in_flight = 2;
  if (pipe && stage == 1)
    for (int i = 0; i < in_flight; ++i) sem_post(mine);
  const autodice::Timer clock;
  double first_end_ms = 0;
  for (int f = 0; f < frames; ++f) {
    if (meet && f > 0) meet_other();
    if (pipe) {
      sem_wait(other);  // stage 0: a free slot; stage 1: a finished frame
      if (stage == 1) sem_post(mine);  // taken: its slot is free again
    }
    run(net, ins, net_outs);
    if (pipe && stage == 0) sem_post(mine);
    if (f == 0) first_end_ms = clock.elapsed_ms();
  }
  const double steady_ms = (clock.elapsed_ms() - first_end_ms) / (frames - 1);
  if (!meet) {  // keep the other core's stage company until it is done too
    sem_post(done);
    while (sem_trywait(other_done) != 0) run(net, ins, net_outs);
  }
  std::printf("{\"stage\": %d, \"steady_ms\": %.4f}\n", stage, steady_ms);
  return 0;
}
