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
//   gateway -> session:        before a result, when some rank sent new figures (about every
//                              second each): Header{kind = kRanks, reserved = ranks, bytes} +
//                              LiveFigures (autodice_stats.h) per rank in rank order, doubles
//
// Between the gateway and the ranks (MPI, tags from stream_layout): before each frame a
// FrameWord to every rank taking it, then the model inputs to the ranks that read them, and the
// outputs back. Once it has taken the session's slots, the gateway offers them to the ranks
// that read model inputs (FrameWord{kSlotsOffered} and a SlotsOffer); each answers on the read
// tag whether it mapped them. One that did reads each frame's inputs from the slot its word
// names instead of receiving them (a memcpy instead of Open MPI's single copy: 17 against 52 us
// a SqueezeNet frame, runtime_cpp/bench/cma_vs_memcpy.c) and then says so on the read tag, so
// the gateway returns that frame's result, and the session writes the slot again, only after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autodice_program.h"
#include "autodice_runtime.h"
#include "autodice_stats.h"

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
  int read_tag() const { return control_tag() + 1; }
  int live_tag() const { return control_tag() + 2; }  // the ranks' LiveFigures to the gateway
  // Where input i starts in a frame's bytes (on the socket, and in a shared slot): the inputs
  // dense, in this order.
  size_t input_offset(size_t i) const;
  size_t frame_bytes() const { return input_offset(inputs.size()); }
};

// The gateway's word to a rank about its next frame (int64s on the control tag).
struct FrameWord {
  static constexpr int64_t kEnd = -1;           // the stream ended
  static constexpr int64_t kSlotsOffered = -3;  // a SlotsOffer follows on the same tag
  int64_t frame = 0;
  int64_t slot = 0;  // 0: the inputs come over MPI; else they are in shared slot `slot - 1`
};

// The session's frame slots as the gateway holds them: what a rank needs to open the same
// memfd through /proc/<pid>/fd/<fd> and to know it is the same memory (a rank on another
// machine, or in another pid namespace, finds a different file there or none).
struct SlotsOffer {
  int64_t pid = 0, fd = -1, dev = 0, ino = 0, bytes = 0;
  int64_t boot[2] = {0, 0};  // the kernel's boot_id: the same pid on another machine is not it
};
static_assert(sizeof(FrameWord) == 16 && sizeof(SlotsOffer) == 56, "int64s on the wire");

// The stream's small messages as tensors of int64, for Transfer: a FrameWord, a SlotsOffer, and
// a rank's word on the read tag (its answer to the offer, 1 mapped / 0 not; then each frame it
// read from a slot).
const TensorInfo& frame_word_info();
const TensorInfo& slots_offer_info();
const TensorInfo& read_word_info();

// The gateway's side of the offer: the memfd `fd` it mapped, `bytes` long.
SlotsOffer describe_slots(int fd, size_t bytes);

// A rank's side: the offered slots mapped read-only, or nothing (`data()` null) where they are
// not this machine's or cannot be opened, or AUTODICE_MAP_SLOTS=0 says to take frames over MPI.
class MappedSlots {
 public:
  MappedSlots() = default;
  explicit MappedSlots(const SlotsOffer& offer);
  ~MappedSlots();
  MappedSlots(const MappedSlots&) = delete;
  MappedSlots& operator=(const MappedSlots&) = delete;

  const unsigned char* data() const { return data_; }

 private:
  unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
};

StreamLayout stream_layout(const ProgramPlan& plan);

// Whether rank `r` takes frame `f` (its stage's turn).
inline bool takes(const RankPlan& r, int64_t f) { return f % r.replicas == r.replica; }

enum class StreamKind : uint32_t {
  kFrame = 1, kStop = 2, kResult = 3, kStats = 4, kShm = 5, kRanks = 6
};

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

  // The slots offered to every rank that reads a model input; `reads_slots_` their answers.
  void offer_slots();

  // The ranks' figures that came (LiveFigures on the live tag): those there now, or, `to_last`,
  // every rank's until its last one (the stream's end). `relay_live` passes them on, if new.
  void take_live(bool to_last);
  void relay_live();

  const ProgramPlan& plan_;
  StreamLayout layout_;
  int fd_ = -1;
  bool session_gone_ = false;
  unsigned char* shared_ = nullptr;  // the session's frame slots, when it shares them
  int shared_fd_ = -1;               // kept open: ranks on this machine open it through /proc
  size_t shared_bytes_ = 0, slots_ = 0;
  std::vector<bool> reads_slots_;  // by rank: takes its inputs from the slots itself
  std::vector<LiveFigures> live_;  // by rank: the latest figures it sent
  int lasts_ = 0;                  // ranks whose last figures came
  bool live_fresh_ = false;        // figures came since the last relay
};

}  // namespace autodice
