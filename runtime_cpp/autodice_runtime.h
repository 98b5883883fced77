// autodice runtime: the small library every generated SPMD program links
// (autodice_runtime.cpp: setup, logging, memory, the wire; autodice_tensors.cpp: .npy files and
// ncnn::Mat conversions).
//
// It owns what the generated code should not repeat per tensor: .npy files, moving tensors
// between dense buffers and ncnn::Mat, typed nonblocking MPI transfers that check what arrived,
// a watchdog so a dead or stuck peer ends the run with a message instead of a silent hang, and
// timers / peak memory / log lines that say which rank is talking.
//
// Errors a user can cause (a bad .npy file, a bad shape) throw std::runtime_error with the file
// or tensor named; errors that leave the ranks out of step (a wrong-sized message, a timeout)
// call abort_run(), which ends every rank through MPI_Abort.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "autodice_types.h"
#include "mat.h"  // ncnn (its include dir is <prefix>/include/ncnn)

namespace autodice {

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "float32", "int64": numpy's spelling
int64_t element_count(const Shape& shape);
std::string shape_str(const Shape& shape);  // "1x4x4x4"; "scalar" for {}
// `n` as an MPI count (an int); a tensor past 2^31 elements needs a different wire format, so
// it throws std::runtime_error naming `what`.
int checked_int(int64_t n, const std::string& what);
// A JSON string literal of `s` (names may hold quotes, backslashes, control characters).
std::string json_string(const std::string& s);

// ---- process setup, logging, timing ---------------------------------------------------------

// Call once after MPI_Init: makes MPI errors on `comm` return codes (so we can say which tensor
// failed before aborting), fixes the log prefix and reads AUTODICE_TIMEOUT_S.
void init_runtime(MPI_Comm comm = MPI_COMM_WORLD);

// "[rank 2 host]": which process printed a line when eight interleave on one terminal.
const std::string& log_prefix();

// One prefixed line, written with a single fwrite so lines of different ranks do not mix.
void log(const std::string& message, FILE* stream = stderr);

// Print a prefixed message and end every rank with exit code `code` (MPI_Abort; plain exit
// when MPI is not running).
[[noreturn]] void abort_run(const std::string& message, int code = 3);

class Timer {
 public:
  Timer() : start_(std::chrono::steady_clock::now()) {}
  void reset() { start_ = std::chrono::steady_clock::now(); }
  double elapsed_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
        .count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Peak resident set size of this process image so far, in bytes: VmHWM of /proc/self/status.
// getrusage's ru_maxrss would also count the process it was exec'd from (a 425 MB Python
// benchmark showed through every ncnn_alone it started); it is the fallback without /proc.
int64_t peak_rss_bytes();
int64_t rss_bytes();  // resident now (VmRSS), -1 without /proc

// Where a rank's blobs and workspace come from. ncnn's Net otherwise keeps them in its pool
// allocators, which hand any larger cached block to a smaller request and never give a block
// back: a rank whose layers meet growing sizes keeps one block of each. Small ones come from
// malloc, with a fixed 32 MiB mmap threshold (a block below it is reused, never unmapped and
// faulted in again each frame) and no trimming (use_heap_allocator); bench/backend_bench.py
// compares malloc with the pools (one thread, the whole model: peak RSS DenseNet-121 108 -> 89
// MB, ResNet-50 242 -> 237 MB; frames/s 0.90-1.11x over two runs).
// Blocks from 64 KiB come from a region of their own, where nothing but blobs and workspace
// lives. In malloc's heap they met what outlives a step: MPI's fragments and requests, the
// extractor's bookkeeping, the outputs a send still reads at the next frame. A rank that runs
// several steps a frame (a mapping that goes to another rank and back) then left holes its
// next frame's large blobs did not fit: DenseNet-121 ranks of 2 or 3 steps held 1-6 MB more
// than their peak activations and workspace on one host, 14 MB over TCP (2026-11-26), which no
// cost model follows. From the region: within 3 % of the model; whole models as before.
void use_heap_allocator();  // call once at start-up, before loading a net
void allocate_activations(ncnn::Option& opt);  // a net's opt, before it loads

// While one exists, every block from 128 KiB that malloc hands out is a mapping of its own, given
// back when freed; then use_heap_allocator's settings again. Hold one around Net::load_model.
// Loading frees the file's copy of a layer's weights and the scratch of repacking them between
// blocks that stay; taken from the heap, those holes stayed resident: ResNet-50's first 158
// layers held 194 MB for 145 MB in use, and a rank's peak memory depended on its layers' order
// as no cost model can follow (2026-11-26, one thread). As mappings: 146 MB, peak 164 MB while
// the last 3x3 convolution repacked.
class LoadingHeap {
 public:
  LoadingHeap();
  ~LoadingHeap();
  LoadingHeap(const LoadingHeap&) = delete;
  LoadingHeap& operator=(const LoadingHeap&) = delete;
};

// fp32 throughout on the CPU (ncnn otherwise stores and computes in fp16 or bf16 where the CPU
// has them): what onnxruntime computes, and what every tool here compares against.
void compute_in_fp32(ncnn::Option& opt);

// The cores this process may run on (sched_getaffinity), ascending.
std::vector<int> allowed_cpus();

// The distinct cores that `threads` OpenMP threads ran on during a short busy parallel region
// (the most of up to 5 such looks: a busy neighbour can take a core for one).
// This is the binding check: Open MPI binds each of two ranks to one core by default, and then
// all of a rank's threads share it however many cores its key names.
std::vector<int> omp_thread_cpus(int threads);

// ---- .npy files -----------------------------------------------------------------------------

struct NpyArray {
  DType dtype = DType::Float32;
  Shape shape;
  std::vector<unsigned char> bytes;  // C order, little endian

