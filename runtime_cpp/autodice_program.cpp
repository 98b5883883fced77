// autodice program engine; see autodice_program.h.
#include "autodice_program.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <optional>
#include <set>
#include <stdexcept>

#include <sys/utsname.h>

#include "autodice_runtime.h"
#include "autodice_stats.h"
#include "autodice_stream.h"
#include "net.h"
#if NCNN_VULKAN
#include "gpu.h"
#endif

namespace autodice {
namespace {

struct Args {
  std::string inputs = ".";
  std::string results = "results";
  std::string models = ".";
  std::string stream;  // --stream SOCKET: frames come from the gateway rank (autodice_stream.h)
  int frames = 1;
  bool pipeline = true;
  bool gpu_fallback_cpu = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) abort_run(k + " needs a value", 2);
      return argv[++i];
    };
    if (k == "--inputs") {
      a.inputs = value();
    } else if (k == "--results") {
      a.results = value();
    } else if (k == "--models") {
      a.models = value();
    } else if (k == "--frames") {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || n < 1 || n > 1000000000)
        abort_run("--frames " + v + ": need a whole number of frames, at least 1", 2);
      a.frames = static_cast<int>(n);
    } else if (k == "--stream") {
      a.stream = value();
    } else if (k == "--no-pipeline") {
      a.pipeline = false;
    } else if (k == "--gpu-fallback") {
      const std::string v = value();
      if (v != "cpu" && v != "none") abort_run("--gpu-fallback " + v + ": cpu or none", 2);
      a.gpu_fallback_cpu = v == "cpu";
    } else {
      abort_run("unknown argument " + k, 2);
    }
  }
  if (!a.stream.empty() && !a.pipeline)
    abort_run("--no-pipeline and --stream: a stream is pipelined (send one frame at a time "
              "for the lockstep behaviour)", 2);
  return a;
}

// Loading a large sub-model on a small board takes a while: the start waits longer than a
// tensor, unless waits are unbounded (<= 0); as long as a session waits for the job to start
// (START_TIMEOUT_S in autodice/backend/session/gateway.py), so neither gives up before the other.
double start_timeout() { return wait_timeout() > 0 ? std::max(120.0, wait_timeout()) : 0; }

// Called by every rank once its model and inputs are loaded: the clock starts together, so
// frames/s counts frames, not loading. Also records where the rank's threads may and do run.
void start_clock(Stats& st, const Timer& loading, int threads) {
  st.load_s = loading.elapsed_ms() / 1e3;
  st.cpus = cpu_mask(allowed_cpus());
  st.omp_cpus = cpu_mask(omp_thread_cpus(threads));
  barrier(MPI_COMM_WORLD, start_timeout(), "the start");
  st.start = MPI_Wtime();
}

// Whether rank ``r`` computes in fp16 on the device it got.
bool computes_fp16(const RankPlan& r, bool gpu) {
  return r.device == Device::Gpu && !gpu ? r.cpu_fp16 : r.fp16;
}

void load_net(ncnn::Net& net, const Args& args, const RankPlan& r, bool gpu) {
  net.opt.num_threads = r.threads;
  // Light mode frees each blob once its last consumer ran, also across a rank's steps: a blob a
  // later step needs still has that consumer to come (ncnn gives every consumer its own Split
  // output). Without it a ping-pong rank held every blob of the frame: DenseNet-121 277 MB.
  net.opt.lightmode = true;
  allocate_activations(net.opt);
  if (!computes_fp16(r, gpu)) compute_in_fp32(net.opt);  // end to end: equal to onnxruntime
#if NCNN_VULKAN
  if (gpu) {
    net.opt.use_vulkan_compute = true;
    net.set_vulkan_device(r.gpu_index);
  }
#else
  (void)gpu;
#endif
  const std::string base = args.models + "/" + r.key + ".ncnn";
  if (net.load_param((base + ".param").c_str()) != 0)
    abort_run("cannot load " + base + ".param (missing or corrupt)", 4);
  {
    LoadingHeap loading;
    if (net.load_model((base + ".bin").c_str()) != 0)
      abort_run("cannot load " + base + ".bin (missing or corrupt)", 4);
  }
  // ncnn quietly drops to the CPU when it cannot use the Vulkan device after all.
  if (gpu && !net.opt.use_vulkan_compute)
    abort_run("rank " + std::to_string(r.rank) + " (" + r.key + " on " + r.host + "): ncnn " +
                  "could not use Vulkan device " + std::to_string(r.gpu_index) + " for " +
                  base + ".param", 7);
}

