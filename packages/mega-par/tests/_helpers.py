"""Shared helpers for mega-par's multi-rank tests."""

import traceback


def run_cases(cases: dict) -> dict:
    """Run named zero-arg callables inside a rank; record (ok, message) per case instead of dying on the first."""
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            out[name] = (True, "")
        except Exception:  # noqa: BLE001 - reported per case to the test process
            out[name] = (False, traceback.format_exc())
    return out


def assert_case(results: list, name: str) -> None:
    """results: per-rank dicts from run_cases; fail naming each rank whose case failed."""
    assert all(name in r for r in results), f"case {name} did not run on every rank"
    bad = {rank: r[name][1] for rank, r in enumerate(results) if not r[name][0]}
    assert not bad, "\n".join(f"rank {k}:\n{v}" for k, v in bad.items())
