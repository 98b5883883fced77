// autodice streams; see autodice_stream.h for the protocol.
#include "autodice_stream.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <initializer_list>
#include <stdexcept>
#include <thread>

namespace autodice {

StreamLayout stream_layout(const ProgramPlan& plan) {
  StreamLayout layout;
  auto add = [](std::vector<StreamTensor>& list, const TensorSpec& spec, const std::string& file,
                int rank) {
    for (StreamTensor& t : list)
      if (t.file == file) {
        t.ranks.push_back(rank);
        return;
      }
    list.push_back(StreamTensor{spec, file, {rank}});
  };
  for (const RankPlan& r : plan.ranks) {
    for (const ModelInput& in : r.inputs) add(layout.inputs, r.tensors[in.tensor], in.file, r.rank);
    for (const ModelOutput& out : r.outputs)
      add(layout.outputs, r.tensors[r.produces[out.produce].tensor], out.file, r.rank);
  }
  layout.first_tag = 2 * plan.edges;  // edge tags are edge + edges * (frame % 2)
  return layout;
}

size_t StreamLayout::input_offset(size_t i) const {
  size_t offset = 0;
  for (size_t k = 0; k < i; ++k)
    offset += static_cast<size_t>(element_count(inputs[k].spec.shape) *
                                  static_cast<int64_t>(dtype_size(inputs[k].spec.dtype)));
  return offset;
}

const TensorInfo& frame_word_info() {
  static const TensorInfo info{"the next frame's word", {2}, DType::Int64};
  return info;
}

const TensorInfo& slots_offer_info() {
  static const TensorInfo info{"the session's frame slots", {7}, DType::Int64};
  return info;
}

const TensorInfo& read_word_info() {
  static const TensorInfo info{"a frame read from its shared slot", {1}, DType::Int64};
  return info;
}

namespace {

// This boot of this kernel (/proc/sys/kernel/random/boot_id, 32 hex digits) as two int64s;
// false without /proc.
bool read_boot_id(int64_t out[2]) {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string text, hex;
  if (!std::getline(file, text)) return false;
  for (char c : text)
    if (std::isxdigit(static_cast<unsigned char>(c))) hex += c;
  if (hex.size() != 32) return false;
  for (int k = 0; k < 2; ++k)
    out[k] = static_cast<int64_t>(std::strtoull(hex.substr(16 * k, 16).c_str(), nullptr, 16));
  return true;
}

}  // namespace

SlotsOffer describe_slots(int fd, size_t bytes) {
  SlotsOffer offer;
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !read_boot_id(offer.boot)) return SlotsOffer{};
  offer.pid = getpid();
  offer.fd = fd;
  offer.dev = static_cast<int64_t>(st.st_dev);
  offer.ino = static_cast<int64_t>(st.st_ino);
  offer.bytes = static_cast<int64_t>(bytes);
  return offer;
}

MappedSlots::MappedSlots(const SlotsOffer& offer) {
  const char* env = std::getenv("AUTODICE_MAP_SLOTS");
  if ((env != nullptr && std::string(env) == "0") || offer.fd < 0 || offer.bytes <= 0) return;
  int64_t boot[2];
  if (!read_boot_id(boot) || boot[0] != offer.boot[0] || boot[1] != offer.boot[1]) return;
  const std::string path =
      "/proc/" + std::to_string(offer.pid) + "/fd/" + std::to_string(offer.fd);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st {};
  if (fstat(fd, &st) == 0 && static_cast<int64_t>(st.st_dev) == offer.dev &&
      static_cast<int64_t>(st.st_ino) == offer.ino && st.st_size >= offer.bytes) {
    const auto bytes = static_cast<size_t>(offer.bytes);
    void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) {
      data_ = static_cast<unsigned char*>(p);
      bytes_ = bytes;
    }
  }
  close(fd);
}

MappedSlots::~MappedSlots() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