TensorInfo info_of(const TensorSpec& t, Wire wire = Wire::Fp32) {
  return TensorInfo{t.name, t.shape, t.dtype, wire};
}

ncnn::Mat read_input(const Args& args, const TensorSpec& t, const std::string& file) {
  try {
    NpyArray a = npy_load(args.inputs + "/" + file, t.dtype, t.shape);
    return mat_from_dense(a.f32(), t.shape);
  } catch (const std::exception& e) {
    abort_run(e.what(), 2);
  }
}

void write_output(const Args& args, const TensorSpec& t, const std::string& file,
                  const ncnn::Mat& m) {
  if (element_count(mat_shape(m)) != element_count(t.shape))
    abort_run("output \"" + t.name + "\" has shape " + shape_str(mat_shape(m)) +
                  ", the plan says " + info_of(t).describe(), 5);
  std::vector<float> dense(static_cast<size_t>(element_count(t.shape)));
  dense_from_mat(m, dense.data());
  try {
    npy_save(args.results + "/" + file, DType::Float32, t.shape, dense.data());
  } catch (const std::exception& e) {
    abort_run(e.what(), 6);
  }
}

void timed_wait(Transfer& t, double& seconds, double timeout_s = -1) {
  Timer timer;
  t.wait(timeout_s);
  seconds += timer.elapsed_ms() / 1e3;
}

void timed_wait_all(std::vector<Transfer>& ts, double& seconds, double timeout_s = -1) {
  Timer timer;
  wait_all(ts, timeout_s);
  ts.clear();
  seconds += timer.elapsed_ms() / 1e3;
}

// The watchdog for a wait that may span every stage's part of a frame, not one stage's: the
// pipeline filling (a rank's first frame waits for all stages before it) and draining (the end),
// and a frame in lockstep. wait_timeout() per stage, as the gateway allows a frame's result.
double frame_timeout(const ProgramPlan& plan) {
  return wait_timeout() > 0 ? wait_timeout() * static_cast<double>(plan.ranks.size() + 1) : 0;
}

int peer_of(const std::vector<int>& peers, int64_t frame) {
  return peers[static_cast<size_t>(frame % static_cast<int64_t>(peers.size()))];
}

// The frames this rank takes, in order. Counted: every f < --frames whose turn is this rank's.
// Streamed: announced one at a time by the gateway, which sends each rank the number of every
// frame it takes (and the shared slot holding it) and kEnd when the stream ends; its offer of
// the session's slots, once, is answered here. How long a stream idles is the application's
// business, so that wait has no deadline (a gateway that dies ends the job through mpirun).
class FrameSource {
 public:
  static constexpr int64_t kEnd = FrameWord::kEnd, kUnknown = -2;

  FrameSource(const Args& args, const RankPlan& r, int gateway, const StreamLayout& layout)
      : r_(r), frames_(args.frames), gateway_(gateway), layout_(layout),
        streamed_(!args.stream.empty()) {
    if (streamed_) post();
  }

  // The frame after the last one taken, if already known (else kUnknown); never blocks.
  int64_t peek() {
    if (known_.frame == kUnknown) {
      if (!streamed_) {
        int64_t f = last_.frame + 1;
        while (f < frames_ && !takes(r_, f)) ++f;
        known_.frame = f < frames_ ? f : kEnd;
      } else if (control_->test()) {
        arrived();
      }
    }
    return known_.frame;
  }

