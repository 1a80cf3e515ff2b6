"""``deepspeed.checkpoint.utils``' file names beside DeepSpeed's: the model, ZeRO and layer checkpoint names for a
rank, and the constants they are made of, are DeepSpeed's strings; the ZeRO name is the file ds_zero's
``save_checkpoint`` writes (``optim_file``)."""

import pytest

pytest.importorskip("deepspeed")

import deepspeed.checkpoint.constants as ds_constants  # noqa: E402
import deepspeed.checkpoint.utils as theirs  # noqa: E402
import ds_zero.checkpoint.utils as ours  # noqa: E402
from ds_zero.checkpoint import optim_file  # noqa: E402


@pytest.mark.parametrize("folder", ["/tmp/ckpt/global_step3", "relative/tag"])
def test_checkpoint_names_are_deepspeeds(folder):
    for mp in ("00", "01", "7"):
        assert ours.get_model_ckpt_name_for_rank(folder, mp) == theirs.get_model_ckpt_name_for_rank(folder, mp)
    for dp, mp in ((0, 0), (1, 0), (3, 12)):
        got = ours.get_zero_ckpt_name_for_rank(folder, dp, mp)
        assert got == theirs.get_zero_ckpt_name_for_rank(folder, dp, mp)
        assert got.endswith(optim_file(dp, mp))
    for layer, tp in ((0, 0), ("layer_05", 1)):
        assert ours.get_layer_ckpt_name_for_rank(folder, layer, tp) == theirs.get_layer_ckpt_name_for_rank(
            folder, layer, tp)
    for name in ("MODEL_FILE_PREFIX", "MODEL_FILE_SUFFIX", "OPTIM_FILE_SUFFIX", "ZERO_FILE_PREFIX"):
        assert getattr(ours, name) == getattr(ds_constants, name)
