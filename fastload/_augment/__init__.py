"""Augmentations as a per-batch plan executed by interchangeable engines (issue 21's groundwork).

status: groundwork only. Nothing here is wired into ``fastload.open``, the loader or the native decoder yet
(that waits for the fast path's stages, issue 20, whose decoders take the plan object), and nothing is
exported from ``fastload/__init__.py``. Three engines: PIL (reference), batched torch, and native C++ kernels for
the pixel operations (``engine_native.py``, csrc/augment.cc; run over a decoded batch until the decoders call them).

One file per concern:

| file | role |
|---|---|
| ``plan.py`` | the plan (geometry + ordered columnar pixel steps), the op registry, the builder, ``plan_batch`` |
| ``color.py`` | brightness, contrast, saturation, hue, grayscale: ColorJitter, Grayscale, RandomGrayscale |
| ``tone.py`` | solarize, posterize, equalize, autocontrast, invert, sharpness and their Random* transforms |
| ``filters.py`` | gaussian blur and erasing: GaussianBlur, RandomErasing |
| ``geometry.py`` | flips and affine matrices (torchvision's inverse-affine formula): RandomHorizontalFlip, RandomVerticalFlip, RandomRotation, RandomAffine |
| ``policies.py`` | TrivialAugmentWide, RandAugment, AutoAugment (ImageNet policy), ThreeAugment (DeiT III) |
| ``combinators.py`` | RandomApply, RandomChoice, RandomOrder |
| ``engine_pil.py`` / ``engine_torch.py`` | the two engines (images; masks follow the geometry only) |
| ``engine_native.py`` | the plan's pixel steps as ``_C.augment_batch``'s arrays, run in place on NHWC uint8 |
| ``mix.py`` | batch transforms MixUp, CutMix (and a random choice of them) |

Left for the wiring (after issue 20's stages): ``fastload.open(transforms=...)`` accepting these classes
(geometric ones folded into the crop plan, the rest into ``PlanBuilder.from_crop_plan``, attached with
``fastload.transforms.Plan.with_augment``: the decoders already take that one object, ``decode(sources, plan,
out)``, and refuse ``plan.augment`` in ``decoders/_base.geometry_only`` until a decoder executes it, the native
one with C++ kernels fused on the output tile); ``ds[i]`` through ``engine_pil.run_pil(source=True)``;
the batched engine after the device copy, erasing after Normalize where torchvision's recipes put it;
MixUp/CutMix on the collated batch with the batch's generator; a ``mask`` field kind using the mask engines;
torchvision objects converted by their public attributes; RandomCrop with padding (crop boxes outside the
source); RandomErasing(value="random").
"""