  // The frame after the last one taken, waiting for the gateway's word if need be (a wait that
  // ends with a frame added to `waited_s`; the stream's end is no frame's).
  int64_t take(double& waited_s) {
    double waited_ms = 0;
    while (peek() == kUnknown) {
      const Timer timer;
      control_->wait(0);
      waited_ms += timer.elapsed_ms();
      arrived();
    }
    if (known_.frame != kEnd) waited_s += waited_ms / 1e3;
    last_ = known_;
    known_ = FrameWord{kUnknown, 0};
    return last_.frame;
  }

  // Where frame `f` (the one peeked at or the last taken) has its model inputs in the session's
  // slots mapped here; null if they come over MPI.
  const unsigned char* slot_of(int64_t f) const {
    const FrameWord& w = f == known_.frame ? known_ : last_;
    if (w.frame != f || w.slot <= 0 || !slots_ || slots_->data() == nullptr) return nullptr;
    return slots_->data() + static_cast<size_t>(w.slot - 1) * layout_.frame_bytes();
  }

 private:
  void post() {
    control_.emplace(Transfer::recv(MPI_COMM_WORLD, frame_word_info(), &word_, gateway_,
                                    layout_.control_tag()));
  }
  void arrived() {
    control_.reset();
    if (word_.frame == FrameWord::kSlotsOffered) {
      offered();
    } else {
      known_ = word_;
    }
    if (known_.frame != kEnd) post();
  }
  // The gateway's slots: mapped here if they are this machine's, and the answer sent. Only
  // float32 inputs are read from a slot: others take the receive's way (which refuses them).
  void offered() {
    SlotsOffer offer;
    Transfer::recv(MPI_COMM_WORLD, slots_offer_info(), &offer, gateway_, layout_.control_tag())
        .wait();
    const bool floats = std::all_of(r_.inputs.begin(), r_.inputs.end(), [&](const ModelInput& in) {
      return r_.tensors[in.tensor].dtype == DType::Float32;
    });
    if (floats)
      slots_.emplace(offer);
    else
      slots_.emplace();
    const int64_t answer = slots_->data() != nullptr ? 1 : 0;
    Transfer::send(MPI_COMM_WORLD, read_word_info(), &answer, gateway_, layout_.read_tag())
        .wait();
  }

  const RankPlan& r_;
  int64_t frames_;
  int gateway_;
  const StreamLayout& layout_;
  bool streamed_;
  FrameWord last_{-1, 0}, known_{kUnknown, 0}, word_;
  std::optional<Transfer> control_;
  std::optional<MappedSlots> slots_;
};

