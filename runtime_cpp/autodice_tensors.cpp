// autodice runtime: tensors in files and in ncnn (.npy files, dense buffers <-> ncnn::Mat, a
// Mat as an MPI datatype); see autodice_runtime.h for what each piece is for.
#include "autodice_runtime.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace autodice {

// ---- .npy files -----------------------------------------------------------------------------

const float* NpyArray::f32() const {
  if (dtype != DType::Float32) throw std::runtime_error("npy array is int64, not float32");
  return reinterpret_cast<const float*>(bytes.data());
}

const int64_t* NpyArray::i64() const {
  if (dtype != DType::Int64) throw std::runtime_error("npy array is float32, not int64");
  return reinterpret_cast<const int64_t*>(bytes.data());
}

// The value after `'key':` in the header dict, up to the next top-level comma or brace.
static std::string header_value(const std::string& header, const std::string& key,
                                const std::string& path) {
  size_t at = header.find("'" + key + "'");
  size_t colon = at == std::string::npos ? at : header.find(':', at);
  if (colon == std::string::npos)
    throw std::runtime_error(path + ": .npy header has no '" + key + "': " + header);
  size_t begin = header.find_first_not_of(' ', colon + 1);
  if (begin == std::string::npos)
    throw std::runtime_error(path + ": .npy header has no value for '" + key + "': " + header);
  size_t end = header[begin] == '(' ? header.find(')', begin) : header.find_first_of(",}", begin);
  if (end == std::string::npos)
    throw std::runtime_error(path + ": .npy header is malformed: " + header);
  return header.substr(begin, end - begin + (header[begin] == '(' ? 1 : 0));
}

static Shape parse_shape(const std::string& text, const std::string& path) {
  // "(1, 3, 7, 7)", "(5,)", "()"
  Shape shape;
  size_t i = 1;
  while (i < text.size()) {
    size_t next = text.find_first_of(",)", i);
    std::string item = text.substr(i, next - i);
    size_t first = item.find_first_not_of(' ');
    if (first != std::string::npos) {
      char* end = nullptr;
      long long v = std::strtoll(item.c_str() + first, &end, 10);
      if (*end != '\0' && *end != ' ') throw std::runtime_error(path + ": bad shape " + text);
      if (v < 0) throw std::runtime_error(path + ": negative dimension in shape " + text);
      shape.push_back(v);
    }
    if (next == std::string::npos || text[next] == ')') break;
    i = next + 1;
  }
  return shape;
}

NpyArray npy_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open (" + std::strerror(errno) + ")");
  unsigned char preamble[10] = {};
  in.read(reinterpret_cast<char*>(preamble), 8);
  if (!in || std::memcmp(preamble, "\x93NUMPY", 6) != 0)
    throw std::runtime_error(path + ": not a .npy file (bad magic)");
  uint32_t header_len = 0;
  if (preamble[6] == 1) {
    in.read(reinterpret_cast<char*>(preamble + 8), 2);
    header_len = preamble[8] | (preamble[9] << 8);
  } else if (preamble[6] == 2 || preamble[6] == 3) {
    unsigned char len[4] = {};
    in.read(reinterpret_cast<char*>(len), 4);
    header_len = len[0] | (len[1] << 8) | (len[2] << 16) | (uint32_t(len[3]) << 24);
  } else {
    throw std::runtime_error(path + ": unsupported .npy version " + std::to_string(preamble[6]));
  }
  std::string header(header_len, '\0');
  in.read(header.data(), header_len);
  if (!in) throw std::runtime_error(path + ": truncated .npy header");

  NpyArray array;
  std::string descr = header_value(header, "descr", path);
  if (descr == "'<f4'") {
    array.dtype = DType::Float32;
  } else if (descr == "'<i8'") {
    array.dtype = DType::Int64;
  } else {
    throw std::runtime_error(path + ": dtype " + descr + " is not supported (float32 '<f4' or "
                             "int64 '<i8')");
  }
  if (header_value(header, "fortran_order", path) != "False")
    throw std::runtime_error(path + ": Fortran-order arrays are not supported (save C order)");
  array.shape = parse_shape(header_value(header, "shape", path), path);

  size_t want = static_cast<size_t>(element_count(array.shape)) * dtype_size(array.dtype);
  array.bytes.resize(want);
  in.read(reinterpret_cast<char*>(array.bytes.data()), static_cast<std::streamsize>(want));
  if (static_cast<size_t>(in.gcount()) != want || in.peek() != std::char_traits<char>::eof())
    throw std::runtime_error(path + ": data size does not match header shape " +
                             shape_str(array.shape) + " " + dtype_name(array.dtype));
  return array;
}

NpyArray npy_load(const std::string& path, DType dtype, const Shape& shape) {
  NpyArray array = npy_load(path);
  if (array.dtype != dtype || array.shape != shape)
    throw std::runtime_error(path + ": holds " + shape_str(array.shape) + " " +
                             dtype_name(array.dtype) + ", expected " + shape_str(shape) + " " +
                             dtype_name(dtype));
  return array;
}