namespace {

int connect_to(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path)
    abort_run("--stream " + path + ": a socket path must be shorter than " +
              std::to_string(sizeof addr.sun_path) + " bytes", 2);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // On a deployed host the socket is ssh's forward of the session's, which may appear a moment
  // after the job starts: absent or refused is retried for a few seconds, anything else is not.
  for (int attempt = 0;; ++attempt) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    const int why = errno;
    if (fd >= 0) close(fd);
    if ((why != ENOENT && why != ECONNREFUSED) || attempt == 100)
      abort_run("--stream " + path + ": cannot connect to the session (" + std::strerror(why) +
                ")", 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Whole messages or nothing: false when the peer has gone (EOF, reset, broken pipe). A header
// and its body go in one call: the session's reader, woken by a header alone, read it and slept
// again for the body (2.3-2.4 sleeps a SqueezeNet result).
bool write_all(int fd, std::initializer_list<iovec> message) {
  std::vector<iovec> left(message);
  size_t at = 0;
  while (at < left.size()) {
    msghdr m{};
    m.msg_iov = left.data() + at;
    m.msg_iovlen = left.size() - at;
    const ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    for (size_t sent = static_cast<size_t>(k); at < left.size(); ++at) {
      if (sent < left[at].iov_len) {  // this part went in part
        left[at].iov_base = static_cast<char*>(left[at].iov_base) + sent;
        left[at].iov_len -= sent;
        break;
      }
      sent -= left[at].iov_len;
    }
  }
  return true;
}

bool write_all(int fd, const void* data, size_t n) {
  return write_all(fd, {iovec{const_cast<void*>(data), n}});
}

bool read_all(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, MSG_WAITALL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// A header, and the fd passed beside it (SCM_RIGHTS) in `passed` (-1: none). False when the
// peer has gone.
bool read_header(int fd, StreamHeader& h, int& passed) {
  passed = -1;
  char* p = reinterpret_cast<char*>(&h);
  size_t n = sizeof h;
  while (n > 0) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec iov{p, n};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t k = recvmsg(fd, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c))
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        if (passed >= 0) close(passed);
        std::memcpy(&passed, CMSG_DATA(c), sizeof passed);
      }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

void put_u32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

void put_tensor(std::string& out, const TensorSpec& t) {
  put_u32(out, static_cast<uint32_t>(t.name.size()));
  out += t.name;
  put_u32(out, t.dtype == DType::Int64 ? 1 : 0);
  put_u32(out, static_cast<uint32_t>(t.shape.size()));
  for (int64_t d : t.shape) out.append(reinterpret_cast<const char*>(&d), 8);
}

TensorInfo info_of(const StreamTensor& t) {
  return TensorInfo{t.spec.name, t.spec.shape, t.spec.dtype};
}

// One frame between the session and the ranks: its inputs on their way out, its outputs on their
// way back. Buffers live here until every transfer on them completed.
struct InFlight {
  int64_t id = 0;
  FrameWord word;  // to the ranks taking it: its number, and its slot
  std::vector<unsigned char> in, out;
  const unsigned char* inputs = nullptr;  // `in`, or the session's shared slot of this frame
  std::vector<Transfer> sends, recvs;
  std::vector<int64_t> read;  // ranks' words that they read it from its slot
  double since = 0;           // MPI_Wtime when it went out
};

}  // namespace

Gateway::Gateway(const ProgramPlan& plan, const std::string& socket_path)
    : plan_(plan),
      layout_(stream_layout(plan)),
      fd_(connect_to(socket_path)),
      reads_slots_(plan.ranks.size(), false),
      live_(plan.ranks.size()) {
  for (size_t r = 0; r < live_.size(); ++r) live_[r].rank = static_cast<double>(r);
}

Gateway::~Gateway() {
  if (shared_ != nullptr) munmap(shared_, shared_bytes_);
  if (shared_fd_ >= 0) close(shared_fd_);
  if (fd_ >= 0) close(fd_);
}

void Gateway::hello() {
  std::string msg = "ADSTREAM";
  put_u32(msg, 2);  // 2: takes shared frame slots (kShm)
  put_u32(msg, static_cast<uint32_t>(layout_.inputs.size()));
  put_u32(msg, static_cast<uint32_t>(layout_.outputs.size()));
  for (const StreamTensor& t : layout_.inputs) put_tensor(msg, t.spec);
  for (const StreamTensor& t : layout_.outputs) put_tensor(msg, t.spec);
  session_gone_ = !write_all(fd_, msg.data(), msg.size());
}

int64_t Gateway::serve() {
  const int n = static_cast<int>(plan_.ranks.size());
  static const FrameWord kEnd{FrameWord::kEnd, 0};
  const size_t in_bytes = layout_.frame_bytes();
  size_t out_bytes = 0;
  for (const StreamTensor& t : layout_.outputs)
    out_bytes += static_cast<size_t>(info_of(t).bytes());
  const auto owner = [&](const StreamTensor& t, int64_t f) {
    for (int r : t.ranks)
      if (takes(plan_.ranks[r], f)) return r;
    abort_run("no rank takes frame " + std::to_string(f) + " of \"" + t.spec.name + "\"");
  };
  // A frame whose results are this late means a rank is stuck that no peer waits on (the last
  // stage): every stage has had a full wait_timeout() for its part. Late counts from when the
  // frame came or the result before it went, whichever is later: frames queued behind others
  // (a window of 64 on a slow board) wait their turn, and that is no rank's fault.
  const double late_s = wait_timeout() > 0 ? wait_timeout() * (n + 1) : 0;
  double previous_result_s = 0;

  std::deque<InFlight> flight;
  // Buffers of frames gone back, for the next ones: a new vector per frame zero-filled a frame's
  // bytes (a tenth of this process's time on SqueezeNet) only for the socket to overwrite them.
  std::vector<std::vector<unsigned char>> spare_in, spare_out;
  const auto reuse = [](std::vector<std::vector<unsigned char>>& spare, size_t bytes) {
    std::vector<unsigned char> v;
    if (!spare.empty()) {
      v = std::move(spare.back());
      spare.pop_back();
    }
    v.resize(bytes);
    return v;
  };
  int64_t frames = 0;
  bool stopping = session_gone_;
  double expect_s = 0;   // a frame alone: how long from here to its results (moving average)
  double period_s = 0;   // frames queued: the time between results (moving average), the pace
  bool polling = false;  // the front's result was looked for since it was due, not there yet
  for (;;) {
    bool moved = false;
    while (!flight.empty()) {  // results go back in the order frames came
      InFlight& front = flight.front();
      bool done = true;
      for (Transfer& t : front.recvs) done = t.test() && done;
      if (!done) {
        if (late_s > 0 && MPI_Wtime() - std::max(front.since, previous_result_s) > late_s)
          for (Transfer& t : front.recvs)
            if (!t.done())
              abort_run("frame " + std::to_string(front.word.frame) + ": no result after " +
                        std::to_string(static_cast<int>(late_s)) + " s: waiting to " + t.what());
        break;
      }
      wait_all(front.sends);
      const double now = MPI_Wtime();
      if (previous_result_s > 0 && front.since < previous_result_s) {
        // It queued: the gaps between results average to the pace however late the gateway
        // looks, since the ranks do not wait for it (a result taken late makes the next gap
        // shorter).
        const double gap = now - previous_result_s;
        period_s = period_s > 0 ? 0.8 * period_s + 0.2 * gap : gap;
      } else {
        // Alone. Found at the first look once due, its result came some time before: `took`
        // is only a bound, and counted in full the gateway learns its own lateness (a first
        // frame's 16 ms kept a stream of 7 ms frames late for 30 frames). A bound lowers the
        // expectation by a quarter; a result polled for gives its time.
        const double took = now - front.since;
        const double fresh = expect_s > 0 ? 0.8 * expect_s + 0.2 * took : took;
        expect_s = polling || expect_s == 0 ? fresh : std::min(fresh, 0.75 * expect_s);
      }
      polling = false;
      take_live(false);
      relay_live();
      if (!session_gone_) {
        StreamHeader h{static_cast<uint32_t>(StreamKind::kResult), 0, front.id};
        session_gone_ = !write_all(fd_, {iovec{&h, sizeof h},
                                         iovec{front.out.data(), front.out.size()}});
      }
      if (!front.in.empty()) spare_in.push_back(std::move(front.in));
      spare_out.push_back(std::move(front.out));
      flight.pop_front();
      previous_result_s = MPI_Wtime();
      moved = true;
    }
    stopping = stopping || session_gone_;
    if (stopping && flight.empty()) break;
    if (!stopping) {
      // Block while nothing is in flight; otherwise look at the socket between result checks.
      // The gateway shares rank 0's core, and every wake-up preempts that rank: 20,000 a
      // second cost it a third of its frames. So it sleeps until a tenth of a frame's time
      // before the result is due (a new frame on the socket still wakes it at once): one pace
      // after the last result if frames queue, else when a frame's usual time from here is up
      // (waking at 80 % of a queued frame's time from here, many paces, woke the gateway 8
      // times a SqueezeNet frame). Then it looks again after a quarter of the time since, from
      // 50 us (a frame alone: its latency) or a twentieth of the pace (frames queue: the ranks
      // go on without it) up to 1 ms. With more frames out than ranks, one waits its turn at
      // rank 0: new frames are read once awake for a result rather than woken for (a hang-up
      // still wakes it).
      const bool want_frames = moved || flight.size() <= plan_.ranks.size();
      pollfd p{fd_, static_cast<short>(want_frames ? POLLIN : 0), 0};
      double pause_s = 0;
      if (!flight.empty() && !moved) {
        const InFlight& front = flight.front();
        const bool queued = period_s > 0 && front.since < previous_result_s;
        const double step = queued ? period_s : expect_s;
        const double wake = (queued ? previous_result_s + period_s : front.since + expect_s) -
                            step / 10;
        const double since = MPI_Wtime() - wake;
        const double least = queued ? std::min(step / 20, 1e-3) : 50e-6;
        pause_s = since < 0 ? std::min(-since, 0.1) : std::clamp(since / 4, least, 1e-3);
        polling = since >= 0;
      }
      const auto pause_ns = static_cast<long>(pause_s * 1e9);
      const timespec pause{pause_ns / 1000000000L, pause_ns % 1000000000L};
      const int ready = ppoll(&p, 1, flight.empty() ? nullptr : &pause, nullptr);
      if (ready > 0) {
        StreamHeader h;
        int passed = -1;
        if (!read_header(fd_, h, passed) || h.kind == static_cast<uint32_t>(StreamKind::kStop)) {
          if (passed >= 0) close(passed);
          stopping = true;
          continue;
        }
        if (h.kind == static_cast<uint32_t>(StreamKind::kShm)) {
          stopping = !take_shared(h, passed, in_bytes);
          continue;
        }
        if (passed >= 0) close(passed);
        if (h.kind != static_cast<uint32_t>(StreamKind::kFrame))
          abort_run("the session sent message kind " + std::to_string(h.kind), 2);
        if (h.reserved > slots_)
          abort_run("the session sent frame " + std::to_string(h.value) + " in shared slot " +
                    std::to_string(h.reserved - 1) + " of " + std::to_string(slots_), 2);
        flight.emplace_back();
        InFlight& x = flight.back();
        x.id = h.value;
        x.out = reuse(spare_out, out_bytes);
        if (h.reserved > 0) {  // the session wrote it into its slot: no copy through the socket
          x.inputs = shared_ + (h.reserved - 1) * in_bytes;
        } else {
          x.in = reuse(spare_in, in_bytes);
          x.inputs = x.in.data();
          if (!read_all(fd_, x.in.data(), x.in.size())) {  // hung up mid-frame: not a frame
            flight.pop_back();
            stopping = true;
            continue;
          }
        }
        x.word = FrameWord{frames++, h.reserved};
        x.since = MPI_Wtime();
        for (int r = 0; r < n; ++r)  // the ranks taking this frame hear of it first
          if (takes(plan_.ranks[r], x.word.frame))
            x.sends.push_back(Transfer::send(MPI_COMM_WORLD, frame_word_info(), &x.word, r,
                                             layout_.control_tag()));
        // A rank that maps the slots reads its inputs there and says so (once a frame); the
        // others receive theirs.
        std::vector<int> readers;
        for (size_t i = 0; i < layout_.inputs.size(); ++i) {
          const StreamTensor& t = layout_.inputs[i];
          const int r = owner(t, x.word.frame);
          if (x.word.slot > 0 && reads_slots_[r]) {
            if (std::find(readers.begin(), readers.end(), r) == readers.end()) readers.push_back(r);
          } else {
            x.sends.push_back(Transfer::send(MPI_COMM_WORLD, info_of(t),
                                             x.inputs + layout_.input_offset(i), r,
                                             layout_.input_tag(i)));
          }
        }
        x.read.resize(readers.size());
        for (size_t j = 0; j < readers.size(); ++j)
          x.recvs.push_back(Transfer::recv(MPI_COMM_WORLD, read_word_info(), &x.read[j],
                                           readers[j], layout_.read_tag()));
        size_t offset = 0;
        for (size_t j = 0; j < layout_.outputs.size(); ++j) {
          const StreamTensor& t = layout_.outputs[j];
          x.recvs.push_back(Transfer::recv(MPI_COMM_WORLD, info_of(t), x.out.data() + offset,
                                           owner(t, x.word.frame), layout_.output_tag(j)));
          offset += static_cast<size_t>(info_of(t).bytes());
        }
        moved = true;
      }
    } else if (!moved) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // draining the last frames
    }
  }
  std::vector<Transfer> ends;
  for (int r = 0; r < n; ++r)
    ends.push_back(Transfer::send(MPI_COMM_WORLD, frame_word_info(), &kEnd, r,
                                  layout_.control_tag()));
  wait_all(ends);
  take_live(true);
  return frames;
}