// The rank's part of the job. Frames this rank takes are numbered locally (0, 1, 2...) for its
// double buffers; MPI tags carry the global frame's parity.
void run_rank(const ProgramPlan& plan, const RankPlan& r, const Args& args, bool gpu, Stats& st) {
  const Timer loading;
  ncnn::Net net;
  load_net(net, args, r, gpu);
  const bool streamed = !args.stream.empty();
  const int gateway = static_cast<int>(plan.ranks.size());
  const StreamLayout stream = stream_layout(plan);
  const auto tag = [&](int edge, int64_t frame) {
    return edge + plan.edges * static_cast<int>(frame % 2);
  };
  const auto stream_index = [](const std::vector<StreamTensor>& list, const std::string& file) {
    for (size_t i = 0; i < list.size(); ++i)
      if (list[i].file == file) return i;
    abort_run("\"" + file + "\" is not in the stream's tables");
  };
  std::vector<TensorInfo> infos, recv_infos, send_infos;  // the last two: as each travels
  for (const TensorSpec& t : r.tensors) infos.push_back(info_of(t));
  for (const Receive& e : r.receives) recv_infos.push_back(info_of(r.tensors[e.tensor], e.wire));
  for (const Send& e : r.sends) send_infos.push_back(info_of(r.tensors[e.tensor], e.wire));
  // Model inputs: read once and used for every frame, or received from the gateway each frame
  // (double-buffered like every receive).
  std::vector<ncnn::Mat> inputs[2];
  for (const ModelInput& in : r.inputs) {
    const ncnn::Mat m = streamed ? ncnn::Mat() : read_input(args, r.tensors[in.tensor], in.file);
    inputs[0].push_back(m);
    inputs[1].push_back(m);
  }
  // Which sends leave with the inputs, and which after each step.
  std::vector<int> produced_by(r.tensors.size(), -1), input_of(r.tensors.size(), -1);
  for (size_t k = 0; k < r.produces.size(); ++k) produced_by[r.produces[k].tensor] = int(k);
  for (size_t k = 0; k < r.inputs.size(); ++k) input_of[r.inputs[k].tensor] = int(k);
  std::vector<std::vector<int>> after_step(r.steps.size()), outputs_after(r.steps.size());
  std::vector<int> with_inputs;
  for (size_t k = 0; k < r.sends.size(); ++k) {
    const int t = r.sends[k].tensor;
    if (input_of[t] >= 0) {
      with_inputs.push_back(int(k));
      continue;
    }
    for (size_t s = 0; s < r.steps.size(); ++s)
      for (int p : r.steps[s].extract)
        if (r.produces[p].tensor == t) after_step[s].push_back(int(k));
  }
  for (size_t k = 0; streamed && k < r.outputs.size(); ++k)
    for (size_t s = 0; s < r.steps.size(); ++s)
      for (int p : r.steps[s].extract)
        if (p == r.outputs[k].produce) outputs_after[s].push_back(int(k));

  std::vector<ncnn::Mat> received[2], produced[2];
  for (int s = 0; s < 2; ++s) {
    received[s].resize(r.receives.size());
    produced[s].resize(r.produces.size());
  }
  std::vector<Transfer> recvs[2], input_recvs[2], sends[2];
  // Results to the gateway are not waited for with the frame's other sends: one larger than a
  // shared-memory fast box (4 KiB) completes only once the gateway takes it, and a rank that
  // waited for it two frames later ran at the pace the gateway looks, not at its own. They
  // retire as they complete; the gateway's window bounds how many are out.
  std::deque<Transfer> results;
  FrameSource frames(args, r, gateway, stream);
  std::optional<LiveReport> live;  // a stream's figures to the gateway while frames flow
  if (streamed) live.emplace(r, gateway, stream.live_tag());
  // A frame in the session's slots mapped here: its inputs are read there (where each starts in
  // the slot), not received, and the gateway is told once they are (`read_words` the message).
  const unsigned char* from_slot[2] = {nullptr, nullptr};
  int64_t read_words[2] = {0, 0};
  std::vector<size_t> slot_offsets;
  for (size_t k = 0; streamed && k < r.inputs.size(); ++k)
    slot_offsets.push_back(stream.input_offset(stream_index(stream.inputs, r.inputs[k].file)));
  start_clock(st, loading, gpu ? 1 : r.threads);
  const auto post_receives = [&](int64_t frame, int local) {
    const int s = local % 2;
    from_slot[s] = streamed ? frames.slot_of(frame) : nullptr;
    for (size_t k = 0; streamed && from_slot[s] == nullptr && k < r.inputs.size(); ++k)
      input_recvs[s].push_back(Transfer::recv(
          MPI_COMM_WORLD, infos[r.inputs[k].tensor], inputs[s][k], gateway,
          stream.input_tag(stream_index(stream.inputs, r.inputs[k].file))));
    for (size_t k = 0; k < r.receives.size(); ++k) {
      const Receive& e = r.receives[k];
      recvs[s].push_back(Transfer::recv(MPI_COMM_WORLD, recv_infos[k], received[s][k],
                                        peer_of(e.srcs, frame), tag(e.edge, frame)));
    }
  };
  const auto post_send = [&](int k, const ncnn::Mat& m, int64_t frame, int s) {
    const Send& e = r.sends[k];
    sends[s].push_back(Transfer::send(MPI_COMM_WORLD, send_infos[k], m, peer_of(e.dsts, frame),
                                      tag(e.edge, frame)));
  };
  int64_t lockstep_frames = 0;  // --no-pipeline: every rank meets once at the end of each frame
  const auto meet_until = [&](int64_t frame) {
    for (; lockstep_frames < frame; ++lockstep_frames)
      barrier(MPI_COMM_WORLD, frame_timeout(plan), "the end of a frame");
  };
  double stream_start_s = 0;  // the wait for a first frame: the stream's start, not its pace
  int64_t f = frames.take(stream_start_s), last = -1;
  if (f != FrameSource::kEnd) post_receives(f, 0);
  int local = 0, last_local = -1;
  while (f != FrameSource::kEnd) {
    if (!args.pipeline) meet_until(f);  // other replicas' frames
    const int s = local % 2;
    // A first frame waits for every stage before this one; so does each in lockstep.
    const double recv_timeout_s = local == 0 || !args.pipeline ? frame_timeout(plan) : -1;
    timed_wait_all(sends[s], st.send_wait_s);  // this rank's frame before last is sent
    int64_t next = args.pipeline ? frames.peek() : FrameSource::kUnknown;
    const bool early = next >= 0;
    if (early) post_receives(next, local + 1);
    timed_wait_all(input_recvs[s], st.recv_wait_s, recv_timeout_s);
    if (from_slot[s] != nullptr) {  // the copy in place of the receive, timed as one
      const Timer copy;
      for (size_t k = 0; k < r.inputs.size(); ++k)
        dense_into_mat(reinterpret_cast<const float*>(from_slot[s] + slot_offsets[k]),
                       infos[r.inputs[k].tensor].shape, inputs[s][k]);
      read_words[s] = f;
      sends[s].push_back(Transfer::send(MPI_COMM_WORLD, read_word_info(), &read_words[s],
                                        gateway, stream.read_tag()));
      st.recv_wait_s += copy.elapsed_ms() / 1e3;
      st.frames_from_slots += 1;
    }
    ncnn::Extractor ex = net.create_extractor();
    for (size_t k = 0; k < r.inputs.size(); ++k)
      ex.input(("in" + std::to_string(r.inputs[k].blob)).c_str(), inputs[s][k]);
    for (int k : with_inputs) post_send(k, inputs[s][input_of[r.sends[k].tensor]], f, s);
    for (size_t step = 0; step < r.steps.size(); ++step) {
      for (int w : r.steps[step].wait) {
        timed_wait(recvs[s][w], st.recv_wait_s, recv_timeout_s);
        ex.input(("in" + std::to_string(r.receives[w].blob)).c_str(), received[s][w]);
      }
      Timer compute;
      for (int p : r.steps[step].extract)
        if (ex.extract(("out" + std::to_string(r.produces[p].blob)).c_str(), produced[s][p]) != 0)
          abort_run("extracting \"" + r.tensors[r.produces[p].tensor].name + "\" failed", 5);
      st.compute_s += compute.elapsed_ms() / 1e3;
      for (int k : after_step[step])
        post_send(k, produced[s][produced_by[r.sends[k].tensor]], f, s);
      for (int k : outputs_after[step]) {
        const int p = r.outputs[k].produce;
        results.push_back(Transfer::send(MPI_COMM_WORLD, infos[r.produces[p].tensor],
                                         produced[s][p], gateway,
                                         stream.output_tag(stream_index(stream.outputs,
                                                                        r.outputs[k].file))));
      }
    }
    timed_wait_all(recvs[s], st.recv_wait_s, recv_timeout_s);  // ones no output depended on
    while (!results.empty() && results.front().test()) results.pop_front();
    if (!args.pipeline) {  // the paper's behaviour: the next frame starts when this one is done
      timed_wait_all(sends[s], st.send_wait_s);
      meet_until(f + 1);
    }
    st.last_end_s = MPI_Wtime() - st.start;
    if (local == 0) st.first_end_s = st.last_end_s;
    last_local = local++;
    last = f;
    if (live) live->tick(st, local);
    next = frames.take(st.frame_wait_s);  // the frame peeked at above, or the gateway's word
    if (!early && next != FrameSource::kEnd) post_receives(next, local);
    f = next;
  }
  if (!args.pipeline) meet_until(args.frames);
  timed_wait_all(sends[0], st.send_wait_s);
  timed_wait_all(sends[1], st.send_wait_s);
  for (; !results.empty(); results.pop_front()) timed_wait(results.front(), st.send_wait_s);
  // The model's outputs of the last frame: only the replica that took that frame writes them.
  if (!streamed && last == args.frames - 1)
    for (const ModelOutput& o : r.outputs)
      write_output(args, r.tensors[r.produces[o.produce].tensor], o.file,
                   produced[last_local % 2][o.produce]);
  st.frames = local;
  st.bytes_sent = static_cast<double>(r.bytes_sent) * local;
  st.bytes_received = static_cast<double>(r.bytes_received) * local;
  if (live) live->last(st, local);
}

}  // namespace

