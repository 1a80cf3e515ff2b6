"""DeepSpeed's ``zero_to_torch`` (``python zero_to_torch.py CHECKPOINT_DIR OUTPUT_DIR --dtype bf16``); it lives in
:mod:`ds_zero._compat.zero_to_fp32`."""

from ds_zero._compat.zero_to_fp32 import torch_main as main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
