// ncnn_int8: what autodice's int8 quantizer (autodice/backend/int8.py) needs to know from ncnn
// itself about a converted fp32 sub-model.
//
//   ncnn_int8 spans MODEL.param MODEL.bin
//   ncnn_int8 stats MODEL.param MODEL.bin FRAME_DIR [FRAME_DIR ...]
//
// spans: where each layer's weights lie in the .bin file, one `INDEX TYPE NAME START END` line
// per layer (byte offsets; START == END for a layer without weights). The offsets come from
// ncnn's own load_model of every layer, read through a counting reader, so every layer type
// ncnn knows is covered with no table of weight layouts kept here.
//
// stats: the calibration statistics of the input of every Convolution, ConvolutionDepthWise and
// InnerProduct layer, over the frames (FRAME_DIR/in0.npy, in1.npy ... each), computed by the fp32
// net: one `NAME ABSMAX C0 ... C2047` line per layer, C the histogram of |x| over 2048 equal bins
// of [0, ABSMAX] (exact zeros left out: ReLU's zeros say nothing of the range to keep).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "autodice_runtime.h"
#include "datareader.h"
#include "layer.h"
#include "modelbin.h"
#include "net.h"

namespace {

constexpr int kBins = 2048;

// An in-memory .bin that counts how far the layers have read.
class CountingReader : public ncnn::DataReader {
 public:
  explicit CountingReader(std::vector<unsigned char> data) : data_(std::move(data)) {}
  size_t read(void* buf, size_t size) const override {
    size = std::min(size, data_.size() - pos_);
    std::memcpy(buf, data_.data() + pos_, size);
    pos_ += size;
    return size;
  }
  size_t reference(size_t size, const void** buf) const override {
    size = std::min(size, data_.size() - pos_);
    *buf = data_.data() + pos_;
    pos_ += size;
    return size;
  }
  size_t position() const { return pos_; }

 private:
  std::vector<unsigned char> data_;
  mutable size_t pos_ = 0;
};

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) autodice::abort_run("cannot read " + path, 4);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void fp32_options(ncnn::Net& net) {
  net.opt.use_vulkan_compute = false;
  net.opt.lightmode = false;  // every blob kept: each layer's input is extracted in turn
  autodice::compute_in_fp32(net.opt);
  net.opt.use_int8_inference = false;
}

int spans(const std::string& param, const std::string& bin) {
  ncnn::Net net;
  fp32_options(net);
  if (net.load_param(param.c_str()) != 0) autodice::abort_run("cannot load " + param, 4);
  const CountingReader reader(read_file(bin));
  const ncnn::ModelBinFromDataReader mb(reader);
  const std::vector<ncnn::Layer*>& layers = net.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const size_t start = reader.position();
    if (layers[i]->load_model(mb) != 0)
      autodice::abort_run("cannot load the weights of layer " + layers[i]->name, 4);
    std::printf("%zu %s %s %zu %zu\n", i, layers[i]->type.c_str(), layers[i]->name.c_str(), start,
                reader.position());
  }
  return 0;
}

bool calibrated(const ncnn::Layer* layer) {
  return (layer->type == "Convolution" || layer->type == "ConvolutionDepthWise" ||
          layer->type == "InnerProduct") &&
         layer->bottoms.size() == 1;  // a second bottom is a dynamic weight: not quantized
}

// Every calibrated layer's input for one frame, as dense floats, in layer order.
std::vector<std::vector<float>> inputs_of(ncnn::Net& net, const std::string& frame_dir,
                                          const std::vector<const ncnn::Layer*>& layers) {
  ncnn::Extractor ex = net.create_extractor();
  for (size_t k = 0; k < net.input_names().size(); ++k) {
    const std::string name = "in" + std::to_string(k);  // pnnx's names, as ncnn_check feeds them
    try {
      const autodice::NpyArray a = autodice::npy_load(frame_dir + "/" + name + ".npy");
      ex.input(name.c_str(), autodice::mat_from_dense(a.f32(), a.shape));
    } catch (const std::exception& e) {
      autodice::abort_run(e.what(), 2);
    }
  }
  std::vector<std::vector<float>> out;
  for (const ncnn::Layer* layer : layers) {
    const char* blob = net.blobs()[layer->bottoms[0]].name.c_str();
    ncnn::Mat m;
    if (ex.extract(blob, m) != 0) autodice::abort_run(std::string("extracting ") + blob, 5);
    out.emplace_back(static_cast<size_t>(m.w) * m.h * m.d * m.c);
    autodice::dense_from_mat(m, out.back().data());
  }
  return out;
}

int stats(const std::string& param, const std::string& bin, const std::vector<std::string>& frames) {
  ncnn::Net net;
  fp32_options(net);
  if (net.load_param(param.c_str()) != 0 || net.load_model(bin.c_str()) != 0)
    autodice::abort_run("cannot load " + param, 4);
  std::vector<const ncnn::Layer*> layers;
  for (const ncnn::Layer* layer : net.layers())
    if (calibrated(layer)) layers.push_back(layer);
  std::vector<float> absmax(layers.size(), 0.f);
  for (const std::string& frame : frames) {
    const auto values = inputs_of(net, frame, layers);
    for (size_t i = 0; i < layers.size(); ++i)
      for (float v : values[i]) absmax[i] = std::max(absmax[i], std::fabs(v));
  }
  std::vector<std::vector<double>> hist(layers.size(), std::vector<double>(kBins, 0.0));
  for (const std::string& frame : frames) {
    const auto values = inputs_of(net, frame, layers);
    for (size_t i = 0; i < layers.size(); ++i) {
      if (absmax[i] == 0.f) continue;
      const float per_bin = kBins / absmax[i];
      for (float v : values[i]) {
        if (v == 0.f) continue;
        hist[i][std::min(kBins - 1, static_cast<int>(std::fabs(v) * per_bin))] += 1.0;
      }
    }
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    std::printf("%s %.9g", layers[i]->name.c_str(), absmax[i]);
    for (double c : hist[i]) std::printf(" %.0f", c);
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "spans" && argc == 4) return spans(argv[2], argv[3]);
  if (what == "stats" && argc >= 5)
    return stats(argv[2], argv[3], std::vector<std::string>(argv + 4, argv + argc));
  std::fprintf(stderr,
               "usage: ncnn_int8 spans MODEL.param MODEL.bin\n"
               "       ncnn_int8 stats MODEL.param MODEL.bin FRAME_DIR [FRAME_DIR ...]\n");
  return 2;
}
