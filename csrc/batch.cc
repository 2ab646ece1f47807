#include "batch.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

namespace fastload {
namespace {

std::string str(int64_t v) { return std::to_string(v); }

bool check_crop(const SampleJob& j, int img_h, int img_w, std::string* err) {
  const int64_t bottom = int64_t{j.top} + j.height;
  const int64_t right = int64_t{j.left} + j.width;
  if (j.top < 0 || j.left < 0 || j.height <= 0 || j.width <= 0 || bottom > img_h ||
      right > img_w) {
    *err = "crop (top=" + str(j.top) + ", left=" + str(j.left) + ", height=" + str(j.height) +
           ", width=" + str(j.width) + ") is not inside the " + str(img_h) + "x" + str(img_w) +
           " image";
    return false;
  }
  if (j.resize_h != 0 &&
      (j.resize_h < 0 || j.resize_w <= 0 || j.frame_y < 0 || j.frame_x < 0 ||
       int64_t{j.frame_y} + j.out_h > j.resize_h || int64_t{j.frame_x} + j.out_w > j.resize_w)) {
    *err = "frame: the " + str(j.out_h) + "x" + str(j.out_w) + " window at (" + str(j.frame_y) + ", " +
           str(j.frame_x) + ") is not inside the box's " + str(j.resize_h) + "x" + str(j.resize_w) + " resize";
    return false;
  }
  return true;
}

// The size the box is resized to: the frame's whole resize, else the output.
int resized_h(const SampleJob& j) { return j.resize_h ? j.resize_h : j.out_h; }
int resized_w(const SampleJob& j) { return j.resize_h ? j.resize_w : j.out_w; }

// Plans both axes for the crop box scaled by 1/denom inside a scaled_h x scaled_w image.
bool plan(const SampleJob& j, int denom, int scaled_h, int scaled_w, ResizeScratch* s,
          std::string* err) {
  const double d = denom;
  const int y_lo = j.top / denom;
  const int x_lo = j.left / denom;
  const int64_t bottom = int64_t{j.top} + j.height;
  const int64_t right = int64_t{j.left} + j.width;
  const int y_hi = static_cast<int>(std::min<int64_t>(scaled_h, (bottom + denom - 1) / denom));
  const int x_hi = static_cast<int>(std::min<int64_t>(scaled_w, (right + denom - 1) / denom));
  return plan_axis(j.left / d, right / d, x_lo, x_hi, j.out_w, &s->x, err, j.interpolation, j.frame_x,
                   resized_w(j)) &&
         plan_axis(j.top / d, bottom / d, y_lo, y_hi, j.out_h, &s->y, err, j.interpolation, j.frame_y,
                   resized_h(j));
}

bool process_raw(Worker* w, const SampleJob& j, std::string* err) {
  if (j.src_h <= 0 || j.src_w <= 0) {
    *err = "raw image size must be positive, got " + str(j.src_h) + "x" + str(j.src_w);
    return false;
  }
  const int64_t expect = int64_t{j.src_h} * j.src_w * 3;
  if (static_cast<uint64_t>(expect) != j.size) {
    *err = "raw RGB sample has " + str(static_cast<int64_t>(j.size)) + " bytes, expected " +
           str(j.src_h) + "*" + str(j.src_w) + "*3 = " + str(expect);
    return false;
  }
  if (!check_crop(j, j.src_h, j.src_w, err)) return false;
  if (!plan(j, 1, j.src_h, j.src_w, &w->resize, err)) return false;
  const SourceView src{j.data, static_cast<ptrdiff_t>(j.src_w) * 3, 0, 0, j.data + j.size};
  resample(src, j.flip, j.out, static_cast<ptrdiff_t>(j.out_w) * 3, &w->resize);
  return true;
}

bool process_jpeg(Worker* w, const SampleJob& j, std::string* err) {
  JpegHeader hdr;
  if (!w->jpeg.open(j.data, j.size, &hdr, err)) return false;
  const bool known = j.src_h != 0 || j.src_w != 0;
  if (known && (hdr.height != j.src_h || hdr.width != j.src_w)) {
    w->jpeg.close();
    *err = "JPEG is " + str(hdr.height) + "x" + str(hdr.width) + " but the recorded size is " +
           str(j.src_h) + "x" + str(j.src_w);
    return false;
  }
  if (!check_crop(j, hdr.height, hdr.width, err)) {
    w->jpeg.close();
    return false;
  }
  const int denom =
      j.dct_scaling ? choose_dct_denom(j.height, j.width, resized_h(j), resized_w(j), hdr.max_denom) : 1;
  const int sh = scaled_dim(hdr.height, denom);
  const int sw = scaled_dim(hdr.width, denom);
  ResizeScratch* rs = &w->resize;
  if (!plan(j, denom, sh, sw, rs, err)) {
    w->jpeg.close();
    return false;
  }
  DecodedWindow win;
  if (!w->jpeg.decode_window(denom, rs->x.first, rs->y.first, rs->x.last, rs->y.last, &win,
                             err)) {
    return false;
  }
  if (win.x0 > rs->x.first || win.x0 + win.width < rs->x.last || win.y0 > rs->y.first ||
      win.y0 + win.height < rs->y.last) {
    *err = "internal error: decoded window does not cover the crop";
    return false;
  }
  const SourceView src{win.data, win.stride, win.x0, win.y0, win.data + win.stride * win.height};
  resample(src, j.flip, j.out, static_cast<ptrdiff_t>(j.out_w) * 3, rs);
  return true;
}

// Resolves sample k of a batch to a SampleJob, checking every index and bound first.
bool make_job(const BatchSpec& b, int64_t k, SampleJob* j, std::string* err) {
  const int64_t r = b.region[k], off = b.offset[k], len = b.length[k];
  if (r < 0 || r >= b.num_regions) {
    *err = "region index " + str(r) + " out of range [0, " + str(b.num_regions) + ")";
    return false;
  }
  const int64_t size = b.regions[r].size;
  if (off < 0 || len < 0 || off > size || len > size - off) {
    *err = "byte range offset=" + str(off) + " length=" + str(len) + " is outside region " +
           str(r) + " of " + str(size) + " bytes";
    return false;
  }
  const int enc = b.encoding[k];
  if (enc != kEncodingJpeg && enc != kEncodingRawRgb) {
    *err = "unknown encoding " + str(enc) + " (expected 0 = JPEG or 1 = raw RGB)";
    return false;
  }
  j->data = b.regions[r].data + off;
  j->size = static_cast<size_t>(len);
  j->encoding = enc;
  j->src_h = b.src_hw[2 * k];
  j->src_w = b.src_hw[2 * k + 1];
  if (j->src_h <= 0 || j->src_w <= 0) {
    *err = "recorded source size must be positive, got " + str(j->src_h) + "x" + str(j->src_w);
    return false;
  }
  if (b.frames != nullptr) {
    const int32_t* f = b.frames + 8 * k;
    j->top = f[0];
    j->left = f[1];
    j->height = f[2];
    j->width = f[3];
    j->resize_h = f[4];
    j->resize_w = f[5];
    j->frame_y = f[6];
    j->frame_x = f[7];
    if (j->resize_h <= 0) {
      *err = "frame: resize size must be positive, got " + str(f[4]) + "x" + str(f[5]);
      return false;
    }
  } else {
    j->top = b.crop[4 * k];
    j->left = b.crop[4 * k + 1];
    j->height = b.crop[4 * k + 2];
    j->width = b.crop[4 * k + 3];
  }
  j->flip = b.flip[k] != 0;
  j->interpolation = b.interpolation == nullptr ? kResizeBilinear : b.interpolation[k];
  j->out_h = b.out_h;
  j->out_w = b.out_w;
  j->dct_scaling = b.dct_scaling;
  j->out = b.out + k * (int64_t{b.out_h} * b.out_w * 3);
  return true;
}

}  // namespace

int choose_dct_denom(int crop_h, int crop_w, int out_h, int out_w, int max_denom) {
  for (int d = max_denom; d >= 2; d /= 2) {
    if (int64_t{crop_h} >= int64_t{d} * out_h && int64_t{crop_w} >= int64_t{d} * out_w) return d;
  }
  return 1;
}

bool process_sample(Worker* w, const SampleJob& job, std::string* err) {
  if (job.out_h <= 0 || job.out_w <= 0) {
    *err = "output size must be positive, got " + str(job.out_h) + "x" + str(job.out_w);
    return false;
  }
  try {
    bool ok = false;
    if (job.encoding == kEncodingRawRgb) {
      ok = process_raw(w, job, err);
    } else if (job.encoding == kEncodingJpeg) {
      ok = process_jpeg(w, job, err);
    } else {
      *err = "unknown encoding " + str(job.encoding);
    }
    w->jpeg.shrink_to(kKeepScratchBytes);
    w->resize.rows.shrink_to(kKeepScratchBytes);
    return ok;
  } catch (const std::bad_alloc&) {
    w->jpeg.close();
    *err = "out of memory";
    return false;
  } catch (const std::exception& e) {
    w->jpeg.close();
    *err = e.what();
    return false;
  }
}

BatchEngine::BatchEngine(int num_threads) : pool_(num_threads) {
  workers_.reserve(pool_.num_slots());
  for (int i = 0; i < pool_.num_slots(); ++i) workers_.emplace_back(new Worker);
}

void BatchEngine::set_copy_helpers(int n) {
  if (n < 0) throw std::invalid_argument("copy_helpers must be >= 0, got " + std::to_string(n));
  std::lock_guard<std::mutex> lock(helpers_mu_);
  if (n != copy_helpers_) helpers_.reset();  // the old helpers end once no copy holds them
  copy_helpers_ = n;
}

int BatchEngine::copy_helpers_started() {
  std::lock_guard<std::mutex> lock(helpers_mu_);
  return helpers_ ? helpers_->size() : 0;
}

std::shared_ptr<ThreadPool> BatchEngine::copy_pool(int64_t bytes, int64_t from) {
  if (pool_.size() > 0 || bytes < from) return nullptr;
  std::lock_guard<std::mutex> lock(helpers_mu_);
  if (copy_helpers_ == 0) return nullptr;
  if (!helpers_) helpers_ = std::make_shared<ThreadPool>(copy_helpers_);
  return helpers_;
}

std::vector<Failure> BatchEngine::run(const BatchSpec& b) {
  // Messages are only filled for failures; empty strings do not allocate.
  std::vector<std::string> errors(static_cast<size_t>(b.n));
  std::vector<uint8_t> failed(static_cast<size_t>(b.n), 0);
  const size_t sample_bytes = static_cast<size_t>(b.out_h) * b.out_w * 3;
  pool_.run(b.n, [&](int64_t k, int worker) {
    SampleJob job;
    std::string* err = &errors[k];
    bool ok = make_job(b, k, &job, err) && process_sample(workers_[worker].get(), job, err);
    if (!ok) {
      failed[k] = 1;
      std::memset(b.out + k * sample_bytes, 0, sample_bytes);
    }
  });
  std::vector<Failure> out;
  for (int64_t k = 0; k < b.n; ++k) {
    if (failed[k]) out.push_back(Failure{k, std::move(errors[k])});
  }
  return out;
}

std::vector<Failure> BatchEngine::run(const BatchSpec& b, const AfterSample& then) {
  std::vector<std::string> errors(static_cast<size_t>(b.n));
  std::vector<uint8_t> failed(static_cast<size_t>(b.n), 0);
  const size_t sample_bytes = static_cast<size_t>(b.out_h) * b.out_w * 3;
  pool_.run(b.n, [&](int64_t k, int worker) {
    SampleJob job;
    std::string* err = &errors[k];
    bool ok = make_job(b, k, &job, err);
    if (ok && b.decode_hw != nullptr && b.decode_hw[2 * k] != 0) {
      if (job.resize_h != 0) {
        *err = "a frame (Plan.frames) cannot be decoded into a padded window";
        ok = false;
      }
      job.out_h = b.decode_hw[2 * k];
      job.out_w = b.decode_hw[2 * k + 1];
      job.flip = false;
    }
    ok = ok && process_sample(workers_[worker].get(), job, err);
    if (!ok) {
      failed[k] = 1;
      std::memset(b.out + k * sample_bytes, 0, sample_bytes);
    } else {
      then(k, worker, b.out + k * sample_bytes);
    }
  });
  std::vector<Failure> out;
  for (int64_t k = 0; k < b.n; ++k) {
    if (failed[k]) out.push_back(Failure{k, std::move(errors[k])});
  }
  return out;
}

}  // namespace fastload
