// Per-layer latency of one ncnn net, measured the way the generated program runs it.
//
//   profile_layers MODEL.param MODEL.bin OUT.json --threads 1,2 [--gpu 0 [--gpu-fp32]]
//                  [--cores 4,5] [--warmup 3] [--runs 11] --input in0.npy [--input in1.npy ...]
//
// --cores pins the process, and so every OpenMP thread ncnn starts after, to those cores (a
// big.LITTLE board's big or little ones: a rank the rankfile binds there runs on nothing else);
// OUT.json's "cores" says which cores it then ran on, as the kernel reports them.
//
// The net is loaded once per thread count (ncnn picks kernels and tile sizes for
// opt.num_threads while it loads) with the generated program's options: fp32 end to end, light
// mode, no Vulkan. Each run times every thread count in turn, and each of them twice, so drift
// hits all alike:
//   whole  one Extractor extracts the net's outputs, as a rank that holds the whole model does;
//   layers one Extractor extracts the first output blob of every layer in file order and times
//          each extract. File order is topological and every earlier blob is still held, so
//          each extract runs exactly that one layer.
// Two details keep "layers" honest: the nets allocate as the generated program's do
// (autodice::allocate_activations; with the net's local pool, extract() would deep-copy every blob
// it returns), and blobs are taken unpacked (type 1) and dropped at once, so no extra
// conversion runs and no in-place consumer finds a blob shared with us and clones it.
//
// One untimed pass first records a fingerprint (element count, sum, sum of |x|, sum of x^2) of
// every layer output; autodice matches them against onnxruntime's tensors to learn which ONNX
// layers each ncnn layer computes (pnnx fuses Conv+BatchNorm+ReLU and renames everything).
// Each layer's entry also holds the heap bytes its weights take as read ("loaded") and once
// ncnn has repacked them ("resident"), and what its forward allocates only while it runs
// ("workspace"), measured in one more load and run of the net (layer_bytes).
// OUT.json holds the raw times of every run; autodice takes the medians. Progress goes to
// stderr as "progress DONE TOTAL" lines.
//
// With --gpu N the net is also loaded on Vulkan device N as a GPU rank loads it (ncnn's default
// fp16 storage and arithmetic, or fp32 with --gpu-fp32: what gen gives a rank whose values pass
// fp16's range) and one host thread, timed after the CPU's runs under the key "gpu" (its whole
// model back to back, as a rank runs frames: run_back_to_back); each of its layer extracts
// includes downloading that layer's output, so OUT.json also holds upload and download times of
// 4 KB..4 MiB tensors ("gpu_transfer") for autodice to take the download out again and to cost
// the copies a GPU rank makes of what it receives and sends.
//
//   mpirun -np CORES profile_layers MODEL.param MODEL.bin OUT.json --corun --input ...
//
// measures how much one core slows down while the others run the net too (see measure_corun).
//
//   mpirun -np 2 profile_layers --link OUT.json
//
// measures the link between two ranks instead: the median and the fastest one-way time of 25
// ping-pongs through autodice::Transfer (the generated program's path) for tensors of 4 KB to
// 4 MiB; autodice fits latency + bytes / bandwidth to the fastest (a busy machine only adds time).
#include <mpi.h>

#include <malloc.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator.h"
#include "autodice_runtime.h"
#include "datareader.h"
#include "layer.h"
#include "modelbin.h"
#include "net.h"
#include "profile_gpu.h"
#if NCNN_VULKAN
#include "gpu.h"
#endif

namespace {

using autodice::json_string;

struct Args {
  std::string param, bin, out;
  std::vector<std::string> inputs;
  std::vector<int> threads = {1};
  int warmup = 3;
  int runs = 11;
  bool corun = false;
  int gpu = -1;  // Vulkan device to time too, or none
  bool gpu_fp32 = false;  // that device in fp32 (ncnn's default there: fp16)
  std::vector<int> cores;  // to pin to; empty: wherever the scheduler puts it
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "profile_layers: %s\nusage: profile_layers MODEL.param MODEL.bin OUT.json "
               "--threads 1,2 [--cores 4,5] [--warmup N] [--runs N] --input in0.npy "
               "[--input ...]\n",
               why.c_str());
  std::exit(2);
}

