"""Augmentations as a per-batch plan executed by interchangeable engines (issue 21).

status: wired into the fast path, on CPU threads and on the GPU decoders. ``fastload.open(transforms=...)``
takes these transforms after the crops (``pipeline.py``; exported from ``fastload.transforms`` under torchvision
v2's names, not from ``fastload/__init__.py``); each batch's plan is drawn from its samples' draws after the crop
plan and attached with ``Plan.with_augment``; the native decoder executes it fused with decoding (each pool thread
decodes a sample, crops/resizes/flips it, then runs its padded-window assembly, vertical flip, affine warp and
pixel operations on the tile, GIL released: csrc/augment_plan.cc, warp.cc, augment.cc); ``ds[i]`` runs the PIL
reference engine on its natively decoded tile. ``RandomCrop`` with padding (``random_crop.py``, ``padding.py``) and
``RandomErasing(value="random")`` run in all three engines.

One file per concern:

- ``plan.py``: the plan (geometry + ordered columnar pixel steps), the op registry, the builder, ``plan_batch``
- ``ops.py``: the one list of the modules that define pixel operations: the registry complete, as the engines read it
- ``color.py``: brightness, contrast, saturation, hue, grayscale: ColorJitter, Grayscale, RandomGrayscale
- ``tone.py``: solarize, posterize, equalize, autocontrast, invert, sharpness and their Random* transforms
- ``filters.py``: gaussian blur and erasing: GaussianBlur, RandomErasing
- ``pil_enhance.py``: PIL's ImageEnhance Color / Contrast byte for byte (the installed PIL's luma): timm's ops
- ``geometry.py``: flips and affine matrices (torchvision's inverse-affine formula): RandomHorizontalFlip,
  RandomVerticalFlip, RandomRotation, RandomAffine
- ``policies.py``: TrivialAugmentWide, RandAugment, AutoAugment (ImageNet policy), ThreeAugment (DeiT III)
- ``combinators.py``: RandomApply, RandomChoice, RandomOrder
- ``engine_pil.py`` / ``engine_torch.py``: the two engines (images; masks follow the geometry only)
- ``engine_native.py``: the plan as the native arrays (``_C.decode_augment_batch`` in the decoder, ``_C.augment_tiles``
  on tiles); operation ids by name from ``_C.AUGMENT_OPS``, checked against ``ops.py`` at import
- ``masks.py``: a mask field moved with its image's plan: the PIL reference (``ds[i]``) and the native batch call
  (csrc/mask.cc), handed to ``fields/mask.py``
- ``pipeline.py``: the augmentations in ``fastload.open(transforms=...)``: split from the crops, planned per batch,
  ``ds[i]``'s reference
- ``random_crop.py`` / ``padding.py``: RandomCrop (a crop-plan transform) and its padded windows: index maps, assembly
- ``random_resize.py`` / ``pad_if_smaller.py``: RandomResize and PadIfSmaller (torchvision's segmentation preset;
  crop-plan transforms)
- ``type_fill.py``: a fill per kind (``{"image": 0, "mask": 255}``) for RandomCrop, PadIfSmaller, RandomRotation,
  RandomAffine
- ``mix.py``: batch transforms MixUp, CutMix (and a random choice of them)
- ``fallback.py`` / ``fallback_workers.py``: transforms fastload does not know, run per sample on the decoded rows (in
  forked workers over shared-memory staging rows, or in the calling thread)
- ``torchvision_convert.py``: torchvision transform objects rebuilt as fastload's from their public attributes
- ``timm_convert.py``: timm transform objects rebuilt the same way (its AugMix, ``3a`` policy and erasing with
  noise run per sample)
- ``timm_policies.py``: timm's RandAugment / AutoAugment as plans: its op set (``solarize_add``, relative
  translations, increasing variants), magnitude rules and draws, bilinear/bicubic/random resampling
- ``timm_mix.py``: timm's ``Mixup`` / ``FastCollateMixup`` run as timm's own object on the loader's normalized
  batch (no exact native equivalent)

Not wired: ``Grayscale(num_output_channels=1)`` in a loader (rows are RGB). The batched torch engine runs on the
GPU decoders' rows (``decoders/_staging.py`` ``augment_queued``); MixUp/CutMix on the collated batch (the Collate
stage, fused into the CPU Normalize pass, or after the device copy); masks follow their image's plan
(``masks.py``, natively in ``csrc/mask.cc``).
"""
