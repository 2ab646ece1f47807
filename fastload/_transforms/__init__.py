"""The parts behind ``fastload.transforms``: the declarations' base and size checks (base.py), the crop plan's
own transforms (geometric.py), the plan and its planning state (crop_plan.py), the tensor transforms run on the
device (tensor.py), ``open(transforms=...)`` checked against the schema (fields.py), the stored sizes checked at
open (size_check.py) and variable-length batching (sequences.py). The augmentation engine that executes image
transforms is ``_augment/``.
"""