  const float* f32() const;    // throws unless dtype is Float32
  const int64_t* i64() const;  // throws unless dtype is Int64
};

// Read a C-order little-endian float32 or int64 array; throws naming `path` on a bad magic,
// header, dtype, Fortran order or a size that does not match the header.
NpyArray npy_load(const std::string& path);

// As above, and also throws unless the file holds exactly `dtype` and `shape`.
NpyArray npy_load(const std::string& path, DType dtype, const Shape& shape);

// Write `data` (element_count(shape) elements of `dtype`) as a version 1.0 .npy file.
void npy_save(const std::string& path, DType dtype, const Shape& shape, const void* data);

// ---- dense buffers <-> ncnn::Mat -------------------------------------------------------------
//
// ncnn has no batch dimension and pads each channel to 16 bytes (Mat::cstep), so a dense tensor
// is not a Mat's memory. Shapes follow pnnx: on a shape of rank >= 2 a leading 1 is the batch
// and is dropped; what is left (rank 1..4) is W, HxW, CxHxW or CxDxHxW. So 1x64x56x56 is a
// 3-d Mat, 1x1000 a 1-d Mat, 2x3x5x7 a 4-d Mat (c=2, d=3).

// The ncnn-side shape: `shape` without its batch dimension. Throws if not rank 1..4 after that.
Shape ncnn_shape(const Shape& shape);

// The shape of a Mat as ncnn_shape() would write it ({w}, {h,w}, {c,h,w}, {c,d,h,w}).
Shape mat_shape(const ncnn::Mat& m);

// A new, uninitialised float32 Mat of ncnn_shape(shape), e.g. to receive into.
ncnn::Mat alloc_mat(const Shape& shape, ncnn::Allocator* allocator = nullptr);

// A new float32 Mat holding the dense tensor `data` of `shape`.
ncnn::Mat mat_from_dense(const float* data, const Shape& shape,
                         ncnn::Allocator* allocator = nullptr);

// Whether `m` can take the next tensor of `shape` in place: a plain float32 Mat of that shape
// that nothing else holds (a send still in flight from this memory, or a Mat computed from it
// as a view, must not see the next frame's bytes).
bool mat_reusable(const ncnn::Mat& m, const Shape& shape);

// Copy the dense float32 tensor `data` of `shape` into `m`, reusing its memory unless it is
// not a float32 Mat of that shape or is held elsewhere (then `m` becomes a new Mat), as a
// receive into a Mat does.
void dense_into_mat(const float* data, const Shape& shape, ncnn::Mat& m);

// Copy the Mat's elements, without padding, into `out` (w*h*d*c floats). The Mat must be
// float32 with elempack 1, as Extractor::extract() returns by default.
void dense_from_mat(const ncnn::Mat& m, float* out);

// An MPI datatype describing the Mat's elements in place (a vector over channels with stride
// cstep), so a Mat is sent or received with zero copies; its type signature is w*h*d*c floats,
// so either side may use a dense MPI_FLOAT buffer instead. Committed; free with MPI_Type_free.
MPI_Datatype mat_datatype(const ncnn::Mat& m);

// How a float32 tensor travels: as its ncnn::Mat storage from the first element to the last,
// (c-1)*cstep + w*h*d floats with the 16-byte padding between channels, in one contiguous
// block -- what Open MPI's shared memory moves with a single copy (CMA) made by the receiver
// alone, even while the sender computes; a strided datatype would go in 32 KB fragments that
// move only while both ranks are inside MPI calls (measured: 0.02-0.1 of memcpy). Unpadded
// tensors (cstep == w*h*d, every 1-d and 2-d one) are exactly the dense format. Where padding
// would add more than an eighth (small maps: a 1x1 map would be 4x), the elements travel
// without it, described by mat_datatype(). A function of the shape only: both ends agree.
struct WireLayout {
  int64_t c = 1, plane = 0, cstep = 0;
  int64_t count = 0;  // floats on the wire when as_mat
  bool as_mat = false;
};
WireLayout wire_layout(const Shape& shape);

// ---- typed nonblocking transfers ------------------------------------------------------------

// ---- smaller wire formats (gen --wire; autodice_tensors.cpp) ---------------------------------

// The bytes `elements` float32 values take on the wire as `wire` carries them.
int64_t wire_bytes(Wire wire, int64_t elements);
const char* wire_name(Wire wire);  // "fp32", "fp16", "int8": gen's spelling

// A float32 Mat's elements (elempack 1, in dense order: channel after channel, without ncnn's
// padding) written as `wire` carries them, wire_bytes(wire, elements) bytes at `out`; and back,
// into a float32 Mat of as many elements. Fp16 rounds to the nearest even, as numpy and the
// CPUs' own conversions do, so autodice check predicts what a run computes to the bit.
void wire_pack(const ncnn::Mat& m, Wire wire, unsigned char* out);
void wire_unpack(const unsigned char* in, Wire wire, ncnn::Mat& m);

// What the plan says travels on an edge; both sides must agree on it.
struct TensorInfo {
  std::string name;
  Shape shape;
  DType dtype = DType::Float32;
  Wire wire = Wire::Fp32;  // a float32 tensor that crosses hosts may travel in fewer bytes

