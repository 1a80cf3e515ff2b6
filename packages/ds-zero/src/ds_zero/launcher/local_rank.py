"""The per-rank step that passes ``--local_rank=N`` (``python -m ds_zero.launcher.local_rank``); it lives in
:mod:`ds_zero._compat.launcher.local_rank`."""

from ds_zero._compat.launcher.local_rank import FLAGS, main, script_argv, split_argv

__all__ = ["FLAGS", "main", "script_argv", "split_argv"]

if __name__ == "__main__":
    main()
