// Unit tests for the autodice runtime, with a ten-line harness instead of a framework.
//
//   test_runtime unit        serial tests (npy, packing, datatypes, timers); one process
//   test_runtime mpi         two ranks: Mats and dense buffers over MPI, zero-copy both ways
//   test_runtime mismatch    two ranks: a short message must abort naming the tensor
//   test_runtime truncate    two ranks: a long message must abort naming the tensor
//   test_runtime timeout     two ranks: a message that never comes must abort in ~1 s
//
// The last three are expected to fail; CMake runs them through expect_failure.cmake, which
// checks the exit code and the message.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "autodice_runtime.h"
#include "autodice_stream.h"

using autodice::DType;
using autodice::Shape;
using autodice::TensorInfo;
using autodice::Transfer;

// ---- harness ---------------------------------------------------------------------------------

static int g_failures = 0;

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      ++g_failures;                                                                      \
      std::cerr << autodice::log_prefix() << " " << __FILE__ << ":" << __LINE__          \
                << ": CHECK(" #cond ") failed\n";                                        \
    }                                                                                    \
  } while (0)

// `body` must throw std::runtime_error whose text contains every one of `parts`.
static void check_throws(const std::function<void()>& body, std::vector<std::string> parts,
                         int line) {
  try {
    body();
  } catch (const std::runtime_error& e) {
    for (const std::string& part : parts) {
      if (std::string(e.what()).find(part) == std::string::npos) {
        ++g_failures;
        std::cerr << "line " << line << ": error \"" << e.what() << "\" lacks \"" << part
                  << "\"\n";
      }
    }
    return;
  }
  ++g_failures;
  std::cerr << "line " << line << ": expected an exception\n";
}
#define CHECK_THROWS(body, ...) check_throws([&] { body; }, {__VA_ARGS__}, __LINE__)

// ---- fixtures --------------------------------------------------------------------------------

static std::vector<float> iota(int64_t n, float start = 0.5f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = start + static_cast<float>(i);
  return v;
}

static std::string tmp_path(const std::string& name) {
  return "autodice_test_" + std::to_string(::getpid()) + "_" + name;
}

static void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

static std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// What numpy 2.x writes for np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)).
static std::string numpy_2x3_f32() {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  header.append(128 - 10 - header.size() - 1, ' ');
  header += '\n';
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + char(header.size()) + '\0' + header;
  for (int i = 0; i < 6; ++i) {
    float v = static_cast<float>(i);
    bytes.append(reinterpret_cast<const char*>(&v), 4);
  }
  return bytes;
}

// ---- serial tests ----------------------------------------------------------------------------

static void test_npy_matches_numpy_bytes() {
  std::string path = tmp_path("numpy.npy");
  write_bytes(path, numpy_2x3_f32());
  autodice::NpyArray a = autodice::npy_load(path, DType::Float32, {2, 3});
  CHECK(a.f32()[5] == 5.0f);
  std::vector<float> data = iota(6, 0.0f);
  autodice::npy_save(path, DType::Float32, {2, 3}, data.data());
  CHECK(read_bytes(path) == numpy_2x3_f32());  // byte for byte what numpy writes
  std::remove(path.c_str());
}

static void test_npy_round_trip() {
  std::string path = tmp_path("rt.npy");
  for (Shape shape : {Shape{3, 7, 7}, Shape{1, 5}, Shape{2, 3, 5, 7}, Shape{7}, Shape{}}) {
    std::vector<float> data = iota(autodice::element_count(shape));
    autodice::npy_save(path, DType::Float32, shape, data.data());
    autodice::NpyArray a = autodice::npy_load(path);
    CHECK(a.dtype == DType::Float32);
    CHECK(a.shape == shape);
    CHECK(std::memcmp(a.f32(), data.data(), data.size() * 4) == 0);
  }
  std::vector<int64_t> ids = {-1, 1LL << 40, 3};
  autodice::npy_save(path, DType::Int64, {3}, ids.data());
  autodice::NpyArray b = autodice::npy_load(path, DType::Int64, {3});
  CHECK(b.i64()[1] == (1LL << 40));
  CHECK_THROWS(b.f32(), "int64");
  std::remove(path.c_str());
}

