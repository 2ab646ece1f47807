// AugPlan (augment.h): a batch's augmentation checked and arranged per tile; and the fused path,
// decode_augment_batch (augment_decode.h): each pool thread decodes, crops, resizes and flips a
// sample into its row and runs that sample's augmentation on it right away, while the tile is
// still in the core's cache (no second pass over the batch).
#include <algorithm>
#include <cstring>
#include <string>

#include "augment.h"
#include "augment_decode.h"

namespace fastload {

bool AugPlan::prepare(const AugBatchSpec& b, std::string* err) {
  if (b.n < 0 || b.h < 1 || b.w < 1 || b.num_steps < 0 || b.num_rows < 0) {
    *err = "bad batch shape: n=" + std::to_string(b.n) + ", h=" + std::to_string(b.h) + ", w=" + std::to_string(b.w);
    return false;
  }
  if (b.offset[0] != 0 || b.offset[b.num_steps] != b.num_rows) {
    *err = "offset should run from 0 to the number of rows " + std::to_string(b.num_rows) + ", got " +
           std::to_string(b.offset[0]) + " to " + std::to_string(b.offset[b.num_steps]);
    return false;
  }
  h_ = b.h;
  w_ = b.w;
  // Every step and row checked before any pixel is written; rows gathered per sample in step order.
  count_.assign(static_cast<size_t>(b.n) + 1, 0);
  std::vector<AugOpParams> rows(static_cast<size_t>(b.num_rows));
  for (int64_t s = 0; s < b.num_steps; ++s) {
    const std::string where = "step " + std::to_string(s);
    if (b.op[s] < 0 || b.op[s] >= kAugNumOps) {
      *err = where + ": operation id " + std::to_string(b.op[s]) + " is outside [0, " +
             std::to_string(kAugNumOps - 1) + "]";
      return false;
    }
    if (b.offset[s + 1] < b.offset[s]) {
      *err = "offset should not decrease, but offset[" + std::to_string(s + 1) + "] = " +
             std::to_string(b.offset[s + 1]) + " < offset[" + std::to_string(s) + "] = " + std::to_string(b.offset[s]);
      return false;
    }
    for (int64_t j = b.offset[s]; j < b.offset[s + 1]; ++j) {
      const int64_t i = b.sample[j];
      if (i < 0 || i >= b.n) {
        *err = where + " (" + aug_op_name(b.op[s]) + "), row " + std::to_string(j) + ": sample " + std::to_string(i) +
               " is outside the batch of " + std::to_string(b.n) + " tiles";
        return false;
      }
      AugOpParams& p = rows[static_cast<size_t>(j)];
      p.op = static_cast<int32_t>(b.op[s]);
      std::copy(b.fparam + j * kAugParams, b.fparam + (j + 1) * kAugParams, p.f);
      std::copy(b.iparam + j * kAugParams, b.iparam + (j + 1) * kAugParams, p.i);
      if (!check_aug_op(p, b.h, b.w, err)) {
        *err = where + " (" + aug_op_name(b.op[s]) + "), row " + std::to_string(j) + ", sample " +
               std::to_string(i) + ": " + *err;
        return false;
      }
      ++count_[static_cast<size_t>(i) + 1];
    }
  }
  for (int64_t i = 0; i < b.n; ++i) count_[i + 1] += count_[i];
  by_sample_.assign(rows.size(), AugOpParams());
  std::vector<int64_t> next(count_.begin(), count_.end() - 1);
  for (int64_t j = 0; j < b.num_rows; ++j) by_sample_[static_cast<size_t>(next[b.sample[j]]++)] = rows[j];

  geometry_.clear();
  if (b.vflip != nullptr) {
    geometry_.resize(static_cast<size_t>(b.n));
    for (int64_t i = 0; i < b.n; ++i) {
      AugGeometry& g = geometry_[static_cast<size_t>(i)];
      g.vflip = b.vflip[i] != 0;
      g.affine = b.has_affine[i] != 0;
      g.interpolation = b.interpolation[i];
      std::copy(b.affine + 6 * i, b.affine + 6 * (i + 1), g.m);
      std::copy(b.fill + 3 * i, b.fill + 3 * (i + 1), g.fill);
      if (!check_geometry(g, err)) {
        *err = "sample " + std::to_string(i) + "'s geometry: " + *err;
        return false;
      }
    }
  }
  pad_ = nullptr;
  if (b.pad_active != nullptr) {
    for (int64_t i = 0; i < b.n; ++i) {
      if (!b.pad_active[i]) continue;
      const std::string where = "sample " + std::to_string(i) + "'s padded crop: ";
      const int32_t ph = b.pad_hw[2 * i], pw = b.pad_hw[2 * i + 1];
      if (ph < 1 || pw < 1 || ph > b.h || pw > b.w) {
        *err = where + "decoded box " + std::to_string(ph) + "x" + std::to_string(pw) + " should be within 1x1 .. " +
               std::to_string(b.h) + "x" + std::to_string(b.w) + " (the tile)";
        return false;
      }
      for (int a = 0; a < 2; ++a) {
        const int32_t* idx = a == 0 ? b.pad_rows + i * b.h : b.pad_cols + i * b.w;
        const int len = a == 0 ? b.h : b.w, limit = a == 0 ? ph : pw;
        for (int k = 0; k < len; ++k) {
          if (idx[k] < -1 || idx[k] >= limit) {
            *err = where + (a == 0 ? "row " : "column ") + std::to_string(k) + " maps to " + std::to_string(idx[k]) +
                   ", outside [-1, " + std::to_string(limit) + ")";
            return false;
          }
        }
      }
      for (int c = 0; c < 3; ++c) {
        if (!(b.pad_fill[3 * i + c] >= 0.0 && b.pad_fill[3 * i + c] <= 255.0)) {
          *err = where + "fill " + std::to_string(b.pad_fill[3 * i + c]) + " is outside [0, 255]";
          return false;
        }
      }
    }
    pad_ = &b;
  }
  return true;
}

// A padded window's tile from its decoded box at the tile's start (see AugBatchSpec).
static void assemble(const AugBatchSpec& b, int64_t i, uint8_t* tile, ptrdiff_t stride, std::vector<uint8_t>* copy) {
  const int ph = b.pad_hw[2 * i], pw = b.pad_hw[2 * i + 1];
  const size_t box_row = static_cast<size_t>(pw) * 3;
  if (copy->size() < box_row * ph) copy->resize(box_row * ph);
  std::memcpy(copy->data(), tile, box_row * ph);  // the box's rows are contiguous (decoded at pw x 3 a row)
  const int32_t* rows = b.pad_rows + i * b.h;
  const int32_t* cols = b.pad_cols + i * b.w;
  const bool flip = b.hflip[i] != 0;
  uint8_t fill[3];
  for (int c = 0; c < 3; ++c) fill[c] = static_cast<uint8_t>(b.pad_fill[3 * i + c]);
  for (int y = 0; y < b.h; ++y) {
    uint8_t* out = tile + y * stride;
    const uint8_t* in = rows[y] >= 0 ? copy->data() + rows[y] * box_row : nullptr;
    for (int x = 0; x < b.w; ++x) {
      const int32_t c = cols[flip ? b.w - 1 - x : x];
      const uint8_t* px = in != nullptr && c >= 0 ? in + 3 * c : fill;
      out[3 * x] = px[0];
      out[3 * x + 1] = px[1];
      out[3 * x + 2] = px[2];
    }
  }
}

void AugPlan::run(int64_t i, uint8_t* tile, ptrdiff_t stride, AugScratch* scratch) const {
  if (pad_ != nullptr && pad_->pad_active[i]) assemble(*pad_, i, tile, stride, &scratch->warp);
  if (!geometry_.empty()) apply_geometry(tile, h_, w_, stride, geometry_[static_cast<size_t>(i)], &scratch->warp);
  const int64_t first = count_[i], n_ops = count_[i + 1] - first;
  if (n_ops == 0) return;
  std::string unused;  // every operation was checked in prepare()
  apply_ops(tile, h_, w_, stride, by_sample_.data() + first, n_ops, scratch, &unused);
}

bool decode_augment_batch(BatchEngine* engine, const BatchSpec& spec, const AugBatchSpec& aug,
                          std::vector<Failure>* failures, std::string* err) {
  if (aug.n != spec.n || aug.h != spec.out_h || aug.w != spec.out_w) {
    *err = "the augmentation is for " + std::to_string(aug.n) + " tiles of " + std::to_string(aug.h) + "x" +
           std::to_string(aug.w) + " but the batch has " + std::to_string(spec.n) + " of " +
           std::to_string(spec.out_h) + "x" + std::to_string(spec.out_w);
    return false;
  }
  AugBatchSpec a = aug;
  a.hflip = spec.flip;
  AugPlan plan;
  if (!plan.prepare(a, err)) return false;
  BatchSpec s = spec;
  std::vector<int32_t> decode_hw;  // a padded window decodes its box at its own size, unflipped
  if (a.pad_active != nullptr) {
    decode_hw.assign(static_cast<size_t>(2 * spec.n), 0);
    for (int64_t i = 0; i < spec.n; ++i) {
      if (a.pad_active[i]) std::copy(a.pad_hw + 2 * i, a.pad_hw + 2 * i + 2, decode_hw.begin() + 2 * i);
    }
    s.decode_hw = decode_hw.data();
  }
  std::vector<AugScratch> scratch(static_cast<size_t>(engine->pool().num_slots()));
  const ptrdiff_t stride = static_cast<ptrdiff_t>(spec.out_w) * 3;
  *failures = engine->run(s, [&](int64_t k, int worker, uint8_t* tile) {
    plan.run(k, tile, stride, &scratch[static_cast<size_t>(worker)]);
  });
  return true;
}

}  // namespace fastload
