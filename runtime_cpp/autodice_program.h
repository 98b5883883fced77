// autodice program engine: runs a plan given as data.
//
// A generated program.cpp holds only the plan, as the tables below (what each rank loads,
// receives, computes and sends), and calls run_program(). Everything that is the same for
// every plan lives here, compiled and tested once: argument parsing, loading the net on the CPU
// or a Vulkan device, the pipelined frame loop (receives for the next frame posted before the
// current one is computed, outputs extracted in data-dependency order, each cut tensor sent as
// soon as it exists, sends waited for only when their buffers come round again), stage replicas
// taking every R-th frame, and stats.json.
//
// The tables name tensors only for messages; ncnn blobs are addressed by position (pnnx names a
// sub-model's inputs in0..inN and outputs out0..outN), files by names autodice made safe.
#pragma once

#include <string>
#include <vector>

#include "autodice_types.h"  // not autodice_runtime.h: no MPI or ncnn for the generated tables

namespace autodice {

enum class Device { Cpu, Gpu };

// A tensor of the rank's sub-model that crosses its boundary (an input or an output).
struct TensorSpec {
  std::string name;  // the ONNX tensor name, for messages only
  Shape shape;
  DType dtype = DType::Float32;
};

// A model input this rank reads from --inputs (and may forward to other ranks).
struct ModelInput {
  int tensor;        // index into RankPlan::tensors
  int blob;          // the sub-model input in<blob>
  std::string file;  // file name inside --inputs
};

// A tensor another rank sends: frame f comes from srcs[f % srcs.size()] (several sources: the
// producing stage has replicas) as MPI messages of plan edge `edge`.
struct Receive {
  int tensor;
  int blob;  // in<blob>
  std::vector<int> srcs;
  int edge;
  Wire wire = Wire::Fp32;  // gen --wire, for a float32 tensor from another host (tables name
                           // it where it is not fp32)
};

// A sub-model output this rank extracts, out<blob>.
struct Produce {
  int tensor;
  int blob;
};

// A tensor this rank sends (a produced output, or a model input it read): frame f goes to
// dsts[f % dsts.size()] (several: the consuming stage has replicas).
struct Send {
  int tensor;
  std::vector<int> dsts;
  int edge;
  Wire wire = Wire::Fp32;  // as the receiving end's Receive::wire
};

// One step: wait for these receives (indices into RankPlan::receives), then extract these
// outputs (indices into RankPlan::produces).
struct Step {
  std::vector<int> wait;
  std::vector<int> extract;
};

// A model output this rank makes: written after the last frame.
struct ModelOutput {
  int produce;  // index into RankPlan::produces
  std::string file;
};

struct RankPlan {
  int rank;
  std::string key;   // mapping key: names the model files <key>.ncnn.param/.bin
  std::string host;
  Device device;
  int gpu_index;     // Vulkan device on GPU ranks
  int threads;       // OpenMP threads on CPU ranks
  bool fp16;         // fp16 storage and arithmetic where the device has them (else fp32)
  bool cpu_fp16;     // the same for a GPU rank computing on the CPU (--gpu-fallback cpu): a CPU
                     // rank's precision (fp32 unless gen --precision fp16), not its GPU's
  bool int8;         // some layers quantized by gen --precision int8 (the rest fp32)
  int replica;       // this rank takes frames f with f % replicas == replica
  int replicas;
  std::vector<TensorSpec> tensors;
  std::vector<ModelInput> inputs;
  std::vector<Receive> receives;
  std::vector<Produce> produces;
  std::vector<Step> steps;
  std::vector<Send> sends;
  std::vector<ModelOutput> outputs;
  int64_t bytes_sent;      // per frame this rank takes
  int64_t bytes_received;
};

struct ProgramPlan {
  std::string model;  // the ONNX file it came from, for messages
  int edges;          // tags: edge + edges * (frame % 2)
  std::vector<RankPlan> ranks;
};

// The whole program: parse `--inputs DIR --results DIR [--models DIR] [--frames N]
// [--no-pipeline] [--gpu-fallback cpu]`, run this process's rank of `plan`, gather stats.json on
// rank 0. With `--stream SOCKET` instead of --inputs/--frames the job has one process more, the
// gateway (autodice_stream.h): frames come from the application connected there, results go back
// to it, and so does stats.json. Returns the exit code (errors end every rank through abort_run).
int run_program(int argc, char** argv, const ProgramPlan& plan);

// The device a rank will run on, checked before anything runs: "cpu", or "vulkan:<name>" for a
// GPU rank whose Vulkan device exists. A GPU rank without one aborts naming rank, host and what
// ncnn found, unless `fallback_cpu` (then "cpu (no Vulkan device)"). Exposed for the tests.
std::string choose_device(const RankPlan& r, bool fallback_cpu);

}  // namespace autodice