int count(const std::string& flag, const std::string& text, int least) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < least || v > 100000)
    usage(flag + " " + text + ": expected an integer of at least " + std::to_string(least));
  return static_cast<int>(v);
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    if (k == "--threads" || k == "--cores") {
      std::vector<int>& into = k == "--threads" ? a.threads : a.cores;
      into.clear();
      std::string list = value();
      size_t start = 0;
      while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        into.push_back(count(k, list.substr(start, comma - start), k == "--threads" ? 1 : 0));
        start = comma + 1;
      }
    } else if (k == "--warmup") {
      a.warmup = count(k, value(), 0);
    } else if (k == "--runs") {
      a.runs = count(k, value(), 1);
    } else if (k == "--input") {
      a.inputs.push_back(value());
    } else if (k == "--corun") {
      a.corun = true;
    } else if (k == "--gpu") {
      a.gpu = count(k, value(), 0);
    } else if (k == "--gpu-fp32") {
      a.gpu_fp32 = true;
    } else if (!k.empty() && k[0] == '-') {
      usage("unknown option " + k);
    } else {
      positional.push_back(k);
    }
  }
  if (positional.size() != 3) usage("expected MODEL.param MODEL.bin OUT.json");
  if (a.inputs.empty()) usage("at least one --input is needed");
  a.param = positional[0];
  a.bin = positional[1];
  a.out = positional[2];
  return a;
}

// Pins this process to ``cores`` before ncnn starts a thread (they inherit the mask); the cores
// the kernel then reports, as a JSON list.
std::string pin(const std::vector<int>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores) {
    if (c >= CPU_SETSIZE) usage("--cores " + std::to_string(c) + ": no such core");
    CPU_SET(c, &set);
  }
  if (!cores.empty() && sched_setaffinity(0, sizeof set, &set) != 0)
    autodice::abort_run("--cores: cannot run on those cores (not this machine's, or not "
                        "allowed to this process)", 2);
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "[]";
  std::string list;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) list += (list.empty() ? "" : ", ") + std::to_string(c);
  return "[" + list + "]";
}

// The generated program's net options (templates/program.cpp.j2, load_net) for a CPU rank.
void cpu_options(ncnn::Net& net, int threads) {
  net.opt.num_threads = threads;
  autodice::allocate_activations(net.opt);
  net.opt.use_vulkan_compute = false;
  net.opt.lightmode = true;
  autodice::compute_in_fp32(net.opt);
}

void load(ncnn::Net& net, const Args& args, int threads) {
  cpu_options(net, threads);
  if (net.load_param(args.param.c_str()) != 0)
    autodice::abort_run("cannot load " + args.param + " (missing or corrupt)", 4);
  autodice::LoadingHeap loading;  // as the generated program loads
  if (net.load_model(args.bin.c_str()) != 0)
    autodice::abort_run("cannot load " + args.bin + " (missing or corrupt)", 4);
}

// Bytes malloc has handed out and not taken back: exact, where resident memory would also count
// pages freed but kept by the allocator. One thread allocates here, so the main arena and the
// mmapped chunks are all of it: {in the arena, in chunks of their own}.
struct HeapBytes {
  int64_t arena = 0, mapped = 0;
  int64_t total() const { return arena + mapped; }
};

HeapBytes heap_bytes() {
#if defined(__GLIBC__) && __GLIBC_PREREQ(2, 33)
  const struct mallinfo2 m = mallinfo2();
  return {static_cast<int64_t>(m.uordblks), static_cast<int64_t>(m.hblkhd)};
#elif defined(__GLIBC__)
  const struct mallinfo m = mallinfo();
  return {static_cast<int64_t>(static_cast<unsigned>(m.uordblks)),
          static_cast<int64_t>(static_cast<unsigned>(m.hblkhd))};
#else
  return {};
#endif
}

int64_t heap_in_use() { return heap_bytes().total(); }

// Sets the peak resident memory (VmHWM) back to what is resident now; false where the kernel
// cannot (before Linux 4.0, no /proc).
bool reset_peak_rss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool wrote = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && wrote;
}

