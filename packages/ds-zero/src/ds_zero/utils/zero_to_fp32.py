"""DeepSpeed's ``zero_to_fp32`` (``python -m ds_zero.utils.zero_to_fp32``, the ``ds-zero-to-fp32`` command); it
lives in :mod:`ds_zero._compat.zero_to_fp32`."""

from ds_zero._compat.zero_to_fp32 import (
    OUTPUT_DTYPE_NAMES,
    convert_zero_checkpoint_to_fp32_state_dict,
    convert_zero_checkpoint_to_state_dict,
    get_fp32_state_dict_from_zero_checkpoint,
    load_state_dict_from_zero_checkpoint,
    main,
)

__all__ = ["OUTPUT_DTYPE_NAMES", "convert_zero_checkpoint_to_fp32_state_dict", "convert_zero_checkpoint_to_state_dict",
           "get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
