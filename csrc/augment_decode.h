// The fused native path of an augmented batch: decode -> crop/resize/flip -> the plan's geometry
// and pixel operations, per sample on one pool thread (see augment_plan.cc).
#pragma once

#include <string>
#include <vector>

#include "augment.h"
#include "batch.h"

namespace fastload {

// Checks the augmentation (aug.images unused; aug.n/h/w must be the batch's), then fills spec.out as
// BatchEngine::run does, each written sample augmented right away by the thread that wrote it.
// Failed samples are zeroed and listed in *failures (not augmented). False with a message, nothing
// written, if the augmentation is bad.
bool decode_augment_batch(BatchEngine* engine, const BatchSpec& spec, const AugBatchSpec& aug,
                          std::vector<Failure>* failures, std::string* err);

}  // namespace fastload