struct LayerBytes {
  int64_t loaded = 0;     // the most held beyond `resident` while it loads: the file's copy of
                          // the weights, the scratch of repacking them
  int64_t resident = 0;   // what the layer keeps once ncnn has repacked them (light mode)
  int64_t workspace = 0;  // what its forward allocates and frees again (im2col, Winograd tiles)
};

// Hands out what ncnn asks for and counts it: bytes held now, and the most held since reset().
class CountingAllocator : public ncnn::Allocator {
 public:
  void* fastMalloc(size_t size) override {
    void* p = ncnn::fastMalloc(size);
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_[p] = size;
    held_ += static_cast<int64_t>(size);
    most_ = std::max(most_, held_);
    return p;
  }
  void fastFree(void* p) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(p);
      if (it != sizes_.end()) {
        held_ -= static_cast<int64_t>(it->second);
        sizes_.erase(it);
      }
    }
    ncnn::fastFree(p);
  }
  int64_t held() const { return held_; }
  int64_t most() const { return most_; }
  void reset() { most_ = held_; }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, size_t> sizes_;
  int64_t held_ = 0, most_ = 0;
};

// What every layer holds in memory, as the generated program loads and runs it: ncnn's own
// Net::load_model loop (read the layer's weights, then create_pipeline with the layer's masked
// options) with the heap measured around each step, then one run extracting every layer's
// output in turn through counting allocators. A whole-model peak cannot tell which rank holds
// what: a 3x3 convolution's Winograd weights take several times the bytes in the file, an
// InnerProduct's the same bytes; the file's copy is dropped in light mode, but only after the
// repacked copy exists, and repacking may need scratch as large again: a rank's peak while it
// loads a large layer; and a convolution over a large image may allocate several times its
// output while it runs.
std::vector<LayerBytes> layer_bytes(const Args& args, int threads,
                                    const std::vector<ncnn::Mat>& inputs) {
  ncnn::Net net;
  cpu_options(net, threads);
  if (net.load_param(args.param.c_str()) != 0)
    autodice::abort_run("cannot load " + args.param + " (missing or corrupt)", 4);
  FILE* fp = std::fopen(args.bin.c_str(), "rb");
  if (!fp) autodice::abort_run("cannot open " + args.bin, 4);
  std::vector<LayerBytes> bytes;
  {
    autodice::LoadingHeap loading;
    ncnn::DataReaderFromStdio reader(fp);
    ncnn::ModelBinFromDataReader weights(reader);
    for (ncnn::Layer* layer : net.mutable_layers()) {
      const int mask = layer->featmask;
      ncnn::Option opt = net.opt;  // ncnn's get_masked_option, for the CPU
      opt.use_fp16_arithmetic = opt.use_fp16_arithmetic && !(mask & (1 << 0));
      opt.use_fp16_packed = opt.use_fp16_packed && !(mask & (1 << 1));
      opt.use_fp16_storage = opt.use_fp16_storage && !(mask & (1 << 1));
      opt.use_bf16_storage = opt.use_bf16_storage && !(mask & (1 << 2));
      opt.use_int8_packed = opt.use_int8_packed && !(mask & (1 << 3));
      opt.use_int8_storage = opt.use_int8_storage && !(mask & (1 << 3));
      opt.use_int8_arithmetic = opt.use_int8_arithmetic && !(mask & (1 << 3));
      opt.use_sgemm_convolution = opt.use_sgemm_convolution && !(mask & (1 << 5));
      opt.use_winograd_convolution = opt.use_winograd_convolution && !(mask & (1 << 6));
      if (mask & (1 << 7)) opt.num_threads = 1;
      const bool peak_known = reset_peak_rss();
      const int64_t rss = autodice::rss_bytes();
      const HeapBytes before = heap_bytes();
      if (layer->load_model(weights) != 0)
        autodice::abort_run("cannot load the weights of layer " + layer->name, 4);
      const int64_t read = heap_in_use();
      if (layer->create_pipeline(opt) != 0)
        autodice::abort_run("cannot prepare layer " + layer->name, 4);
      const HeapBytes after = heap_bytes();
      // What a layer keeps in blocks of their own (each large block is a mapping here) is
      // resident only where it was written: ncnn's x86 int8 Winograd kernel is a Mat of 4-byte
      // elements filled with 2-byte ones, half of each row never touched (ResNet-50's last 3x3
      // convolution: 37.7 MB allocated, about half of it resident). The pages it made
      // resident bound those blocks; the arena's bytes count as they are.
      const int64_t mapped = after.mapped - before.mapped;
      const int64_t grown = rss >= 0 ? autodice::rss_bytes() - rss : mapped;
      const int64_t kept =
          (after.arena - before.arena) + std::max<int64_t>(0, std::min(grown, mapped));
      // The heap's figures are exact but miss the scratch create_pipeline frees before it
      // returns (a Winograd convolution's transformed kernel before packing: as large as what
      // it keeps); the peak resident memory sees it.
      const int64_t peak = peak_known && rss >= 0 ? autodice::peak_rss_bytes() - rss : 0;
      bytes.push_back({std::max(read - before.total(), peak - kept), kept, 0});
    }
  }
  std::fclose(fp);
  CountingAllocator blobs, workspace;
  ncnn::Extractor ex = net.create_extractor();
  ex.set_blob_allocator(&blobs);
  ex.set_workspace_allocator(&workspace);
  for (size_t k = 0; k < inputs.size(); ++k)
    if (ex.input(("in" + std::to_string(k)).c_str(), inputs[k]) != 0)
      autodice::abort_run("the net has no input blob in" + std::to_string(k), 4);
  const std::vector<ncnn::Layer*>& layers = net.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i]->type == "Input" || layers[i]->tops.empty()) continue;
    blobs.reset();
    workspace.reset();
    const int64_t start = blobs.held() + workspace.held();
    ncnn::Mat m;
    if (ex.extract(layers[i]->tops[0], m, 1) != 0)
      autodice::abort_run("extracting the output of layer " + layers[i]->name + " failed", 5);
    // Blobs and workspace peak at different moments; their sum bounds the layer's peak.
    const int64_t most = blobs.most() + workspace.most();
    bytes[i].workspace = std::max<int64_t>(most - std::max(start, blobs.held() +
                                                                      workspace.held()), 0);
  }
  return bytes;
}