void npy_save(const std::string& path, DType dtype, const Shape& shape, const void* data) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]);
  if (shape.size() == 1) dims += ",";  // a Python 1-tuple
  std::string header = std::string("{'descr': '") + (dtype == DType::Int64 ? "<i8" : "<f4") +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Pad with spaces so the data starts 64-byte aligned, as numpy does, ending in a newline.
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';

  // Written aside and renamed in, its last bytes flushed and checked: a full disk leaves the
  // old file or none, never a short one read as a result.
  const std::string part = path + ".part";
  std::ofstream out(part, std::ios::binary);
  if (!out) throw std::runtime_error(path + ": cannot create (" + std::strerror(errno) + ")");
  uint16_t len = static_cast<uint16_t>(header.size());
  const char preamble[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(preamble, 8);
  const char len_le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data),
            static_cast<std::streamsize>(element_count(shape) * dtype_size(dtype)));
  out.close();
  if (!out || std::rename(part.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(part.c_str());
    throw std::runtime_error(path + ": write failed (" + why + ")");
  }
}

// ---- dense buffers <-> ncnn::Mat -------------------------------------------------------------

Shape ncnn_shape(const Shape& shape) {
  Shape s = shape;
  if (s.size() >= 2 && s[0] == 1) s.erase(s.begin());
  if (s.empty() || s.size() > 4)
    throw std::runtime_error("shape " + shape_str(shape) + " has no ncnn::Mat form (batch 1 "
                             "and at most 4 other dimensions)");
  return s;
}

Shape mat_shape(const ncnn::Mat& m) {
  switch (m.dims) {
    case 1: return {m.w};
    case 2: return {m.h, m.w};
    case 3: return {m.c, m.h, m.w};
    case 4: return {m.c, m.d, m.h, m.w};
    default: return {};
  }
}

static void require_plain_float(const ncnn::Mat& m, const char* who) {
  if (m.empty() || m.elemsize != 4 || m.elempack != 1)
    throw std::runtime_error(std::string(who) + ": need a float32 Mat with elempack 1 (got " +
                             (m.empty() ? std::string("an empty Mat") :
                              "elemsize " + std::to_string(m.elemsize) + ", elempack " +
                              std::to_string(m.elempack)) + ")");
}

ncnn::Mat alloc_mat(const Shape& shape, ncnn::Allocator* allocator) {
  const Shape s = ncnn_shape(shape);
  const int w = checked_int(s.back(), "Mat width");
  ncnn::Mat m;
  switch (s.size()) {
    case 1: m.create(w, 4u, allocator); break;
    case 2: m.create(w, int(s[0]), 4u, allocator); break;
    case 3: m.create(w, int(s[1]), int(s[0]), 4u, allocator); break;
    default: m.create(w, int(s[2]), int(s[1]), int(s[0]), 4u, allocator); break;
  }
  if (m.empty()) throw std::runtime_error("cannot allocate a Mat of shape " + shape_str(shape));
  return m;
}

// The dense tensor `data` into a float32 Mat of its shape, channel by channel (cstep apart).
static void copy_dense(const float* data, ncnn::Mat& m) {
  const size_t plane = static_cast<size_t>(m.w) * m.h * m.d;
  for (int q = 0; q < m.c; ++q) std::memcpy(m.channel(q).data, data + q * plane, plane * 4);
}

ncnn::Mat mat_from_dense(const float* data, const Shape& shape, ncnn::Allocator* allocator) {
  ncnn::Mat m = alloc_mat(shape, allocator);
  copy_dense(data, m);
  return m;
}

bool mat_reusable(const ncnn::Mat& m, const Shape& shape) {
  return !m.empty() && mat_shape(m) == ncnn_shape(shape) && m.elemsize == 4 &&
         m.elempack == 1 && (m.refcount == nullptr || *m.refcount <= 1);
}

void dense_into_mat(const float* data, const Shape& shape, ncnn::Mat& m) {
  if (!mat_reusable(m, shape)) m = alloc_mat(shape);
  copy_dense(data, m);
}

void dense_from_mat(const ncnn::Mat& m, float* out) {
  require_plain_float(m, "dense_from_mat");
  const size_t plane = static_cast<size_t>(m.w) * m.h * m.d;
  for (int q = 0; q < m.c; ++q) std::memcpy(out + q * plane, m.channel(q).data, plane * 4);
}

MPI_Datatype mat_datatype(const ncnn::Mat& m) {
  require_plain_float(m, "mat_datatype");
  const int64_t plane = static_cast<int64_t>(m.w) * m.h * m.d;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  MPI_Type_vector(m.c, checked_int(plane, "Mat channel"),
                  checked_int(static_cast<int64_t>(m.cstep), "Mat cstep"), MPI_FLOAT, &type);
  MPI_Type_commit(&type);
  return type;
}


// ---- smaller wire formats -------------------------------------------------------------------

int64_t wire_bytes(Wire wire, int64_t elements) {
  switch (wire) {
    case Wire::Fp16: return elements * 2;
    case Wire::Int8: return 2 * 4 + elements;  // the frame's smallest value and step, then steps
    default: return elements * 4;
  }
}

