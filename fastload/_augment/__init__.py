"""Augmentations as a per-batch plan executed by interchangeable engines (issue 21's groundwork).

status: groundwork only. Nothing here is wired into ``fastload.open``, the loader or the native decoder yet
(that waits for the fast path's stages, issue 20, whose decoders take the plan object), and nothing is
exported from ``fastload/__init__.py``. No C++ engine yet: the two engines are PIL (reference) and batched torch.

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
| ``mix.py`` | batch transforms MixUp, CutMix (and a random choice of them) |
"""
