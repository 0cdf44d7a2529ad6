"""scripts/vision_cost.py on the tiny model on the CPU: the encode table (one row per size and number of users, the
video positions a second of each size), the prefill table, and the call context estimate under the video budget."""

from __future__ import annotations

from conftest import load_script
from pipeline.models.qwen2_5_omni.tiny import Qwen25OmniRandomModelSpec
from realtime.media.video_settings import DEFAULT_CAMERA


def test_the_tiny_tower_is_timed_at_each_size_and_batch(capsys):
    script = load_script("vision_cost")
    argv = ["--users", "1,2", "--warmup", "1", "--iterations", "2", "--prefill", "--prefill-context", "32"]
    assert script.main([*argv, "--call-minutes", "1"]) == 0
    out = capsys.readouterr().out
    spec = Qwen25OmniRandomModelSpec.tiny()
    _, preprocessor = script.build_tower("tiny", script.torch.device("cpu"))
    info = preprocessor.info
    assert (info.max_pixels, info.fps) == (spec.image_max_pixels, 2.0)
    camera = DEFAULT_CAMERA.frame_size(info, 480, 640)
    square = info.resized(448, 448)
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    encode = [r for r in rows if len(r) == 8]
    assert [(r[0], int(r[2])) for r in encode] == [
        (f"| {h}x{w}", users) for h, w in (camera, square) for users in (1, 2)
    ]
    for row, (h, w) in zip(encode[::2], (camera, square), strict=True):
        # one frame pair a second at 2 fps: (h/28)*(w/28) positions
        assert int(row[1]) == (h // 28) * (w // 28) == info.tokens(h, w)
        assert float(row[3]) > 0 and row[6].endswith("%")
    prefill = [r for r in rows if len(r) == 4]
    assert [int(r[1]) for r in prefill] == [info.tokens(*camera), info.tokens(*square)]
    context = [r for r in rows if len(r) == 6]
    assert len(context) == 2 and ("assumed" in out or "stage config's" in out)
    turns, plain, unbounded, bounded = (int(v.strip(" |")) for v in context[0][2:])
    assert turns == 4 and plain == 4 * (25 * 5 + 30)  # 1 minute of 5 s speech + 8 s reply turns
    assert unbounded == plain + 4 * 5 * info.tokens(*camera) and bounded == unbounded  # 20 s of video: within


def test_the_budget_removes_the_oldest_videos_down_to_the_retention():
    script = load_script("vision_cost")
    # 6 turns of 5 s speech: the history's video goes 5, 10, 15 -> 5 (over 10 s: down to 5 s), 10, 15 -> 5
    c = script.call_context(1, 5.0, 5.0, 10, 100.0, (10, 0.5))
    assert c == {"turns": 6, "no camera": 810, "camera, no budget": 810 + 3000, "camera, budget": 810 + 1000}
    assert script.call_context(1, 5.0, 5.0, 10, 100.0, (None, 0.5))["camera, budget"] == 3810


def test_a_model_or_size_it_cannot_build_is_refused(capsys):
    script = load_script("vision_cost")
    assert script.main(["--model", "random:huge"]) == 2
    assert script.main(["--sizes", "big", "--users", "1"]) == 2
    assert "error:" in capsys.readouterr().err
