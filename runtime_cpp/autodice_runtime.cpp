// autodice runtime; see autodice_runtime.h for what each piece is for.
#include "autodice_runtime.h"

#include <fcntl.h>
#include <malloc.h>
#include <omp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

namespace autodice {

// ---- small helpers --------------------------------------------------------------------------

size_t dtype_size(DType dtype) { return dtype == DType::Int64 ? 8 : 4; }

const char* dtype_name(DType dtype) { return dtype == DType::Int64 ? "int64" : "float32"; }

static MPI_Datatype mpi_type(DType dtype) {
  return dtype == DType::Int64 ? MPI_INT64_T : MPI_FLOAT;
}

int64_t element_count(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const Shape& shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

int checked_int(int64_t n, const std::string& what) {
  if (n < 0 || n > INT_MAX) throw std::runtime_error(what + ": " + std::to_string(n) +
                                                     " elements do not fit an MPI count");
  return static_cast<int>(n);
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// ---- process setup, logging, timing ---------------------------------------------------------

static std::string g_prefix;
static double g_timeout_s = 8.0;
// After a timeout, how long a rank waits before ending the job: long enough for the other ranks
// waiting on the same stuck peer to say so too, which is how `autodice run` names the culprit.
static constexpr double kGraceS = 1.0;

static double g_spin_s = 2e-3;  // how long a wait polls before it starts to sleep

static bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Open MPI's shared-memory transport backs each local rank's segment with a file in /dev/shm
// (sm_segment.<host>.<uid>.<job>.<rank>, 16 MB) that only MPI_Finalize unlinks. A job ended by
// a signal (mpirun's SIGTERM when its owner went, or when a rank died) left them behind:
// hundreds of MB of tmpfs after a day of restarts (23 files on the test machine). A rank that
// ends the job (abort_run) or dies of SIGTERM, SIGINT or SIGHUP first unlinks the segment files
// it has mapped (its own and its peers', which end with it; the mappings stay valid).
// Async-signal-safe calls only: open, read, close, unlink (then sigaction, raise).
static void unlink_segments() {
  static char buf[16384];
  static const char kSegment[] = "/dev/shm/sm_segment.";
  const int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  size_t have = 0;
  for (ssize_t n; fd >= 0 && (n = read(fd, buf + have, sizeof buf - 1 - have)) > 0;) {
    have += static_cast<size_t>(n);
    buf[have] = '\0';
    char* line = buf;
    for (char* end; (end = std::strchr(line, '\n')) != nullptr; line = end + 1) {
      *end = '\0';
      char* path = std::strstr(line, kSegment);
      if (path != nullptr && std::strchr(path, ' ') == nullptr) unlink(path);  // not "(deleted)"
    }
    have = static_cast<size_t>(buf + have - line);  // a line cut by the buffer: read on
    std::memmove(buf, line, have);
    if (have == sizeof buf - 1) have = 0;  // no line is this long: drop it
  }
  if (fd >= 0) close(fd);
}

static void unlink_segments_and_die(int sig) {
  unlink_segments();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

void init_runtime(MPI_Comm comm) {
  struct sigaction sa {};
  sa.sa_handler = unlink_segments_and_die;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  if (comm != MPI_COMM_WORLD) MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  g_prefix.clear();
  log_prefix();
  if (const char* env = std::getenv("AUTODICE_TIMEOUT_S")) {
    char* end = nullptr;
    double seconds = std::strtod(env, &end);
    if (end == env || *end != '\0')
      abort_run(std::string("AUTODICE_TIMEOUT_S=") + env + " is not a number of seconds", 2);
    g_timeout_s = seconds;
  }
  // A waiting rank spins first (Open MPI moves a message only inside its calls) unless the
  // ranks' threads outnumber the cores, where autodice run sets OMP_WAIT_POLICY=passive: then a
  // spinning rank would take the core its neighbour computes on.
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  g_spin_s = policy && (std::strcmp(policy, "passive") == 0 ||
                        std::strcmp(policy, "PASSIVE") == 0) ? 0.0 : 2e-3;
  // Short sleeps sleep as long as asked (the default 50 us timer slack made 10 us 69).
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
}

const std::string& log_prefix() {
  if (g_prefix.empty()) {
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    int rank = -1;
    if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    g_prefix = "[rank " + (rank < 0 ? std::string("?") : std::to_string(rank)) + " " + host + "]";
  }
  return g_prefix;
}

void log(const std::string& message, FILE* stream) {
  std::string line = log_prefix() + " " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stream);
  std::fflush(stream);
}

void abort_run(const std::string& message, int code) {
  log(message, stderr);
  unlink_segments();
  if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

namespace {

// Blocks from kMin bytes come from a region of their own, best fit, neighbours merged when freed,
// pages kept once touched; smaller ones from malloc, whose per-size caches are faster for the
// many small blobs (through the region too, DenseNet-121 ran at 0.95x). See the header for why.
class ActivationArena final : public ncnn::Allocator {
 public:
  void* fastMalloc(size_t size) override {
    if (size < kMin) return ncnn::fastMalloc(size);
    const size_t n = (size + NCNN_MALLOC_OVERREAD + kAlign - 1) / kAlign * kAlign;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reserve()) return ncnn::fastMalloc(size);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->second >= n && (best == free_.end() || it->second < best->second)) best = it;
    size_t at = top_;
    if (best != free_.end()) {
      at = best->first;
      if (best->second > n) free_[at + n] = best->second - n;
      free_.erase(best);
    } else {
      if (at + n > reserved_) return ncnn::fastMalloc(size);
      top_ += n;
    }
    used_[at] = n;
    return base_ + at;
  }

  void fastFree(void* ptr) override {
    char* p = static_cast<char*>(ptr);
    if (base_ == nullptr || p < base_ || p >= base_ + reserved_) return ncnn::fastFree(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    const auto u = used_.find(static_cast<size_t>(p - base_));
    size_t at = u->first, n = u->second;
    used_.erase(u);
    auto next = free_.lower_bound(at);
    if (next != free_.end() && next->first == at + n) {
      n += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin() && std::prev(next)->first + std::prev(next)->second == at) {
      at = std::prev(next)->first;
      n += std::prev(next)->second;
      free_.erase(std::prev(next));
    }
    if (at + n == top_)
      top_ = at;  // the next block from the top reuses these pages, resident as they are
    else
      free_[at] = n;
  }

 private:
  static constexpr size_t kMin = 64 << 10, kAlign = 64;

  // Address space for as much as the machine's memory (a quarter of a 32-bit one's at most),
  // claimed page by page as it is touched.
  bool reserve() {
    if (base_ != nullptr || failed_) return base_ != nullptr;
    const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                         static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    reserved_ = static_cast<size_t>(std::min<uint64_t>(ram, SIZE_MAX / 4));
    void* p = mmap(nullptr, reserved_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    failed_ = p == MAP_FAILED;
    if (!failed_) base_ = static_cast<char*>(p);
    return !failed_;
  }

  std::mutex mutex_;
  char* base_ = nullptr;
  bool failed_ = false;
  size_t reserved_ = 0, top_ = 0;
  std::map<size_t, size_t> free_;            // offset -> bytes, no two adjacent
  std::unordered_map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace

void allocate_activations(ncnn::Option& opt) {
  static ActivationArena arena;
  opt.blob_allocator = &arena;
  opt.workspace_allocator = &arena;
}

void compute_in_fp32(ncnn::Option& opt) {
  opt.use_fp16_packed = false;
  opt.use_fp16_storage = false;
  opt.use_fp16_arithmetic = false;
  opt.use_bf16_storage = false;
}

void use_heap_allocator() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

LoadingHeap::LoadingHeap() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 128 << 10);
#endif
}

LoadingHeap::~LoadingHeap() { use_heap_allocator(); }

// A "Vm...: N kB" field of /proc/self/status in bytes, -1 without it.
static int64_t status_bytes(const char* field) {
  long long kib = -1;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    const std::string format = std::string(field) + ": %lld kB";
    char line[256];
    while (kib < 0 && std::fgets(line, sizeof line, f))
      if (std::sscanf(line, format.c_str(), &kib) != 1) kib = -1;
    std::fclose(f);
  }
  return kib < 0 ? -1 : static_cast<int64_t>(kib) * 1024;
}

int64_t rss_bytes() { return status_bytes("VmRSS"); }

int64_t peak_rss_bytes() {
  if (const int64_t bytes = status_bytes("VmHWM"); bytes >= 0) return bytes;
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<int> omp_thread_cpus(int threads) {
  // A busy neighbour may hold one of the cores at the moment of a look, and two threads then
  // share the other: look up to 5 times, keeping the look with the most distinct cores.
  std::set<int> best;
  for (int look = 0; look < 5 && static_cast<int>(best.size()) < threads; ++look) {
    std::set<int> seen;
#pragma omp parallel num_threads(threads)
    {
      // Busy for 20 ms so the scheduler places every thread where it may run, then say where
      // each one is while all of them are still busy: distinct answers mean real parallelism.
      Timer timer;
      while (timer.elapsed_ms() < 20.0) {
      }
      const int cpu = sched_getcpu();
#pragma omp critical
      seen.insert(cpu);
    }
    if (seen.size() > best.size()) best = seen;
  }
  return {best.begin(), best.end()};
}

// ---- the wire -------------------------------------------------------------------------------

WireLayout wire_layout(const Shape& shape) {
  const Shape s = ncnn_shape(shape);
  const size_t r = s.size();
  WireLayout L;
  L.c = r >= 3 ? s[0] : 1;
  L.plane = s[r - 1] * (r >= 2 ? s[r - 2] : 1) * (r == 4 ? s[1] : 1);
  L.cstep = r >= 3 ? (L.plane * 4 + 15) / 16 * 4 : L.plane;  // ncnn: alignSize(plane * 4, 16) / 4
  L.count = (L.c - 1) * L.cstep + L.plane;
  // Padding up to an eighth of the tensor is worth one block; more (a 1x1 map: 4x) is not.
  L.as_mat = L.count * 8 <= element_count(shape) * 9;
  return L;
}

static bool has_layout(const ncnn::Mat& m, const WireLayout& L) {
  return m.elemsize == 4 && m.elempack == 1 && m.c == L.c &&
         static_cast<int64_t>(m.w) * m.h * m.d == L.plane &&
         (L.c == 1 || static_cast<int64_t>(m.cstep) == L.cstep);
}

// ---- typed nonblocking transfers ------------------------------------------------------------

void set_wait_timeout(double seconds) { g_timeout_s = seconds; }
double wait_timeout() { return g_timeout_s; }

std::string TensorInfo::describe() const {
  return "shape " + shape_str(shape) + " " + dtype_name(dtype) +
         (wire != Wire::Fp32 ? std::string(" as ") + wire_name(wire) : "");
}

Transfer::Transfer(MPI_Comm comm, TensorInfo info, bool is_recv, int peer, int tag)
    : comm_(comm), info_(std::move(info)), is_recv_(is_recv), peer_(peer), tag_(tag) {}

Transfer::Transfer(Transfer&& other) noexcept
    : comm_(other.comm_), info_(std::move(other.info_)), is_recv_(other.is_recv_),
      peer_(other.peer_), tag_(other.tag_), type_(other.type_), request_(other.request_),
      staging_(std::move(other.staging_)), dense_out_(other.dense_out_),
      packed_(std::move(other.packed_)) {
  other.type_ = MPI_DATATYPE_NULL;
  other.request_ = MPI_REQUEST_NULL;
}

Transfer::~Transfer() {
  if (request_ != MPI_REQUEST_NULL) abort_run(what() + ": transfer destroyed before it completed");
  if (type_ != MPI_DATATYPE_NULL && mpi_running()) MPI_Type_free(&type_);
}

std::string Transfer::what() const {
  return std::string(is_recv_ ? "recv \"" : "send \"") + info_.name + "\" " +
         (is_recv_ ? "from" : "to") + " rank " + std::to_string(peer_);
}

static std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<size_t>(len));
}

// `type` is either a basic type (not owned) or a derived one this transfer frees when done.
void Transfer::post(void* buffer, int count, MPI_Datatype type) {
  int rc = is_recv_ ? MPI_Irecv(buffer, count, type, peer_, tag_, comm_, &request_)
                    : MPI_Isend(buffer, count, type, peer_, tag_, comm_, &request_);
  if (rc != MPI_SUCCESS) abort_run(what() + ": posting failed: " + mpi_error_text(rc));
}

// A smaller wire format is a cut tensor's, and cut tensors travel as Mats.
static void require_plain_wire(const Transfer& t) {
  if (t.info().wire != Wire::Fp32)
    abort_run(t.what() + ": only a Mat travels " + wire_name(t.info().wire));
}

Transfer Transfer::send(MPI_Comm comm, const TensorInfo& info, const void* dense, int peer,
                        int tag) {
  Transfer t(comm, info, false, peer, tag);
  require_plain_wire(t);
  if (info.dtype == DType::Float32) {
    const WireLayout L = wire_layout(info.shape);
    if (L.as_mat && L.count != element_count(info.shape)) {  // padded on the wire: stage it
      t.staging_ = mat_from_dense(static_cast<const float*>(dense), info.shape);
      t.post(t.staging_.data, checked_int(L.count, info.name), MPI_FLOAT);
      return t;
    }
  }
  t.post(const_cast<void*>(dense), checked_int(element_count(info.shape), info.name),
         mpi_type(info.dtype));
  return t;
}

Transfer Transfer::send(MPI_Comm comm, const TensorInfo& info, const ncnn::Mat& m, int peer,
                        int tag) {
  Transfer t(comm, info, false, peer, tag);
  // Only the element count must agree: pnnx may emit 1x4x4x4 as a 4-d Mat (c=4, d=1) where
  // the plan's shape gives a 3-d one, and both flatten to the same dense order on the wire.
  if (info.dtype != DType::Float32 || m.elemsize != 4 || m.elempack != 1 ||
      element_count(mat_shape(m)) != element_count(info.shape))
    abort_run(t.what() + ": Mat has shape " + shape_str(mat_shape(m)) + ", the plan says " +
              info.describe());
  if (info.wire != Wire::Fp32) {  // packed here, whatever m's layout
    t.packed_.resize(static_cast<size_t>(info.message_bytes()));
    wire_pack(m, info.wire, t.packed_.data());
    t.post(t.packed_.data(), checked_int(info.message_bytes(), info.name), MPI_BYTE);
    return t;
  }
  const WireLayout L = wire_layout(info.shape);
  if (!L.as_mat || has_layout(m, L)) {
    // Sent from m's own memory: held until the send completes, so a receive posted meanwhile
    // into a Mat sharing that memory (a forwarded input's next frame) gets fresh memory instead.
    t.staging_ = m;
    if (!L.as_mat) {
      t.type_ = mat_datatype(m);
      t.post(m.data, 1, t.type_);
    } else {
      t.post(m.data, checked_int(L.count, info.name), MPI_FLOAT);
    }
  } else {  // the same elements in another Mat shape (pnnx's choice): into the plan's layout
    std::vector<float> dense(static_cast<size_t>(element_count(info.shape)));
    dense_from_mat(m, dense.data());
    t.staging_ = mat_from_dense(dense.data(), info.shape);
    t.post(t.staging_.data, checked_int(L.count, info.name), MPI_FLOAT);
  }
  return t;
}

Transfer Transfer::recv(MPI_Comm comm, const TensorInfo& info, void* dense, int peer, int tag) {
  Transfer t(comm, info, true, peer, tag);
  require_plain_wire(t);
  if (info.dtype == DType::Float32) {
    const WireLayout L = wire_layout(info.shape);
    if (L.as_mat && L.count != element_count(info.shape)) {  // padded on the wire: unpack later
      t.staging_ = alloc_mat(info.shape);
      t.dense_out_ = static_cast<float*>(dense);
      t.post(t.staging_.data, checked_int(L.count, info.name), MPI_FLOAT);
      return t;
    }
  }
  t.post(dense, checked_int(element_count(info.shape), info.name), mpi_type(info.dtype));
  return t;
}

Transfer Transfer::recv(MPI_Comm comm, const TensorInfo& info, ncnn::Mat& m, int peer, int tag) {
  Transfer t(comm, info, true, peer, tag);
  if (info.dtype != DType::Float32)
    abort_run(t.what() + ": only float32 tensors travel as a Mat, the plan says " +
              info.describe());
  if (!mat_reusable(m, info.shape)) m = alloc_mat(info.shape);
  if (info.wire != Wire::Fp32) {  // unpacked into m (held meanwhile) on completion
    t.staging_ = m;
    t.packed_.resize(static_cast<size_t>(info.message_bytes()));
    t.post(t.packed_.data(), checked_int(info.message_bytes(), info.name), MPI_BYTE);
    return t;
  }
  const WireLayout L = wire_layout(info.shape);
  if (L.as_mat) {
    t.post(m.data, checked_int(L.count, info.name), MPI_FLOAT);
  } else {
    t.type_ = mat_datatype(m);
    t.post(m.data, 1, t.type_);
  }
  return t;
}

// Called once the request completed; for a receive, compare what arrived with the plan.
void Transfer::finish(int rc, const MPI_Status& status) {
  request_ = MPI_REQUEST_NULL;
  const std::string expected =
      std::to_string(info_.message_bytes()) + " (" + info_.describe() + ")";
  int error_class = MPI_SUCCESS;
  if (rc != MPI_SUCCESS) MPI_Error_class(rc, &error_class);
  if (error_class == MPI_ERR_TRUNCATE)
    abort_run(what() + ": got more than " + std::to_string(info_.message_bytes()) +
                  " bytes, expected " + expected, 4);
  if (rc != MPI_SUCCESS) abort_run(what() + ": " + mpi_error_text(rc), 4);
  if (!is_recv_) {
    staging_.release();
    packed_ = {};
    return;
  }
  if (info_.wire != Wire::Fp32) {
    MPI_Count got = 0;
    MPI_Get_elements_x(&status, MPI_BYTE, &got);
    if (got != info_.message_bytes())
      abort_run(what() + ": got " + std::to_string(static_cast<int64_t>(got)) +
                    " bytes, expected " + std::to_string(info_.message_bytes()) + " (" +
                    info_.describe() + ")", 4);
    wire_unpack(packed_.data(), info_.wire, staging_);
    staging_.release();
    packed_ = {};
    return;
  }
  // Basic elements received, counted against the datatype that was posted: the tensor's, or
  // its Mat layout's (padding included) when it travelled as one block.
  MPI_Count elements = 0;
  MPI_Get_elements_x(&status, type_ != MPI_DATATYPE_NULL ? type_ : mpi_type(info_.dtype),
                     &elements);
  int64_t want = element_count(info_.shape), got = static_cast<int64_t>(elements);
  if (info_.dtype == DType::Float32 && type_ == MPI_DATATYPE_NULL) {
    const WireLayout L = wire_layout(info_.shape);
    if (L.as_mat) want = L.count;
  }
  if (got != want)
    abort_run(what() + ": got " + std::to_string(got * int64_t(dtype_size(info_.dtype))) +
                  " bytes, expected " + std::to_string(want * int64_t(dtype_size(info_.dtype))) +
                  " (" + info_.describe() + (want != element_count(info_.shape) ?
                                             " in ncnn::Mat layout" : "") + ")", 4);
  if (dense_out_) dense_from_mat(staging_, dense_out_);
  staging_.release();
}

bool Transfer::test() {
  if (request_ == MPI_REQUEST_NULL) return true;
  int flag = 0;
  MPI_Status status{};
  int rc = MPI_Test(&request_, &flag, &status);
  if (rc != MPI_SUCCESS || flag) finish(rc, status);
  return request_ == MPI_REQUEST_NULL;
}

// Poll MPI_Test rather than block in MPI_Wait, so a deadline can be enforced. Spin for
// g_spin_s (Open MPI moves a message, single-copy or in fragments, only while a rank is inside
// its calls; most transfers between ranks of one board end within that), then back off to
// sleeps of at most 50 us so a long wait leaves the core to the OpenMP threads next door.
static void wait_until_done(std::vector<Transfer*>& pending, double timeout_s) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto last = start;
  double frozen_s = 0;  // time this process itself did not run (stopped, or starved of CPU)
  auto pause = std::chrono::microseconds(0);
  for (;;) {
    bool all_done = true;
    for (Transfer* t : pending) all_done = t->test() && all_done;
    if (all_done) return;
    const auto now = clock::now();
    const double gap = std::chrono::duration<double>(now - last).count();
    if (gap > 0.5) frozen_s += gap;
    last = now;
    double waited = std::chrono::duration<double>(now - start).count();
    if (timeout_s > 0 && waited > timeout_s) {
      for (Transfer* t : pending) {
        if (t->done()) continue;
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.1f", timeout_s);
        // A rank that was itself frozen for most of the wait is the stuck one, not its peer.
        const std::string why =
            frozen_s > timeout_s / 2
                ? "this rank was frozen (stopped, or starved of CPU) for " +
                      std::to_string(static_cast<int>(frozen_s)) + " s of it"
                : "the peer died or is stuck (raise AUTODICE_TIMEOUT_S if it is just slow)";
        log(std::string("timed out after ") + seconds + " s waiting to " + t->what() + " (" +
            t->info().describe() + "): " + why);
        std::this_thread::sleep_for(std::chrono::duration<double>(kGraceS));
        if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, 5);
        std::exit(5);
      }
    }
    if (waited > g_spin_s) {
      pause = std::min(std::chrono::microseconds(50), pause + std::chrono::microseconds(5));
      std::this_thread::sleep_for(pause);
    }
  }
}

void Transfer::wait(double timeout_s) {
  std::vector<Transfer*> one{this};
  wait_until_done(one, timeout_s < 0 ? g_timeout_s : timeout_s);
}

void wait_all(std::vector<Transfer>& transfers, double timeout_s) {
  std::vector<Transfer*> pending;
  for (Transfer& t : transfers) pending.push_back(&t);
  wait_until_done(pending, timeout_s < 0 ? g_timeout_s : timeout_s);
}

void barrier(MPI_Comm comm, double timeout_s, const std::string& what) {
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &request) != MPI_SUCCESS) abort_run(what + ": MPI_Ibarrier failed", 4);
  const Timer timer;
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (timeout_s > 0 && timer.elapsed_ms() > timeout_s * 1e3) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.1f", timeout_s);
      log(std::string("timed out after ") + seconds + " s at " + what +
          ": another rank died or is stuck before it");
      std::this_thread::sleep_for(std::chrono::duration<double>(kGraceS));
      MPI_Abort(comm, 5);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace autodice