static void test_npy_errors_name_the_file() {
  std::string path = tmp_path("bad.npy");
  write_bytes(path, "PK\x03\x04 not numpy at all");
  CHECK_THROWS(autodice::npy_load(path), path, "bad magic");

  std::string good = numpy_2x3_f32();
  std::string f64 = good;
  f64.replace(f64.find("<f4"), 3, "<f8");
  write_bytes(path, f64);
  CHECK_THROWS(autodice::npy_load(path), path, "'<f8'", "not supported");

  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  write_bytes(path, fortran);
  CHECK_THROWS(autodice::npy_load(path), path, "Fortran");

  write_bytes(path, good.substr(0, good.size() - 4));
  CHECK_THROWS(autodice::npy_load(path), path, "does not match header shape 2x3 float32");
  write_bytes(path, good + "xxxx");
  CHECK_THROWS(autodice::npy_load(path), path, "does not match");

  write_bytes(path, good);
  CHECK_THROWS(autodice::npy_load(path, DType::Float32, {1, 2, 3}), path,
               "holds 2x3 float32, expected 1x2x3 float32");
  CHECK_THROWS(autodice::npy_load(path, DType::Int64, {2, 3}), "expected 2x3 int64");
  std::remove(path.c_str());
  CHECK_THROWS(autodice::npy_load(path), path, "cannot open");
}

// Names from a model go into stats.json and the profiler's JSON: quotes, backslashes and
// control characters must come out as JSON escapes (the profiler had a copy that did not).
static void test_json_string_escapes_what_json_must() {
  CHECK(autodice::json_string("conv1") == "\"conv1\"");
  CHECK(autodice::json_string("a\"b\\c") == "\"a\\\"b\\\\c\"");
  CHECK(autodice::json_string("t\tn\n\x01") == "\"t\\u0009n\\u000a\\u0001\"");
  CHECK(autodice::json_string("caf\xc3\xa9") == "\"caf\xc3\xa9\"");  // UTF-8 as it is
}

static void test_ncnn_shape_drops_the_batch() {
  CHECK((autodice::ncnn_shape({1, 64, 56, 56}) == Shape{64, 56, 56}));
  CHECK((autodice::ncnn_shape({1, 1000}) == Shape{1000}));
  CHECK((autodice::ncnn_shape({1, 2, 3, 4, 5}) == Shape{2, 3, 4, 5}));
  CHECK((autodice::ncnn_shape({3, 7, 7}) == Shape{3, 7, 7}));
  CHECK((autodice::ncnn_shape({2, 3, 5, 7}) == Shape{2, 3, 5, 7}));
  CHECK((autodice::ncnn_shape({5}) == Shape{5}));
  CHECK_THROWS(autodice::ncnn_shape({2, 2, 3, 4, 5}), "2x2x3x4x5", "no ncnn::Mat form");
  CHECK_THROWS(autodice::ncnn_shape({}), "scalar");
}

// Pack, check where ncnn put each element (padding included), unpack, compare.
static void check_pack(const Shape& shape, int dims, size_t cstep) {
  std::vector<float> dense = iota(autodice::element_count(shape));
  ncnn::Mat m = autodice::mat_from_dense(dense.data(), shape);
  CHECK(m.dims == dims);
  CHECK(m.cstep == cstep);
  CHECK(autodice::mat_shape(m) == autodice::ncnn_shape(shape));
  const size_t plane = static_cast<size_t>(m.w) * m.h * m.d;
  const float* last = m.channel(m.c - 1);
  CHECK(last[plane - 1] == dense.back());
  CHECK(m.channel(0)[0] == dense.front());
  std::vector<float> back(dense.size(), -1.0f);
  autodice::dense_from_mat(m, back.data());
  CHECK(back == dense);
}

static void test_pack_odd_shapes() {
  check_pack({3, 7, 7}, 3, 52);          // 49 floats padded to 52 (16 bytes)
  check_pack({1, 3, 7, 7}, 3, 52);       // NCHW batch 1
  check_pack({1, 5}, 1, 8);              // batch + W; this ncnn pads 1-d Mats too
  check_pack({2, 3, 5, 7}, 4, 108);      // c=2, d=3: 105 floats padded to 108
  check_pack({1, 2, 3, 5, 7}, 4, 108);   // NCDHW batch 1
  check_pack({5, 3}, 2, 16);             // HW: 15 floats padded to 16
  check_pack({1, 16, 4, 4}, 3, 16);      // already aligned
  ncnn::Mat m = autodice::mat_from_dense(iota(49).data(), {1, 1, 7, 7});
  CHECK(m.row(6)[6] == 48.5f);
  ncnn::Mat fresh = autodice::alloc_mat({1, 4, 2, 3});
  CHECK((fresh.dims == 3 && fresh.c == 4 && fresh.h == 2 && fresh.w == 3 && fresh.cstep == 8));
  ncnn::Mat empty;
  CHECK_THROWS(autodice::dense_from_mat(empty, nullptr), "empty Mat");
}