void Gateway::take_live(bool to_last) {
  const int n = static_cast<int>(plan_.ranks.size()), tag = layout_.live_tag();
  // At the end every rank sends its last figures right after the end word; a rank that never
  // does is stuck, and the end barrier's wait is what it gets.
  const double until = wait_timeout() > 0 ? MPI_Wtime() + wait_timeout() : -1;
  for (;;) {
    int there = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &there, &status);
    if (!there) {
      if (!to_last || lasts_ >= n) return;
      if (until > 0 && MPI_Wtime() > until)
        abort_run("the stream ended, and " + std::to_string(n - lasts_) + " of " +
                  std::to_string(n) + " ranks sent no last figures within " +
                  std::to_string(static_cast<int>(wait_timeout())) + " s");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    LiveFigures f;
    MPI_Recv(&f, kLiveDoubles, MPI_DOUBLE, status.MPI_SOURCE, tag, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    if (status.MPI_SOURCE >= n) continue;
    live_[status.MPI_SOURCE] = f;
    live_fresh_ = true;
    if (f.last != 0) ++lasts_;
  }
}

void Gateway::relay_live() {
  if (!live_fresh_ || session_gone_) return;
  live_fresh_ = false;
  const size_t bytes = live_.size() * sizeof(LiveFigures);
  StreamHeader h{static_cast<uint32_t>(StreamKind::kRanks), static_cast<uint32_t>(live_.size()),
                 static_cast<int64_t>(bytes)};
  session_gone_ = !write_all(fd_, {iovec{&h, sizeof h}, iovec{live_.data(), bytes}});
}

bool Gateway::take_shared(const StreamHeader& offer, int passed_fd, size_t frame_bytes) {
  // Slots are the session's window: it writes slot k again only once the result of the frame
  // that was in it came back, and a result goes back only after every send from its slot ended.
  bool taken = false;
  if (passed_fd >= 0 && shared_ == nullptr && offer.reserved > 0 &&
      offer.value == static_cast<int64_t>(frame_bytes) && frame_bytes > 0) {
    const size_t bytes = static_cast<size_t>(offer.reserved) * frame_bytes;
    void* p = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, passed_fd, 0);
    if (p != MAP_FAILED) {
      shared_ = static_cast<unsigned char*>(p);
      shared_bytes_ = bytes;
      slots_ = offer.reserved;
      taken = true;
    }
  }
  if (taken) {
    shared_fd_ = passed_fd;
    offer_slots();
  } else if (passed_fd >= 0) {
    close(passed_fd);
  }
  StreamHeader answer{static_cast<uint32_t>(StreamKind::kShm), 0, taken ? 1 : 0};
  session_gone_ = !write_all(fd_, &answer, sizeof answer);
  return !session_gone_;
}

