// autodice program engine: each rank's figures, gathered into stats.json and, while a stream
// runs, sent to its gateway about every second (autodice_stats.cpp). Internal to the engine: the
// generated tables never see it.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "autodice_program.h"

namespace autodice {

// Per-rank figures gathered to rank 0 for stats.json; all doubles so one MPI_Gather moves them.
// Core sets travel as bit masks (exact in a double up to 53 cores).
struct Stats {
  double compute_s = 0, recv_wait_s = 0, send_wait_s = 0, bytes_sent = 0, bytes_received = 0,
         peak_rss = 0, load_s = 0, cpus = 0, omp_cpus = 0, frames = 0,
         precision = 0;  // 0 fp32, 1 fp16, 2 int8
  // Streams: how long the rank waited for the gateway's word of its next frame, after its
  // first. Apart from recv_wait_s: it holds the application's own pauses, and a first stage
  // that waits here is short of frames.
  double frame_wait_s = 0;
  // Streams: frames whose model inputs this rank read from the session's shared slots itself
  // (on the gateway's machine) instead of receiving them.
  double frames_from_slots = 0;
  // When this rank finished its first and its last frame, in seconds on its clock: what it
  // did in between is its steady state, without the pipeline's filling and draining.
  double first_end_s = 0, last_end_s = 0;
  double start = 0;  // not gathered: when this rank's clock started
};

// A rank's figures so far, as a stream's ranks send them to the gateway and the gateway relays
// them to the session (kRanks, autodice_stream.h): doubles, one MPI message. `last` is 1 on the
// one each rank sends when its stream has ended, 0 on the others.
struct LiveFigures {
  double rank = 0, last = 0, frames = 0, compute_s = 0, recv_wait_s = 0, send_wait_s = 0,
         frame_wait_s = 0, bytes_sent = 0, bytes_received = 0, rss = 0;
};
constexpr int kLiveDoubles = sizeof(LiveFigures) / sizeof(double);
constexpr double kLiveEveryS = 1.0;  // how often a rank sends them while frames flow

// A stream rank's side of the live figures: `tick` after each frame sends them once kLiveEveryS
// has passed since the last time, without waiting (and not while the last is still on its way:
// a rank never queues figures); `last` at the stream's end sends them and waits, so the gateway
// can count one final message from every rank before the job ends.
class LiveReport {
 public:
  LiveReport(const RankPlan& r, int gateway, int tag) : r_(r), gateway_(gateway), tag_(tag) {}
  ~LiveReport();
  LiveReport(const LiveReport&) = delete;
  LiveReport& operator=(const LiveReport&) = delete;
  void tick(const Stats& st, int64_t frames);
  void last(const Stats& st, int64_t frames);

 private:
  void fill(const Stats& st, int64_t frames, bool last);
  const RankPlan& r_;
  int gateway_, tag_;
  LiveFigures out_;
  MPI_Request pending_ = MPI_REQUEST_NULL;
  double next_s_ = 0;
};

// A set of cores as the bit mask Stats carries.
double cpu_mask(const std::vector<int>& cpus);

// Every rank's figures (and its device and machine) gathered to `root`, where the result is
// stats.json; "" on the other ranks. Collective over MPI_COMM_WORLD.
std::string gather_stats(const ProgramPlan& plan, const Stats& st, const std::string& device,
                         int64_t frames, bool pipeline, double seconds, int root);

}  // namespace autodice