ncnn::Extractor start(const ncnn::Net& net, const std::vector<ncnn::Mat>& inputs) {
  ncnn::Extractor ex = net.create_extractor();
  for (size_t k = 0; k < inputs.size(); ++k)
    if (ex.input(("in" + std::to_string(k)).c_str(), inputs[k]) != 0)
      autodice::abort_run("the net has no input blob in" + std::to_string(k), 4);
  return ex;
}

// Timed like the generated program's compute: from the first extract to the last.
double run_whole(const ncnn::Net& net, const std::vector<ncnn::Mat>& inputs) {
  ncnn::Extractor ex = start(net, inputs);
  autodice::Timer timer;
  for (int blob : net.output_indexes()) {
    ncnn::Mat m;
    if (ex.extract(blob, m, 1) != 0) autodice::abort_run("extracting an output failed", 5);
  }
  return timer.elapsed_ms();
}

// A GPU's whole-model time as a GPU rank sees it, frame after frame: `runs` runs back to back
// after a second of them untimed. The whole model timed between runs of every layer alone (each
// a submission and a wait, the GPU mostly idle), as the CPU's is, or after an idle spell, is not
// what a rank gets: on an H100 SqueezeNet's 1.37 ms back to back took 1.67 ms between layer runs
// and 1.98 ms after 50 ms idle. Timed so, ResNet-50 took 3.73 ms and the program ran it at 3.66
// ms a frame; SqueezeNet still took 2.5 ms where the program ran 1.36 (warming up to 8 s, until
// it ran no faster, changed nothing: open).
std::vector<double> run_back_to_back(const ncnn::Net& net, const std::vector<ncnn::Mat>& inputs,
                                     int runs) {
  const autodice::Timer warming;
  while (warming.elapsed_ms() < 1000.0) run_whole(net, inputs);
  std::vector<double> ms;
  for (int r = 0; r < runs; ++r) ms.push_back(run_whole(net, inputs));
  return ms;
}

