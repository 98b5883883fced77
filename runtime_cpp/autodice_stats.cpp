// autodice program engine: each rank's figures gathered into stats.json, and sent live to a
// stream's gateway; see autodice_stats.h.
#include "autodice_stats.h"

#include <sys/utsname.h>

#include <cstdio>
#include <cstring>
#include <set>

#include "autodice_runtime.h"

namespace autodice {
namespace {

const char* const kPrecisions[] = {"fp32", "fp16", "int8"};  // Stats::precision

constexpr int kStatFields = 15;
constexpr int kDeviceChars = 128;  // the device description travels as a fixed-size string
constexpr int kArchChars = 32;     // so does the machine (uname -m) the rank runs on

std::string cpu_list(double m) {
  const auto bits = static_cast<int64_t>(m);
  std::string out;
  for (int c = 0; c < 53; ++c)
    if (bits >> c & 1) out += (out.empty() ? "" : ", ") + std::to_string(c);
  return out;
}

// Frames/s once the pipeline is full: each rank that writes model outputs, from the end of its
// first frame to the end of its last, weighted by its share of the model's outputs (replicas
// each write all of them and their rates add up; ranks of one chain writing one output each
// share a rate). A rank with one frame has no steady state and adds nothing (a short run over
// replicas reads low); -1 where no such rank did two frames.
double steady_fps(const ProgramPlan& plan, const std::vector<double>& all) {
  std::set<std::string> files;
  for (const RankPlan& r : plan.ranks)
    for (const ModelOutput& o : r.outputs) files.insert(o.file);
  double fps = 0;
  bool any = false;
  for (size_t k = 0; k < plan.ranks.size(); ++k) {
    const double* v = &all[k * kStatFields];
    const double frames = v[9], span = v[12] - v[11];
    if (plan.ranks[k].outputs.empty() || frames < 2 || span <= 0) continue;
    fps += (frames - 1) / span * static_cast<double>(plan.ranks[k].outputs.size()) /
           static_cast<double>(files.size());
    any = true;
  }
  return any ? fps : -1;
}

// stats.json: the job's frames and seconds, then one object per rank of the plan.
std::string stats_json(const ProgramPlan& plan, int64_t frames, bool pipeline, double seconds,
                       const std::vector<double>& all, const std::vector<char>& devices,
                       const std::vector<char>& arches) {
  std::string out;
  char buf[1024];
  const auto add = [&](const char* format, auto... values) {
    std::snprintf(buf, sizeof buf, format, values...);
    out += buf;
  };
  add("{\n  \"frames\": %lld,\n  \"seconds\": %.6f,\n  \"fps\": %.4f,\n",
      static_cast<long long>(frames), seconds, seconds > 0 ? frames / seconds : 0.0);
  const double steady = steady_fps(plan, all);
  if (steady < 0)
    out += "  \"steady_fps\": null,\n";
  else
    add("  \"steady_fps\": %.4f,\n", steady);
  add("  \"pipeline\": %s,\n  \"ranks\": [\n", pipeline ? "true" : "false");
  const int n = static_cast<int>(plan.ranks.size());
  for (int k = 0; k < n; ++k) {
    const double* v = &all[static_cast<size_t>(k) * kStatFields];
    const std::string device(&devices[static_cast<size_t>(k) * kDeviceChars]);
    const std::string arch(&arches[static_cast<size_t>(k) * kArchChars]);
    out += "    {\"rank\": " + std::to_string(k) + ", \"key\": " + json_string(plan.ranks[k].key) +
           ", \"device\": " + json_string(device) + ", \"arch\": " + json_string(arch);
    add(", \"precision\": \"%s\", \"frames\": %.0f, \"compute_s\": %.6f, \"recv_wait_s\": %.6f, "
        "\"send_wait_s\": %.6f, \"frame_wait_s\": %.6f, \"frames_from_slots\": %.0f, "
        "\"bytes_sent\": %.0f, \"bytes_received\": %.0f, \"peak_rss\": %.0f, \"load_s\": %.6f, "
        "\"first_frame_end_s\": %.9f, \"last_frame_end_s\": %.9f, \"cpus\": [",
        kPrecisions[static_cast<int>(v[10])], v[9], v[0], v[1], v[2], v[13], v[14], v[3], v[4], v[5],
        v[6], v[11], v[12]);
    out += cpu_list(v[7]) + "], \"omp_cpus\": [" + cpu_list(v[8]) + "]}";
    out += k + 1 < n ? ",\n" : "\n";
  }
  return out + "  ]\n}\n";
}

}  // namespace

double cpu_mask(const std::vector<int>& cpus) {
  double m = 0;
  for (int c : cpus)
    if (c < 53) m += static_cast<double>(int64_t{1} << c);
  return m;
}

std::string gather_stats(const ProgramPlan& plan, const Stats& st, const std::string& device,
                         int64_t frames, bool pipeline, double seconds, int root) {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const double mine[kStatFields] = {st.compute_s, st.recv_wait_s,    st.send_wait_s,
                                    st.bytes_sent, st.bytes_received, st.peak_rss,
                                    st.load_s,     st.cpus,           st.omp_cpus,
                                    st.frames,     st.precision,      st.first_end_s,
                                    st.last_end_s, st.frame_wait_s,   st.frames_from_slots};
  std::vector<double> all(rank == root ? kStatFields * static_cast<size_t>(size) : 0);
  MPI_Gather(mine, kStatFields, MPI_DOUBLE, all.data(), kStatFields, MPI_DOUBLE, root,
             MPI_COMM_WORLD);
  char mine_device[kDeviceChars] = {};
  std::strncpy(mine_device, device.c_str(), kDeviceChars - 1);
  std::vector<char> devices(rank == root ? kDeviceChars * static_cast<size_t>(size) : 0);
  MPI_Gather(mine_device, kDeviceChars, MPI_CHAR, devices.data(), kDeviceChars, MPI_CHAR, root,
             MPI_COMM_WORLD);
  char mine_arch[kArchChars] = {};
  struct utsname machine {};
  const std::string arch = uname(&machine) == 0 ? machine.machine : "?";
  arch.copy(mine_arch, kArchChars - 1);
  std::vector<char> arches(rank == root ? kArchChars * static_cast<size_t>(size) : 0);
  MPI_Gather(mine_arch, kArchChars, MPI_CHAR, arches.data(), kArchChars, MPI_CHAR, root,
             MPI_COMM_WORLD);
  return rank == root ? stats_json(plan, frames, pipeline, seconds, all, devices, arches) : "";
}

void LiveReport::fill(const Stats& st, int64_t frames, bool last) {
  out_ = LiveFigures{static_cast<double>(r_.rank), last ? 1.0 : 0.0, static_cast<double>(frames),
                     st.compute_s, st.recv_wait_s, st.send_wait_s, st.frame_wait_s,
                     static_cast<double>(r_.bytes_sent) * frames,
                     static_cast<double>(r_.bytes_received) * frames,
                     static_cast<double>(rss_bytes())};
}

void LiveReport::tick(const Stats& st, int64_t frames) {
  const double now = MPI_Wtime();
  if (now < next_s_) return;
  int done = 1;
  if (pending_ != MPI_REQUEST_NULL) MPI_Test(&pending_, &done, MPI_STATUS_IGNORE);
  if (!done) return;
  fill(st, frames, false);
  MPI_Isend(&out_, kLiveDoubles, MPI_DOUBLE, gateway_, tag_, MPI_COMM_WORLD, &pending_);
  next_s_ = now + kLiveEveryS;
}

void LiveReport::last(const Stats& st, int64_t frames) {
  if (pending_ != MPI_REQUEST_NULL) MPI_Wait(&pending_, MPI_STATUS_IGNORE);
  fill(st, frames, true);
  MPI_Send(&out_, kLiveDoubles, MPI_DOUBLE, gateway_, tag_, MPI_COMM_WORLD);
}

LiveReport::~LiveReport() {
  // Only a rank leaving by an exception gets here with a send on its way, and the job is then
  // being aborted: freeing the request keeps the abort from waiting on the gateway.
  if (pending_ != MPI_REQUEST_NULL) MPI_Request_free(&pending_);
}

}  // namespace autodice