  int64_t bytes() const { return element_count(shape) * static_cast<int64_t>(dtype_size(dtype)); }
  // What a message of it holds: bytes() but for a smaller wire format.
  int64_t message_bytes() const {
    return wire == Wire::Fp32 ? bytes() : wire_bytes(wire, element_count(shape));
  }
  std::string describe() const;  // "shape 1x4x4x4 float32", "... as fp16"
};

// Seconds a wait may take before the watchdog aborts the run (after a 1 s grace, so the job
// ends within 10 s of a peer dying): 8 by default, or
// AUTODICE_TIMEOUT_S (read by init_runtime), or set_wait_timeout(). <= 0 waits forever.
void set_wait_timeout(double seconds);
double wait_timeout();

// One posted MPI_Isend or MPI_Irecv of one tensor. The buffer must outlive the transfer and
// every transfer must be waited for (destroying a pending one aborts: MPI would write into
// freed memory). On completion a receive checks it got exactly info.bytes() bytes.
class Transfer {
 public:
  static Transfer send(MPI_Comm comm, const TensorInfo& info, const void* dense, int peer, int tag);
  static Transfer send(MPI_Comm comm, const TensorInfo& info, const ncnn::Mat& m, int peer,
                       int tag);
  static Transfer recv(MPI_Comm comm, const TensorInfo& info, void* dense, int peer, int tag);
  // Receives straight into `m`, which is allocated as a float32 Mat of ncnn_shape(info.shape)
  // unless it already has that shape and is held nowhere else (a send from it in flight).
  // A tensor in a smaller wire format (info.wire) travels packed and is unpacked into `m` on
  // completion: Mats only, as cut tensors travel.
  static Transfer recv(MPI_Comm comm, const TensorInfo& info, ncnn::Mat& m, int peer, int tag);

  Transfer(Transfer&& other) noexcept;
  Transfer& operator=(Transfer&& other) = delete;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;
  ~Transfer();

  // True once complete (and checked); never blocks.
  bool test();
  // Block until complete; abort the run, naming rank, peer and tensor, if that takes longer
  // than `timeout_s` seconds (default: wait_timeout()).
  void wait(double timeout_s = -1);

  const TensorInfo& info() const { return info_; }
  bool done() const { return request_ == MPI_REQUEST_NULL; }
  std::string what() const;  // recv "Buff4" from rank 0

 private:
  Transfer(MPI_Comm comm, TensorInfo info, bool is_recv, int peer, int tag);
  void post(void* buffer, int count, MPI_Datatype type);
  void finish(int rc, const MPI_Status& status);

  MPI_Comm comm_;
  TensorInfo info_;
  bool is_recv_;
  int peer_;
  int tag_;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;  // the datatype posted, to count what arrived
  MPI_Request request_ = MPI_REQUEST_NULL;
  ncnn::Mat staging_;  // a sent Mat, held until sent; or the Mat layout of a dense or odd one;
                       // or the Mat a smaller wire format is unpacked into
  float* dense_out_ = nullptr;  // a dense receive through staging_: unpacked on completion
  std::vector<unsigned char> packed_;  // the message in a smaller wire format (info_.wire)
};

// Wait for all of `transfers` under one deadline, completing them in whatever order they finish.
void wait_all(std::vector<Transfer>& transfers, double timeout_s = -1);

// MPI_Barrier under a deadline (<= 0 waits forever), so a rank that hangs while the others wait
// for it at a synchronisation point ends the run with a message naming `what`.
void barrier(MPI_Comm comm, double timeout_s, const std::string& what);

}  // namespace autodice
