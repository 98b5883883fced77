// Sending an ncnn::Mat between two ranks: pack + contiguous send + unpack ("packed"), against
// the strided MPI datatype that sends the padded Mat's elements in place ("datatype",
// autodice::mat_datatype with blocking MPI_Send/MPI_Recv), and autodice::Transfer ("transfer",
// what the programs use: the Mat's storage as one block, see autodice::wire_layout), whose wait
// polls MPI_Test under the watchdog; beside them "mpi", Open MPI alone: blocking MPI_Send and
// MPI_Recv of the same storage between the same buffers (the most any transfer built on it can
// reach). Every receiver reuses its Mat from frame to frame, as the generated program does (a
// fresh 64 MiB Mat per frame would time page faults, not transfers).
//
//   mpirun -n 2 bench_transfer [out.json] [reps] [mpi-alone|wire-alone]
//
// mpi-alone: the MPI calls only, through one buffer pair, as a plain ping-pong program makes
// them: what to hold against one. wire-alone: autodice::Transfer only, the same way.
//
// Taking turns with the other methods made the same calls faster at 4-64 MiB (paired by round
// in 8 rounds of 2026-11-26: 1.12 / 1.18 / 1.14x at 4 / 16 / 64 MiB; in turns with a second
// buffer pair of the same calls 1.11 / 1.03 / 1.10x). A plain C program did not reproduce it at
// 64 MiB: four buffer pairs in turn, or a 100 ms sleep, a 100 ms spin or a 64 MiB copy between
// its blocks made 0.91 / 0.85 / 0.85 / 0.99x its plain loop's speed (median of 3 launches each).
// Not explained; bench/backend_bench.py holds the wire to the calls beside it and, each alone,
// to the calls alone.
//
// Each row is one tensor (1-64 MiB, then CNN-sized), timed as a ping-pong (rank 0 -> 1 -> 0)
// with the receiver ending up holding a Mat, as the generated program needs; the table shows the
// median one-way time of each method and of a plain memcpy of the same bytes, side by side in
// one run. Rank 0 prints and writes JSON.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "autodice_runtime.h"

using autodice::DType;
using autodice::Shape;
using autodice::TensorInfo;
using autodice::Transfer;