static void test_mat_datatype_describes_the_padding() {
  std::vector<float> dense = iota(2 * 3 * 5 * 7);
  ncnn::Mat m = autodice::mat_from_dense(dense.data(), {2, 3, 5, 7});
  MPI_Datatype type = autodice::mat_datatype(m);
  int size = 0;
  MPI_Aint lb = 0, extent = 0;
  MPI_Type_size(type, &size);
  MPI_Type_get_extent(type, &lb, &extent);
  CHECK(size == 2 * 105 * 4);                 // only elements travel
  CHECK(extent == (108 + 105) * 4);           // spanning the padding between channels
  MPI_Type_free(&type);
}

// Blobs and workspace: aligned, never overlapping, and every freed block merged with its
// neighbours, so a block as large as all of them fits where the first one was once they are
// freed, whatever order they were freed in; small ones come from malloc.
static void test_activation_blocks_reuse_their_space() {
  ncnn::Option opt;
  autodice::allocate_activations(opt);
  ncnn::Allocator* a = opt.blob_allocator;
  CHECK(opt.workspace_allocator == a);
  const std::vector<size_t> sizes = {100 << 10, 3 << 20, 64 << 10, 1 << 20, 300 << 10, 2 << 20};
  std::vector<char*> blocks;
  for (size_t n : sizes) {
    char* p = static_cast<char*>(a->fastMalloc(n));
    CHECK(reinterpret_cast<uintptr_t>(p) % 64 == 0);
    std::memset(p, 1, n);  // all of it usable
    blocks.push_back(p);
  }
  for (size_t i = 0; i < blocks.size(); ++i)
    for (size_t j = i + 1; j < blocks.size(); ++j)
      CHECK(blocks[i] + sizes[i] <= blocks[j] || blocks[j] + sizes[j] <= blocks[i]);
  char* lowest = *std::min_element(blocks.begin(), blocks.end());
  for (size_t i : {3, 0, 5, 1, 4, 2}) a->fastFree(blocks[i]);
  size_t total = 0;
  for (size_t n : sizes) total += n;
  char* all = static_cast<char*>(a->fastMalloc(total));
  CHECK(all == lowest);
  char* again = static_cast<char*>(a->fastMalloc(1 << 20));  // after it, not inside
  CHECK(again >= all + total);
  a->fastFree(all);
  char* first = static_cast<char*>(a->fastMalloc(1 << 20));  // the best fit: where all was
  CHECK(first == all);
  a->fastFree(first);
  a->fastFree(again);
  void* small = a->fastMalloc(4 << 10);
  CHECK(small != nullptr && (static_cast<char*>(small) < lowest ||
                             static_cast<char*>(small) >= lowest + total + (1 << 20)));
  a->fastFree(small);
}

static void test_log_timer_rss() {
  CHECK(autodice::log_prefix().rfind("[rank 0 ", 0) == 0);
  autodice::Timer timer;
  CHECK(timer.elapsed_ms() >= 0.0);
  std::vector<char> big(64 << 20, 1);  // touch 64 MiB
  CHECK(autodice::peak_rss_bytes() >= (64 << 20));
  CHECK(big[12345] == 1);
  autodice::set_wait_timeout(2.5);
  CHECK(autodice::wait_timeout() == 2.5);
}