void run_layers(const ncnn::Net& net, const std::vector<ncnn::Mat>& inputs,
                const std::vector<int>& layers, std::vector<double>& ms) {
  ncnn::Extractor ex = start(net, inputs);
  ms.assign(layers.size(), 0.0);
  for (size_t i = 0; i < layers.size(); ++i) {
    ncnn::Mat m;
    autodice::Timer timer;
    if (ex.extract(net.layers()[layers[i]]->tops[0], m, 1) != 0)
      autodice::abort_run("extracting the output of layer " + net.layers()[layers[i]]->name +
                          " failed", 5);
    ms[i] = timer.elapsed_ms();
  }
}

// Element count, sum, sum |x|, sum x^2 of a blob (float32, unpacked); the sums are null when
// the blob holds inf or NaN (random weights can overflow), which then matches nothing.
std::string fingerprint(const ncnn::Mat& m) {
  const int64_t n = static_cast<int64_t>(m.w) * m.h * m.d * m.c;
  std::vector<float> dense(static_cast<size_t>(n));
  autodice::dense_from_mat(m, dense.data());
  double sum = 0, asum = 0, sq = 0;
  for (float v : dense) {
    sum += v;
    asum += std::fabs(v);
    sq += static_cast<double>(v) * v;
  }
  char buf[160];
  if (std::isfinite(sum) && std::isfinite(asum) && std::isfinite(sq))
    std::snprintf(buf, sizeof buf, "[%lld, %.17g, %.17g, %.17g]", static_cast<long long>(n), sum,
                  asum, sq);
  else
    std::snprintf(buf, sizeof buf, "[%lld, null, null, null]", static_cast<long long>(n));
  return buf;
}

std::string json_list(const std::vector<double>& v) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.6f", i ? ", " : "", v[i]);
    out += buf;
  }
  return out + "]";
}

// Rank 0 writes {"rows": [{"bytes": B, "seconds": S}, ...]}.
int measure_link(const std::string& out) {
  MPI_Init(nullptr, nullptr);
  autodice::init_runtime(MPI_COMM_WORLD);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) autodice::abort_run("--link needs exactly 2 ranks", 2);
  const int peer = 1 - rank;
  const std::vector<autodice::Shape> shapes = {
      {1, 1000}, {1, 64, 16, 16}, {1, 128, 28, 28}, {1, 256, 32, 32}, {1, 256, 64, 64}};
  const int reps = 25;
  std::string json = "{\"rows\": [";
  for (size_t s = 0; s < shapes.size(); ++s) {
    const autodice::TensorInfo info{"link", shapes[s], autodice::DType::Float32};
    ncnn::Mat mine = autodice::alloc_mat(info.shape);
    mine.fill(1.0f);
    std::vector<double> one_way;
    for (int i = -3; i < reps; ++i) {
      MPI_Barrier(MPI_COMM_WORLD);
      autodice::Timer timer;
      for (int hop = 0; hop < 2; ++hop) {
        if ((hop == 0) == (rank == 0)) {
          autodice::Transfer t = autodice::Transfer::send(MPI_COMM_WORLD, info, mine, peer, hop);
          t.wait();
        } else {
          autodice::Transfer t = autodice::Transfer::recv(MPI_COMM_WORLD, info, mine, peer, hop);
          t.wait();
        }
      }
      if (i >= 0) one_way.push_back(timer.elapsed_ms() / 2e3);
    }
    std::sort(one_way.begin(), one_way.end());
    char row[128];
    std::snprintf(row, sizeof row, "%s{\"bytes\": %lld, \"seconds\": %.9f, \"min_seconds\": %.9f}",
                  s ? ", " : "", static_cast<long long>(info.bytes()),
                  one_way[one_way.size() / 2], one_way.front());
    json += row;
  }
  json += "]}\n";
  if (rank == 0) {
    FILE* f = std::fopen(out.c_str(), "w");
    if (!f) autodice::abort_run("cannot write " + out, 6);
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  MPI_Finalize();
  return 0;
}