namespace {

int g_rank = 0;
int g_peer = 1;

// Each method sends `m` (sending) or receives into `inbox` (allocated on first use, then
// reused).

// Method 1: the sender unpacks its Mat into a dense buffer, the receiver gets a dense buffer and
// packs it into its Mat.
void hop_packed(const TensorInfo& info, const ncnn::Mat& m, ncnn::Mat& inbox, bool sending,
                std::vector<float>& scratch) {
  const int n = static_cast<int>(autodice::element_count(info.shape));
  if (sending) {
    autodice::dense_from_mat(m, scratch.data());
    MPI_Send(scratch.data(), n, MPI_FLOAT, g_peer, 1, MPI_COMM_WORLD);
    return;
  }
  MPI_Recv(scratch.data(), n, MPI_FLOAT, g_peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  if (inbox.empty()) inbox = autodice::alloc_mat(info.shape);
  const size_t plane = static_cast<size_t>(inbox.w) * inbox.h * inbox.d;
  for (int q = 0; q < inbox.c; ++q)
    std::memcpy(inbox.channel(q).data, scratch.data() + q * plane, plane * 4);
}

// Method 2: the Mat's elements go as they lie, padding skipped by the datatype.
void hop_datatype(const TensorInfo& info, const ncnn::Mat& m, ncnn::Mat& inbox, bool sending,
                  std::vector<float>&) {
  const ncnn::Mat& buffer = sending ? m : (inbox.empty() ? inbox = autodice::alloc_mat(
                                                               info.shape) : inbox);
  MPI_Datatype type = autodice::mat_datatype(buffer);
  if (sending)
    MPI_Send(buffer.data, 1, type, g_peer, 2, MPI_COMM_WORLD);
  else
    MPI_Recv(buffer.data, 1, type, g_peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Type_free(&type);
}

// Method 3: autodice::Transfer, as the generated program sends and receives.
void hop_transfer(const TensorInfo& info, const ncnn::Mat& m, ncnn::Mat& inbox, bool sending,
                  std::vector<float>&) {
  Transfer t = sending ? Transfer::send(MPI_COMM_WORLD, info, m, g_peer, 3)
                       : Transfer::recv(MPI_COMM_WORLD, info, inbox, g_peer, 3);
  t.wait();
}

// Method 4, the limit: Open MPI alone, blocking MPI_Send/MPI_Recv of the same storage the
// transfer moves, between the same buffers (rank 0 sends its Mat and receives into its inbox;
// rank 1 receives into its inbox and sends it back). The buffers matter: a 4 MiB ping-pong
// through one buffer per rank stays in cache and ran 1.3-1.4x faster than through two.
void hop_mpi(const TensorInfo& info, const ncnn::Mat& m, ncnn::Mat& inbox, bool sending,
             std::vector<float>&) {
  if (sending) {
    MPI_Send(m.data, static_cast<int>(m.total()), MPI_FLOAT, g_peer, 4, MPI_COMM_WORLD);
    return;
  }
  if (inbox.empty()) inbox = autodice::alloc_mat(info.shape);
  MPI_Recv(inbox.data, static_cast<int>(inbox.total()), MPI_FLOAT, g_peer, 4, MPI_COMM_WORLD,
           MPI_STATUS_IGNORE);
}

using Hop = void (*)(const TensorInfo&, const ncnn::Mat&, ncnn::Mat&, bool,
                     std::vector<float>&);

// One timed ping-pong of `hop` (rank 0 -> 1 -> 0): one-way microseconds.
double one_way_us(Hop hop, const TensorInfo& info, const ncnn::Mat& mine, ncnn::Mat& inbox,
                  std::vector<float>& scratch) {
  MPI_Barrier(MPI_COMM_WORLD);
  autodice::Timer timer;
  if (g_rank == 0) {
    hop(info, mine, inbox, true, scratch);
    hop(info, mine, inbox, false, scratch);
  } else {
    hop(info, mine, inbox, false, scratch);
    hop(info, inbox, inbox, true, scratch);
  }
  return timer.elapsed_ms() * 1000.0 / 2.0;
}

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Median one-way microseconds of each method over `reps` ping-pongs. The methods take turns in
// short blocks (two untimed ping-pongs, then three timed), each block round in a rotated order:
// this VM has fast and slow phases lasting seconds, and methods timed one after another each got
// a different phase (the same MPI calls once measured 3x apart from one to the next). A block
// reuses its method's buffers as a plain ping-pong loop does: turns taken ping-pong by ping-pong
// left a 4 MiB tensor's buffers out of cache (696 against the plain program's 362 us, one run).
std::vector<double> median_one_way_us(const std::vector<Hop>& hops, const TensorInfo& info,
                                      int reps) {
  constexpr int kWarm = 2, kTimed = 3;
  const size_t n = static_cast<size_t>(autodice::element_count(info.shape));
  std::vector<float> dense(n, 1.0f);
  ncnn::Mat mine = autodice::mat_from_dense(dense.data(), info.shape);
  std::vector<ncnn::Mat> inbox(hops.size());
  std::vector<float> scratch(n);  // the packed method's dense buffer (no other uses one)
  std::vector<std::vector<double>> times(hops.size());
  for (int b = 0; b * kTimed < reps; ++b)
    for (size_t k = 0; k < hops.size(); ++k) {
      const size_t m = (k + static_cast<size_t>(b)) % hops.size();
      for (int i = -kWarm; i < kTimed; ++i) {
        const double us = one_way_us(hops[m], info, mine, inbox[m], scratch);
        if (i >= 0) times[m].push_back(us);
      }
    }
  std::vector<double> out;
  for (auto& t : times) out.push_back(median(t));
  return out;
}

// Median microseconds of a plain memcpy of `bytes` between two warm buffers: the ceiling a
// transfer between two processes on one host can approach.
double median_memcpy_us(size_t bytes, int reps) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  std::vector<double> times;
  for (int i = -3; i < reps; ++i) {
    autodice::Timer timer;
    std::memcpy(to.data(), from.data(), bytes);
    if (i >= 0) times.push_back(timer.elapsed_ms() * 1000.0);
    from[static_cast<size_t>(i + 3) % bytes] = to[0];  // keeps the copy from being elided
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  autodice::init_runtime(MPI_COMM_WORLD);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) autodice::abort_run("bench_transfer needs exactly 2 ranks", 2);
  g_peer = 1 - g_rank;
  const char* json_path = argc > 1 ? argv[1] : nullptr;
  const int reps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 31;
  // One method alone: its name in the JSON, and its hop.
  const char* alone = nullptr;
  Hop alone_hop = nullptr;
  if (argc > 3 && std::strcmp(argv[3], "mpi-alone") == 0) {
    alone = "mpi_us";
    alone_hop = hop_mpi;
  } else if (argc > 3 && std::strcmp(argv[3], "wire-alone") == 0) {
    alone = "transfer_us";
    alone_hop = hop_transfer;
  } else if (argc > 3) {
    autodice::abort_run(std::string("unknown mode ") + argv[3], 2);
  }

  // 1, 4, 16 and 64 MiB tensors, then CNN feature maps whose odd sizes carry padding.
  const std::vector<Shape> shapes = {{1, 256, 32, 32},   {1, 256, 64, 64}, {1, 256, 128, 128},
                                     {1, 256, 256, 256}, {1, 512, 7, 7},   {1, 64, 55, 55},
                                     {1, 1000}};
  std::string json = "{\"reps\": " + std::to_string(reps) + ", \"rows\": [";
  if (g_rank == 0 && alone)
    std::printf("%-16s %9s %11s\n", "shape", "bytes", alone);
  else if (g_rank == 0)
    std::printf("%-16s %9s %10s %11s %11s %8s %10s %9s %14s\n", "shape", "bytes", "packed_us",
                "datatype_us", "transfer_us", "mpi_us", "memcpy_us", "GB/s", "memcpy/transfer");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const TensorInfo info{"t", shapes[i], DType::Float32};
    const std::string shape = autodice::shape_str(info.shape);
    const long long bytes = static_cast<long long>(info.bytes());
    if (alone) {
      const double us = median_one_way_us({alone_hop}, info, reps)[0];
      if (g_rank != 0) continue;
      std::printf("%-16s %9lld %11.1f\n", shape.c_str(), bytes, us);
      json += (i ? ", " : "") + std::string("{\"shape\": \"") + shape + "\", \"bytes\": " +
              std::to_string(bytes) + ", \"" + alone + "\": " + std::to_string(us) + "}";
      continue;
    }
    const std::vector<double> us =
        median_one_way_us({hop_packed, hop_datatype, hop_transfer, hop_mpi}, info, reps);
    const double packed = us[0], datatype = us[1], transfer = us[2], mpi = us[3];
    if (g_rank != 0) continue;
    const double copy = median_memcpy_us(info.bytes(), reps);
    std::printf("%-16s %9lld %10.1f %11.1f %11.1f %8.1f %10.1f %9.2f %13.2fx\n", shape.c_str(),
                bytes, packed, datatype, transfer, mpi, copy, bytes / transfer / 1e3,
                copy / transfer);
    char row[360];
    std::snprintf(row, sizeof row,
                  "%s{\"shape\": \"%s\", \"bytes\": %lld, \"packed_us\": %.2f, "
                  "\"datatype_us\": %.2f, \"transfer_us\": %.2f, \"mpi_us\": %.2f, "
                  "\"memcpy_us\": %.2f}",
                  i ? ", " : "", shape.c_str(), bytes, packed, datatype, transfer, mpi, copy);
    json += row;
  }
  if (g_rank == 0 && json_path) {
    json += "]}\n";
    if (FILE* f = std::fopen(json_path, "w")) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    }
  }
  MPI_Finalize();
  return 0;
}
