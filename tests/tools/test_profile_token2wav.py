"""scripts/profile_token2wav.py on the tiny token2wav (CPU): every slot count gets its solve and vocoder times and the
operator tables of one DiT evaluation and one vocoder call, and the report and JSON carry them."""

from __future__ import annotations

import json

import pytest

from conftest import load_script

pytestmark = pytest.mark.slow


def test_the_tiny_profile_reports_every_slot_count(tmp_path, capsys):
    profile = load_script("profile_token2wav")
    out = tmp_path / "profile.json"
    profile.main(["--tiny", "--device", "cpu", "--slots", "1,2", "--repeats", "1", "--top", "3", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert [r["slots"] for r in results] == [1, 2]
    for r in results:
        assert r["first_window"] < r["steady_window"]
        assert all(r[k] > 0 for k in ("first_solve_ms", "steady_solve_ms", "first_vocoder_ms", "steady_vocoder_ms"))
        for part in ("evaluation", "vocoder"):
            table = r[part]
            assert table["kernels"] > 0 and len(table["top"]) == 3
            assert sum(k["us"] for k in table["top"]) <= table["total_us"] + 1e-6
    report = capsys.readouterr().out
    assert "| slots |" in report and "evaluation, 2 slots" in report and "vocoder, 1 slots" in report


def test_inductor_settings_are_typed_and_unknown_names_refused():
    import pytest

    profile = load_script("profile_token2wav")
    settings = profile.inductor_settings(
        [
            "max_autotune=1",
            "coordinate_descent_tuning=false",
            "max_autotune_gemm_backends=TRITON",
            "unroll_reductions_threshold=4",
        ]
    )
    assert settings == {
        "max_autotune": True,
        "coordinate_descent_tuning": False,
        "max_autotune_gemm_backends": "TRITON",
        "unroll_reductions_threshold": 4,
    }
    for bad in ("no_such_setting=1", "max_autotune"):
        with pytest.raises(SystemExit, match="expected NAME=VALUE"):
            profile.inductor_settings([bad])
    for bad in ("max_autotune=maybe", "unroll_reductions_threshold=x"):
        with pytest.raises(SystemExit, match="is a (bool|int)"):
            profile.inductor_settings([bad])