const char* wire_name(Wire wire) {
  return wire == Wire::Fp16 ? "fp16" : wire == Wire::Int8 ? "int8" : "fp32";
}

// IEEE half from float, rounded to the nearest even; subnormal halves kept, overflow to inf.
static uint16_t half_from_float(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x47800000u)  // >= 65536 (rounds to inf), inf or NaN (a quiet NaN stays one)
    return sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (x < 0x38800000u) {  // below half's smallest normal, 2^-14: a subnormal half or zero
    // Adding 0.5 makes the float's unit in the last place 2^-24, the subnormal half's: the FPU
    // rounds to it (nearest even) and the low mantissa bits are the half's.
    float f;
    std::memcpy(&f, &x, 4);
    f += 0.5f;
    std::memcpy(&x, &f, 4);
    return sign | static_cast<uint16_t>(x - 0x3f000000u);
  }
  // A normal half: rebias the exponent, then round away 13 mantissa bits to nearest even (a
  // carry into the exponent is right, up to inf for 65520 and above).
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // (15 - 127) << 23, plus just under half of the dropped bits' unit
  return sign | static_cast<uint16_t>(x >> 13);
}

static float float_from_half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t x;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in a float
    const float f = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    std::memcpy(&x, &f, 4);
    x |= sign;
  } else if (exponent == 31) {
    x = sign | 0x7f800000u | (mantissa << 13);
  } else {
    x = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

#if defined(__x86_64__)
// The same conversions in the CPU's F16C instructions (8 at a time, the same roundings), where
// it has them: about 10x the portable code's rate on this machine's cores.
__attribute__((target("avx,f16c"))) static void halves_f16c(const float* in, size_t n,
                                                           uint16_t* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = half_from_float(in[i]);
}

__attribute__((target("avx,f16c"))) static void floats_f16c(const uint16_t* in, size_t n,
                                                           float* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  for (; i < n; ++i) out[i] = float_from_half(in[i]);
}

static const bool kF16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
#endif

static void to_halves(const float* in, size_t n, uint16_t* out) {
#if defined(__x86_64__)
  if (kF16c) return halves_f16c(in, n, out);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = half_from_float(in[i]);
}

static void from_halves(const uint16_t* in, size_t n, float* out) {
#if defined(__x86_64__)
  if (kF16c) return floats_f16c(in, n, out);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = float_from_half(in[i]);
}

void wire_pack(const ncnn::Mat& m, Wire wire, unsigned char* out) {
  require_plain_float(m, "wire_pack");
  const size_t plane = static_cast<size_t>(m.w) * m.h * m.d;
  if (wire == Wire::Fp32) return dense_from_mat(m, reinterpret_cast<float*>(out));
  if (wire == Wire::Fp16) {
    // uint16_t stores into bytes that may sit at any address: through memcpy, a plane at a time.
    std::vector<uint16_t> halves(plane);
    for (int q = 0; q < m.c; ++q) {
      to_halves(m.channel(q), plane, halves.data());
      std::memcpy(out + q * plane * 2, halves.data(), plane * 2);
    }
    return;
  }
  float lo = plane && m.c ? m.channel(0)[0] : 0.0f, hi = lo;
  for (int q = 0; q < m.c; ++q) {
    const float* p = m.channel(q);
    for (size_t i = 0; i < plane; ++i) {
      lo = std::min(lo, p[i]);
      hi = std::max(hi, p[i]);
    }
  }
  const float step = (hi - lo) / 255.0f, inv = step > 0 ? 1.0f / step : 0.0f;
  std::memcpy(out, &lo, 4);
  std::memcpy(out + 4, &step, 4);
  unsigned char* steps = out + 8;
  for (int q = 0; q < m.c; ++q) {
    const float* p = m.channel(q);
    for (size_t i = 0; i < plane; ++i)
      steps[q * plane + i] = static_cast<unsigned char>(
          std::min(255.0f, std::max(0.0f, std::nearbyint((p[i] - lo) * inv))));
  }
}

void wire_unpack(const unsigned char* in, Wire wire, ncnn::Mat& m) {
  require_plain_float(m, "wire_unpack");
  const size_t plane = static_cast<size_t>(m.w) * m.h * m.d;
  if (wire == Wire::Fp32) {
    for (int q = 0; q < m.c; ++q) std::memcpy(m.channel(q).data, in + q * plane * 4, plane * 4);
    return;
  }
  if (wire == Wire::Fp16) {
    std::vector<uint16_t> halves(plane);
    for (int q = 0; q < m.c; ++q) {
      std::memcpy(halves.data(), in + q * plane * 2, plane * 2);
      from_halves(halves.data(), plane, m.channel(q));
    }
    return;
  }
  float lo, step;
  std::memcpy(&lo, in, 4);
  std::memcpy(&step, in + 4, 4);
  const unsigned char* steps = in + 8;
  for (int q = 0; q < m.c; ++q) {
    float* p = m.channel(q);
    for (size_t i = 0; i < plane; ++i) p[i] = lo + static_cast<float>(steps[q * plane + i]) * step;
  }
}

}  // namespace autodice