// A dense frame into a Mat: the same memory while nothing else holds it, a new Mat once
// something does (a send in flight from it must keep the frame it was given).
static void test_dense_into_mat_reuses_only_a_free_mat() {
  const Shape shape = {1, 3, 5, 7};  // 35 floats a channel: padded to cstep 36
  std::vector<float> dense(105), back(105);
  for (size_t i = 0; i < dense.size(); ++i) dense[i] = float(i);
  ncnn::Mat m;
  autodice::dense_into_mat(dense.data(), shape, m);
  autodice::dense_from_mat(m, back.data());
  CHECK(back == dense);
  const void* first = m.data;
  dense[0] = -1;
  autodice::dense_into_mat(dense.data(), shape, m);
  CHECK(m.data == first && static_cast<const float*>(m.data)[0] == -1);
  const ncnn::Mat held = m;  // as a send in flight holds it
  dense[0] = -2;
  autodice::dense_into_mat(dense.data(), shape, m);
  CHECK(m.data != first && static_cast<const float*>(held.data)[0] == -1);
  CHECK(static_cast<const float*>(m.data)[0] == -2);
}

// A rank maps the gateway's frame slots only where the offer names this very file on this
// boot of this kernel, and not with AUTODICE_MAP_SLOTS=0.
static void test_shared_slots_map_only_the_same_file() {
  const int fd = memfd_create("slots-test", MFD_CLOEXEC);
  CHECK(fd >= 0);
  const size_t bytes = 3 * 4096;
  CHECK(ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  CHECK(pwrite(fd, "frame", 5, 4096) == 5);
  const autodice::SlotsOffer offer = autodice::describe_slots(fd, bytes);
  {
    const autodice::MappedSlots slots(offer);
    CHECK(slots.data() != nullptr && std::memcmp(slots.data() + 4096, "frame", 5) == 0);
  }
  const auto declined = [&](const std::function<void(autodice::SlotsOffer&)>& change) {
    autodice::SlotsOffer other = offer;
    change(other);
    return autodice::MappedSlots(other).data() == nullptr;
  };
  CHECK(declined([](autodice::SlotsOffer& o) { o.ino += 1; }));         // another file
  CHECK(declined([](autodice::SlotsOffer& o) { o.boot[1] ^= 1; }));     // another machine
  CHECK(declined([](autodice::SlotsOffer& o) { o.pid = 1 << 30; }));    // no such process
  CHECK(declined([](autodice::SlotsOffer& o) { o.bytes = 1 << 20; }));  // longer than it is
  setenv("AUTODICE_MAP_SLOTS", "0", 1);
  CHECK(declined([](autodice::SlotsOffer&) {}));
  unsetenv("AUTODICE_MAP_SLOTS");
  close(fd);
}

// ---- two-rank tests --------------------------------------------------------------------------

static int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Rank 0 sends padded Mats (their storage as one block) and dense buffers; rank 1 receives them
// into Mats and dense buffers in every combination, then returns one so rank 0 also receives into
// dense. D's 1x1 maps would be 4x their size with padding: they travel without it. A2 is A in
// a 2-d Mat (pnnx's choice of shape): it goes through the plan's layout.
// One value's half as wire_pack writes it, the portable way (a Mat of one element never
// reaches the F16C loop, which takes 8 at a time).
static uint16_t half_alone(float v) {
  ncnn::Mat m(1);
  m[0] = v;
  uint16_t h = 0;
  autodice::wire_pack(m, autodice::Wire::Fp16, reinterpret_cast<unsigned char*>(&h));
  return h;
}

static void test_halves_round_to_nearest_even() {
  using autodice::Wire;
  // Bits as numpy's float16 gives them: ties to even, subnormals, overflow, signed zero, NaN.
  const std::vector<std::pair<float, uint16_t>> known = {
      {1.0f, 0x3c00}, {-2.0f, 0xc000}, {2049.0f, 0x6800}, {2051.0f, 0x6802},
      {65504.0f, 0x7bff}, {65519.0f, 0x7bff}, {65520.0f, 0x7c00}, {1e6f, 0x7c00},
      {6.103515625e-05f, 0x0400}, {5.9604645e-08f, 0x0001}, {2.9802322e-08f, 0x0000},
      {3.0e-08f, 0x0001}, {1e-45f, 0x0000}, {-0.0f, 0x8000}, {INFINITY, 0x7c00},
      {-INFINITY, 0xfc00}, {NAN, 0x7e00}, {0.1f, 0x2e66}, {-1e-5f, 0x80a8}};
  std::vector<float> values;
  for (auto [v, h] : known) {
    CHECK(half_alone(v) == h);
    values.push_back(v);
  }
  // The same through the vector path, 8 at a time, and back: every half there is.
  ncnn::Mat all(65536);
  std::vector<uint16_t> halves(65536), again(65536);
  for (int i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  autodice::wire_unpack(reinterpret_cast<const unsigned char*>(halves.data()), Wire::Fp16, all);
  autodice::wire_pack(all, Wire::Fp16, reinterpret_cast<unsigned char*>(again.data()));
  int differ = 0;
  for (int i = 0; i < 65536; ++i) {
    const bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
    differ += !nan && (again[i] != halves[i] || half_alone(all[i]) != halves[i]);
  }
  CHECK(differ == 0);
  ncnn::Mat m(static_cast<int>(values.size()) * 8);  // each known value in every lane
  for (int i = 0; i < m.w; ++i) m[i] = values[i / 8];
  std::vector<uint16_t> lanes(m.w);
  autodice::wire_pack(m, Wire::Fp16, reinterpret_cast<unsigned char*>(lanes.data()));
  for (int i = 0; i < m.w; ++i) CHECK(lanes[i] == known[i / 8].second);
}

static void test_int8_wire_spans_the_frames_values() {
  using autodice::Wire;
  ncnn::Mat m(5, 3, 2);  // padded channels: the steps are dense
  for (int q = 0; q < 2; ++q)
    for (int i = 0; i < 15; ++i) m.channel(q)[i] = -3.0f + 0.5f * (q * 15 + i);
  std::vector<unsigned char> packed(static_cast<size_t>(autodice::wire_bytes(Wire::Int8, 30)));
  CHECK(packed.size() == 38);
  autodice::wire_pack(m, Wire::Int8, packed.data());
  float lo, step;
  std::memcpy(&lo, packed.data(), 4);
  std::memcpy(&step, packed.data() + 4, 4);
  CHECK(lo == -3.0f && step == 14.5f / 255.0f && packed[8] == 0 && packed[37] == 255);
  ncnn::Mat back(5, 3, 2);
  autodice::wire_unpack(packed.data(), Wire::Int8, back);
  for (int q = 0; q < 2; ++q)
    for (int i = 0; i < 15; ++i) CHECK(std::fabs(back.channel(q)[i] - m.channel(q)[i]) <= step / 2);
  ncnn::Mat flat(4);
  flat.fill(7.0f);  // one value everywhere: a step of 0, sent exactly
  autodice::wire_pack(flat, Wire::Int8, packed.data());
  autodice::wire_unpack(packed.data(), Wire::Int8, flat);
  CHECK(flat[0] == 7.0f && flat[3] == 7.0f);
}

static void test_mpi_transfers() {
  const TensorInfo a{"A", {1, 3, 7, 7}, DType::Float32};
  const TensorInfo d{"D", {1, 16, 1, 1}, DType::Float32};
  const TensorInfo b{"B", {2, 3, 5, 7}, DType::Float32};
  const TensorInfo c{"C", {1, 5}, DType::Float32};
  const TensorInfo ids{"ids", {4}, DType::Int64};
  const std::vector<float> da = iota(147), db = iota(210, 100.0f), dc = iota(5, -9.0f);
  const std::vector<float> dd = iota(16, 3.0f);
  CHECK(autodice::wire_layout(a.shape).as_mat && autodice::wire_layout(a.shape).count == 153);
  CHECK(!autodice::wire_layout(d.shape).as_mat);
  const std::vector<int64_t> di = {7, -7, 1LL << 50, 0};
  MPI_Comm comm = MPI_COMM_WORLD;

  if (rank() == 0) {
    ncnn::Mat ma = autodice::mat_from_dense(da.data(), a.shape);
    ncnn::Mat mb = autodice::mat_from_dense(db.data(), b.shape);
    ncnn::Mat mc = autodice::mat_from_dense(dc.data(), c.shape);
    std::vector<Transfer> sends;
    sends.push_back(Transfer::send(comm, a, ma, 1, 1));          // Mat -> Mat
    sends.push_back(Transfer::send(comm, a, ma, 1, 2));          // Mat -> dense
    sends.push_back(Transfer::send(comm, b, mb, 1, 3));          // 4-d Mat -> Mat
    sends.push_back(Transfer::send(comm, c, mc, 1, 4));          // 1-d Mat -> Mat
    sends.push_back(Transfer::send(comm, b, db.data(), 1, 5));   // dense -> Mat
    sends.push_back(Transfer::send(comm, ids, di.data(), 1, 6)); // int64 dense
    ncnn::Mat md = autodice::mat_from_dense(dd.data(), d.shape);
    ncnn::Mat ma2(49, 3);
    std::memcpy(ma2.data, da.data(), da.size() * 4);
    sends.push_back(Transfer::send(comm, d, md, 1, 8));          // unpadded on the wire
    sends.push_back(Transfer::send(comm, d, dd.data(), 1, 9));   // dense -> Mat, unpadded
    sends.push_back(Transfer::send(comm, a, ma2, 1, 10));        // 2-d Mat -> the plan's 3-d
    autodice::wait_all(sends);
    std::vector<float> back(147, 0.0f);
    Transfer r = Transfer::recv(comm, a, back.data(), 1, 7);
    r.wait();
    CHECK(back == da);
    // Smaller wire formats: a 2-d Mat for the plan's 3-d shape, packed in dense order.
    const TensorInfo half{"A", {1, 3, 7, 7}, DType::Float32, autodice::Wire::Fp16};
    const TensorInfo steps{"A", {1, 3, 7, 7}, DType::Float32, autodice::Wire::Int8};
    std::vector<Transfer> packed;
    packed.push_back(Transfer::send(comm, half, ma2, 1, 11));
    packed.push_back(Transfer::send(comm, steps, ma, 1, 12));
    autodice::wait_all(packed);
  } else {
    ncnn::Mat ra(1, 1, 1);  // wrong shape on purpose: recv must reallocate it
    ncnn::Mat rb, rb2, rc;
    std::vector<float> ra_dense(147, 0.0f);
    std::vector<int64_t> ri(4, 0);
    std::vector<Transfer> recvs;
    recvs.push_back(Transfer::recv(comm, a, ra, 0, 1));
    recvs.push_back(Transfer::recv(comm, a, ra_dense.data(), 0, 2));
    recvs.push_back(Transfer::recv(comm, b, rb, 0, 3));
    recvs.push_back(Transfer::recv(comm, c, rc, 0, 4));
    recvs.push_back(Transfer::recv(comm, b, rb2, 0, 5));
    recvs.push_back(Transfer::recv(comm, ids, ri.data(), 0, 6));
    ncnn::Mat rd, rd2, ra2;
    recvs.push_back(Transfer::recv(comm, d, rd, 0, 8));
    recvs.push_back(Transfer::recv(comm, d, rd2, 0, 9));
    recvs.push_back(Transfer::recv(comm, a, ra2, 0, 10));
    autodice::wait_all(recvs);
    std::vector<float> small(16, 0.0f), again(147, 0.0f);
    autodice::dense_from_mat(rd, small.data());
    CHECK(small == dd);
    autodice::dense_from_mat(rd2, small.data());
    CHECK(small == dd);
    autodice::dense_from_mat(ra2, again.data());
    CHECK(again == da);

    CHECK(ra.dims == 3 && ra.cstep == 52);
    std::vector<float> out(210, 0.0f);
    autodice::dense_from_mat(ra, out.data());
    CHECK(std::equal(da.begin(), da.end(), out.begin()));
    CHECK(ra_dense == da);
    autodice::dense_from_mat(rb, out.data());
    CHECK(out == db);
    std::fill(out.begin(), out.end(), 0.0f);
    autodice::dense_from_mat(rb2, out.data());
    CHECK(out == db);
    autodice::dense_from_mat(rc, out.data());
    CHECK(std::equal(dc.begin(), dc.end(), out.begin()));
    CHECK(ri == di);

    Transfer s = Transfer::send(comm, a, ra, 0, 7);
    s.wait();
    const TensorInfo half{"A", {1, 3, 7, 7}, DType::Float32, autodice::Wire::Fp16};
    const TensorInfo steps{"A", {1, 3, 7, 7}, DType::Float32, autodice::Wire::Int8};
    CHECK(half.message_bytes() == 294 && steps.message_bytes() == 155);
    ncnn::Mat rh, rs;
    std::vector<Transfer> packed;
    packed.push_back(Transfer::recv(comm, half, rh, 0, 11));
    packed.push_back(Transfer::recv(comm, steps, rs, 0, 12));
    autodice::wait_all(packed);
    CHECK(rh.dims == 3 && rh.cstep == 52 && rs.dims == 3);
    autodice::dense_from_mat(rh, out.data());
    CHECK(std::equal(da.begin(), da.end(), out.begin()));  // 0..146: every one a half
    autodice::dense_from_mat(rs, out.data());
    for (int i = 0; i < 147; ++i) CHECK(std::fabs(out[i] - da[i]) <= 146.0f / 255 / 2 + 1e-5f);
  }
}

// The sender believes Buff4 is 1x4x2x2, the receiver 1x4x4x4: the receiver must say so and end
// the run rather than compute on a quarter-filled buffer.
static void run_mismatch(int64_t sender_h) {
  MPI_Comm comm = MPI_COMM_WORLD;
  if (rank() == 0) {
    const TensorInfo sent{"Buff4", {1, 4, sender_h, sender_h}, DType::Float32};
    std::vector<float> data = iota(autodice::element_count(sent.shape));
    Transfer s = Transfer::send(comm, sent, data.data(), 1, 4);
    s.wait(30);
  } else {
    const TensorInfo want{"Buff4", {1, 4, 4, 4}, DType::Float32};
    ncnn::Mat m;
    Transfer r = Transfer::recv(comm, want, m, 0, 4);
    r.wait(30);
  }
  MPI_Barrier(comm);
}

// Rank 1 waits for Buff9, which rank 0 never sends; the watchdog (AUTODICE_TIMEOUT_S) fires.
static void run_timeout() {
  MPI_Comm comm = MPI_COMM_WORLD;
  if (rank() == 1) {
    const TensorInfo want{"Buff9", {1, 8}, DType::Float32};
    std::vector<float> buffer(8);
    Transfer r = Transfer::recv(comm, want, buffer.data(), 0, 9);
    r.wait();
  }
  MPI_Barrier(comm);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  autodice::init_runtime(MPI_COMM_WORLD);
  const std::string mode = argc > 1 ? argv[1] : "unit";
  std::vector<std::pair<const char*, void (*)()>> tests;
  if (mode == "unit") {
    tests = {{"npy_matches_numpy_bytes", test_npy_matches_numpy_bytes},
             {"npy_round_trip", test_npy_round_trip},
             {"npy_errors_name_the_file", test_npy_errors_name_the_file},
             {"json_string_escapes_what_json_must", test_json_string_escapes_what_json_must},
             {"ncnn_shape_drops_the_batch", test_ncnn_shape_drops_the_batch},
             {"pack_odd_shapes", test_pack_odd_shapes},
             {"mat_datatype_describes_the_padding", test_mat_datatype_describes_the_padding},
             {"log_timer_rss", test_log_timer_rss},
             {"activation_blocks_reuse_their_space", test_activation_blocks_reuse_their_space},
             {"dense_into_mat_reuses_only_a_free_mat", test_dense_into_mat_reuses_only_a_free_mat},
             {"shared_slots_map_only_the_same_file", test_shared_slots_map_only_the_same_file},
             {"halves_round_to_nearest_even", test_halves_round_to_nearest_even},
             {"int8_wire_spans_the_frames_values", test_int8_wire_spans_the_frames_values}};
  } else if (mode == "mpi") {
    tests = {{"mpi_transfers", test_mpi_transfers}};
  } else if (mode == "mismatch") {
    tests = {{"mismatch", [] { run_mismatch(2); }}};
  } else if (mode == "truncate") {
    tests = {{"truncate", [] { run_mismatch(8); }}};
  } else if (mode == "timeout") {
    tests = {{"timeout", run_timeout}};
  } else {
    std::cerr << "unknown mode " << mode << "\n";
    MPI_Finalize();
    return 2;
  }
  int failed_tests = 0;
  for (auto& [name, fn] : tests) {
    int before = g_failures;
    try {
      fn();
    } catch (const std::exception& e) {
      ++g_failures;
      std::cerr << autodice::log_prefix() << " " << name << ": uncaught " << e.what() << "\n";
    }
    bool ok = g_failures == before;
    failed_tests += !ok;
    std::cout << autodice::log_prefix() << " " << (ok ? "PASS " : "FAIL ") << name << "\n";
  }
  int any = failed_tests, total = 0;
  MPI_Allreduce(&any, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank() == 0)
    std::cout << mode << ": " << tests.size() - failed_tests << " passed, " << failed_tests
              << " failed\n";
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
