// autodice streams: frames from an application through the running ranks, results back in order.
//
// With `--stream SOCKET` the job has one process more than the plan has ranks: the gateway, MPI
// rank n (n = the plan's ranks). It connects to the Unix socket the application (autodice's
// Python session) listens on and moves bytes between that socket and MPI: each frame's model
// inputs to the ranks that read them, each frame's model outputs back from the ranks that make
// them. The ranks themselves stay what the plan says; in stream mode they learn from the gateway
// which frame comes next (or that the stream ended) instead of counting to --frames, and receive
// their model inputs from it instead of reading .npy files.
//
// Every process runs the same binary, so both sides derive the message tags from the same tables
// (stream_layout); the socket side is a small framed protocol (all integers little endian):
//
//   gateway -> session, once:  "ADSTREAM" u32 version, u32 inputs, u32 outputs, then per tensor
//                              (inputs first) u32 name length, name, u32 dtype (0 float32,
//                              1 int64), u32 rank, i64 dims...
//   session -> gateway:        Header{kind = kFrame, id} + every input's dense bytes in order,
//                              or Header{kind = kStop}
//   session -> gateway, once:  Header{kind = kShm, reserved = slots, value = slot bytes} with a
//                              memfd passed beside it (SCM_RIGHTS), answered by a Header{kind =
//                              kShm, value = 1 taken / 0 not}. Taken, a frame may be
//                              Header{kind = kFrame, reserved = slot + 1, id} with its bytes in
//                              that slot of the shared memory instead of on the socket. A
//                              gateway behind ssh's forward gets no fd (ssh passes bytes) and
//                              says 0; sessions of version 1 never offer.
//   gateway -> session:        Header{kind = kResult, id} + every output's dense bytes, in the
//                              order frames came; last Header{kind = kStats, bytes} + stats.json
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autodice_program.h"

namespace autodice {

// A model input or output as the stream carries it, and the ranks that read or make it (a
// replicated stage: frame f goes to the one with f % replicas == replica).
struct StreamTensor {
  TensorSpec spec;
  std::string file;  // the name autodice gave its .npy: identifies it across ranks
  std::vector<int> ranks;
};

struct StreamLayout {
  std::vector<StreamTensor> inputs, outputs;  // in plan order (first rank that has it)
  int first_tag = 0;                          // above every edge tag of the plan
  int input_tag(size_t i) const { return first_tag + static_cast<int>(i); }
  int output_tag(size_t j) const { return first_tag + static_cast<int>(inputs.size() + j); }
  int control_tag() const { return first_tag + static_cast<int>(inputs.size() + outputs.size()); }
};

StreamLayout stream_layout(const ProgramPlan& plan);

// Whether rank `r` takes frame `f` (its stage's turn).
inline bool takes(const RankPlan& r, int64_t f) { return f % r.replicas == r.replica; }

enum class StreamKind : uint32_t { kFrame = 1, kStop = 2, kResult = 3, kStats = 4, kShm = 5 };

struct StreamHeader {
  uint32_t kind = 0;
  uint32_t reserved = 0;  // kFrame: 0 (its bytes follow) or its shared slot + 1; kShm: slots
  int64_t value = 0;      // the frame's id (kFrame, kResult) or a byte count (kStats, kShm)
};
static_assert(sizeof(StreamHeader) == 16, "the wire header is 16 bytes");

// The gateway's side: connected once, serves frames until the session says stop (or hangs up),
// then tells every rank the stream ended. The last message is the job's stats.json.
class Gateway {
 public:
  Gateway(const ProgramPlan& plan, const std::string& socket_path);
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  // Tell the session the job is ready (every rank loaded): the hello message.
  void hello();
  // Move frames until the stream ends; returns how many frames went through.
  int64_t serve();
  // The job's stats.json to the session, then close (ignored if the session is gone).
  void finish(const std::string& stats_json);

 private:
  // The session's offer of shared frame slots (kShm): mapped if the fd came and fits, and the
  // answer sent. False if the session has gone.
  bool take_shared(const StreamHeader& offer, int passed_fd, size_t frame_bytes);

  const ProgramPlan& plan_;
  StreamLayout layout_;
  int fd_ = -1;
  bool session_gone_ = false;
  unsigned char* shared_ = nullptr;  // the session's frame slots, when it shares them
  size_t shared_bytes_ = 0, slots_ = 0;
};

}  // namespace autodice