void Gateway::offer_slots() {
  std::vector<int> readers;
  for (const StreamTensor& t : layout_.inputs)
    for (int r : t.ranks)
      if (std::find(readers.begin(), readers.end(), r) == readers.end()) readers.push_back(r);
  const SlotsOffer offer = describe_slots(shared_fd_, shared_bytes_);
  const FrameWord word{FrameWord::kSlotsOffered, 0};
  std::vector<int64_t> answers(readers.size(), 0);
  std::vector<Transfer> talk;
  for (size_t j = 0; j < readers.size(); ++j) {
    talk.push_back(Transfer::send(MPI_COMM_WORLD, frame_word_info(), &word, readers[j],
                                  layout_.control_tag()));
    talk.push_back(Transfer::send(MPI_COMM_WORLD, slots_offer_info(), &offer, readers[j],
                                  layout_.control_tag()));
    talk.push_back(Transfer::recv(MPI_COMM_WORLD, read_word_info(), &answers[j], readers[j],
                                  layout_.read_tag()));
  }
  wait_all(talk);
  for (size_t j = 0; j < readers.size(); ++j) reads_slots_[readers[j]] = answers[j] == 1;
}

void Gateway::finish(const std::string& stats_json) {
  if (session_gone_) return;
  StreamHeader h{static_cast<uint32_t>(StreamKind::kStats), 0,
                 static_cast<int64_t>(stats_json.size())};
  write_all(fd_, {iovec{&h, sizeof h},
                  iovec{const_cast<char*>(stats_json.data()), stats_json.size()}});
  shutdown(fd_, SHUT_WR);
}

}  // namespace autodice