// Under mpirun, one rank per core: how much slower the whole net runs on one thread while every
// other core runs it too (shared caches and memory bandwidth), which is what a pipelined stage
// sees when its neighbours on the same board are busy. Each run, rank 0 runs the net once alone
// (the others sleep in a barrier, leaving their cores idle), then all ranks run it at once;
// alone and together alternate so drift hits both. Rank 0 writes
// {"ranks": N, "base_rss": B, "peak_rss": B, "alone_ms": [...], "together_ms": [...]}: its peak
// resident memory before loading the net and after all runs.
int measure_corun(const Args& args, const std::vector<ncnn::Mat>& inputs) {
  MPI_Init(nullptr, nullptr);
  autodice::init_runtime(MPI_COMM_WORLD);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int64_t base_rss = autodice::peak_rss_bytes();
  ncnn::Net net;
  load(net, args, 1);
  const double patience_s = 600;
  std::vector<double> alone, together;
  for (int r = -args.warmup; r < args.runs; ++r) {
    autodice::barrier(MPI_COMM_WORLD, patience_s, "corun: before running alone");
    if (rank == 0) {
      const double ms = run_whole(net, inputs);
      if (r >= 0) alone.push_back(ms);
    }
    autodice::barrier(MPI_COMM_WORLD, patience_s, "corun: before running together");
    const double ms = run_whole(net, inputs);
    if (r >= 0) together.push_back(ms);
    if (rank == 0)
      std::fprintf(stderr, "progress %d %d\n", r + args.warmup + 1, args.warmup + args.runs);
  }
  if (rank == 0) {
    FILE* f = std::fopen(args.out.c_str(), "w");
    if (!f) autodice::abort_run("cannot write " + args.out, 6);
    std::fprintf(f,
                 "{\"ranks\": %d, \"base_rss\": %lld, \"peak_rss\": %lld, \"alone_ms\": %s, "
                 "\"together_ms\": %s}\n",
                 size, static_cast<long long>(base_rss),
                 static_cast<long long>(autodice::peak_rss_bytes()), json_list(alone).c_str(),
                 json_list(together).c_str());
    std::fclose(f);
  }
  MPI_Finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  autodice::use_heap_allocator();
  if (argc == 3 && std::string(argv[1]) == "--link") return measure_link(argv[2]);
  const Args args = parse_args(argc, argv);
  const std::string cores = pin(args.cores);
  std::vector<ncnn::Mat> inputs;
  for (const std::string& path : args.inputs) {
    try {
      autodice::NpyArray a = autodice::npy_load(path);
      inputs.push_back(autodice::mat_from_dense(a.f32(), a.shape));
    } catch (const std::exception& e) {
      autodice::abort_run(e.what(), 2);
    }
  }
  if (args.corun) return measure_corun(args, inputs);
  const long total =
      static_cast<long>(args.threads.size() + (args.gpu >= 0)) * (args.warmup + args.runs) + 1;
  long done = 0;
  auto progress = [&]() { std::fprintf(stderr, "progress %ld %ld\n", ++done, total); };

  // Fingerprints, and which layers to time.
  std::string json = "{\n \"cores\": " + cores + ",\n \"layers\": [";
  std::vector<int> timed;
  const std::vector<LayerBytes> bytes = layer_bytes(args, args.threads[0], inputs);
  LayerBytes untimed;  // of layers not timed (Input): counted with the next timed one
  {
    ncnn::Net net;
    load(net, args, args.threads[0]);
    ncnn::Extractor ex = start(net, inputs);
    const std::vector<ncnn::Layer*>& layers = net.layers();
    for (size_t i = 0; i < layers.size(); ++i) {
      const ncnn::Layer* layer = layers[i];
      untimed.loaded += bytes[i].loaded;
      untimed.resident += bytes[i].resident;
      untimed.workspace += bytes[i].workspace;
      if (layer->type == "Input" || layer->tops.empty()) continue;
      std::string tops;
      for (int blob : layer->tops) {
        ncnn::Mat m;
        if (ex.extract(blob, m, 0) != 0)
          autodice::abort_run("extracting the output of layer " + layer->name + " failed", 5);
        tops += (tops.empty() ? "" : ", ") + fingerprint(m);
      }
      json += std::string(timed.empty() ? "\n  " : ",\n  ") + "{\"type\": " +
              json_string(layer->type) + ", \"name\": " + json_string(layer->name) +
              ", \"tops\": [" + tops + "], \"loaded\": " + std::to_string(untimed.loaded) +
              ", \"resident\": " + std::to_string(untimed.resident) +
              ", \"workspace\": " + std::to_string(untimed.workspace) + "}";
      untimed = LayerBytes{};
      timed.push_back(static_cast<int>(i));
    }
    progress();
  }
  json += "\n ],\n \"runs\": {";

  // One net per thread count, all loaded up front, and the counts interleaved within each run:
  // a machine that slows down for a while (a busy neighbour on the host) then slows every count
  // alike instead of skewing the one that happened to be measuring.
  // The GPU, when asked for, is one more net in the same rounds.
  std::vector<std::string> keys;
  for (int t : args.threads) keys.push_back(std::to_string(t));
  if (args.gpu >= 0) keys.push_back("gpu");
  const size_t n_threads = keys.size();
  std::vector<std::unique_ptr<ncnn::Net>> nets(n_threads);
  for (size_t t = 0; t < n_threads; ++t) {
    nets[t] = std::make_unique<ncnn::Net>();
    if (keys[t] == "gpu")
      load_gpu(*nets[t], args.param, args.bin, args.gpu_fp32, args.gpu);
    else
      load(*nets[t], args, args.threads[t]);
  }
  std::vector<std::vector<double>> whole(n_threads);
  std::vector<std::vector<std::vector<double>>> per_run(n_threads);
  std::vector<double> ms;
  // The GPU's rounds come after the CPU's: a Vulkan driver on the CPU (lavapipe) leaves its
  // worker threads busy for a while, which would slow the CPU rounds interleaved with it.
  // A GPU's whole model is timed back to back before the rounds (on an H100, so timed, it took
  // what the program then ran), a Vulkan device on the CPU's cores at the start of its rounds.
  const size_t n_cpu = args.threads.size();
  const bool gpu_first = n_cpu < n_threads && !vulkan_on_cpu(args.gpu);
  if (gpu_first) whole[n_cpu] = run_back_to_back(*nets[n_cpu], inputs, args.runs);
  for (auto [first, last] : {std::pair<size_t, size_t>{0, n_cpu}, {n_cpu, n_threads}}) {
    if (first == n_cpu && first < last && !gpu_first)
      whole[n_cpu] = run_back_to_back(*nets[n_cpu], inputs, args.runs);
    for (int r = -args.warmup; r < args.runs && first < last; ++r) {
      for (size_t t = first; t < last; ++t) {
        const bool gpu = t >= n_cpu;  // its whole model was timed above
        const double w = gpu ? 0.0 : run_whole(*nets[t], inputs);
        run_layers(*nets[t], inputs, timed, ms);
        if (r >= 0) {
          if (!gpu) whole[t].push_back(w);
          per_run[t].push_back(ms);
        }
        progress();
      }
    }
  }
  for (size_t t = 0; t < n_threads; ++t) {
    json += std::string(t ? ",\n" : "\n") + "  \"" + keys[t] +
            "\": {\"whole_ms\": " + json_list(whole[t]) + ",\n   \"layer_ms\": [";
    for (size_t r = 0; r < per_run[t].size(); ++r)
      json += std::string(r ? ",\n    " : "\n    ") + json_list(per_run[t][r]);
    json += "]}";
  }
  json += "\n }";
  if (args.gpu >= 0) {
#if NCNN_VULKAN
    json += ",\n \"gpu_device\": " + json_string(ncnn::get_gpu_info(args.gpu).device_name());
#endif
    json += ",\n \"gpu_transfer\": " + gpu_transfer_rows(args.gpu);
  }
  json += "\n}\n";

  FILE* f = std::fopen(args.out.c_str(), "w");
  if (!f) autodice::abort_run("cannot write " + args.out, 6);
  std::fputs(json.c_str(), f);
  std::fclose(f);
  return 0;
}