std::string choose_device(const RankPlan& r, bool fallback_cpu) {
  if (r.device == Device::Cpu) return "cpu";
  const std::string who = "rank " + std::to_string(r.rank) + " (" + r.key + " on " + r.host + ")";
#if NCNN_VULKAN
  const int count = ncnn::get_gpu_count();
  if (r.gpu_index < count) {
    const ncnn::GpuInfo& info = ncnn::get_gpu_info(r.gpu_index);
    return std::string("vulkan:") + info.device_name();
  }
  const std::string why = "no Vulkan device " + std::to_string(r.gpu_index) + " (ncnn found " +
                          std::to_string(count) + "; `vulkaninfo --summary` on the host lists "
                          "what the Vulkan loader sees: install the GPU's Vulkan driver)";
#else
  const std::string why = "this program's ncnn was built without Vulkan";
#endif
  if (fallback_cpu) return "cpu (no Vulkan device)";
  abort_run(who + " is a GPU rank, but there is " + why +
                "; run with --gpu-fallback cpu to compute it on the CPU instead", 7);
}

int run_program(int argc, char** argv, const ProgramPlan& plan) {
  use_heap_allocator();
  MPI_Init(&argc, &argv);
  init_runtime();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const Args args = parse_args(argc, argv);
  const int n = static_cast<int>(plan.ranks.size());
  const bool streamed = !args.stream.empty();
  if (size != n + (streamed ? 1 : 0))
    abort_run("started with " + std::to_string(size) + " processes; the plan has " +
                  std::to_string(n) + " ranks" + (streamed ? ", and a stream needs one more" : ""),
              2);
  Stats st;
  std::string device = "gateway";
  std::optional<Gateway> gateway;
  int64_t frames = args.frames;
  try {  // a tensor the runtime cannot hold (a size past int) is this rank's named error,
         // not a SIGABRT that `run` would take for a dead board
    if (rank == n) {  // the stream's gateway: the session's frames in, results out
      gateway.emplace(plan, args.stream);
      barrier(MPI_COMM_WORLD, start_timeout(), "the start");
      st.start = MPI_Wtime();
      gateway->hello();
      frames = gateway->serve();
    } else {
      const RankPlan& r = plan.ranks[rank];
      device = choose_device(r, args.gpu_fallback_cpu);
      const bool gpu = device.rfind("vulkan:", 0) == 0;
      run_rank(plan, r, args, gpu, st);
      st.precision = r.int8 && !gpu ? 2 : computes_fp16(r, gpu) ? 1 : 0;
    }
  } catch (const std::exception& e) {
    abort_run(e.what());
  }
  barrier(MPI_COMM_WORLD, frame_timeout(plan), "the end of the run");
  const double seconds = MPI_Wtime() - st.start;
  st.peak_rss = static_cast<double>(peak_rss_bytes());
  const int root = streamed ? n : 0;  // who reports: the gateway tells the session
  const std::string json = gather_stats(plan, st, device, frames, args.pipeline, seconds, root);
  if (rank == root) {
    if (gateway) {
      gateway->finish(json);
    } else {
      const std::string path = args.results + "/stats.json";
      FILE* f = std::fopen(path.c_str(), "w");
      if (!f || std::fwrite(json.data(), 1, json.size(), f) != json.size() || std::fclose(f))
        abort_run("cannot write " + path, 6);
    }
  }
  MPI_Finalize();
  return 0;
}

}  // namespace autodice
