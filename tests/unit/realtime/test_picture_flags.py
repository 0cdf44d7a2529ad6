"""``serve``'s picture and camera flags: each becomes its setting, bad values are one CLI error line."""

from __future__ import annotations

import pytest

from realtime.cli.main import build_parser, main, server_config
from realtime.config import ServerConfig
from realtime.media.images import ImageLimits
from realtime.media.video_settings import CameraSettings


def test_picture_and_camera_flags_become_the_server_config():
    args = build_parser().parse_args(
        [
            "serve",
            "--image-max-bytes",
            "1000000",
            "--image-max-pixels",
            "4000000",
            "--image-low-detail-pixels",
            "50176",
            "--image-high-detail-pixels",
            "401408",
            "--camera-fps",
            "1.5",
            "--camera-max-pixels",
            "200704",
        ]
    )
    config = server_config(args)
    assert config.image_limits == ImageLimits(
        max_bytes=1_000_000, max_pixels=4_000_000, low_detail_pixels=50_176, high_detail_pixels=401_408
    )
    assert config.camera == CameraSettings(fps=1.5, max_pixels=200_704)


def test_without_the_flags_the_settings_keep_their_defaults():
    config = server_config(build_parser().parse_args(["serve"]))
    assert config.image_limits == ServerConfig().image_limits == ImageLimits()
    assert config.camera == ServerConfig().camera == CameraSettings()
    assert config.camera.fps is None  # the model's own rate


def test_the_help_shows_each_default():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    options = {block.split()[0]: " ".join(block.split()) for block in serve.format_help().split("\n  --")[1:]}
    for flag, default in (
        ("image-max-bytes", ImageLimits().max_bytes),
        ("image-max-pixels", ImageLimits().max_pixels),
        ("image-low-detail-pixels", ImageLimits().low_detail_pixels),
        ("image-high-detail-pixels", ImageLimits().high_detail_pixels),
        ("camera-max-pixels", CameraSettings().max_pixels),
    ):
        assert options[flag].endswith(f"(default: {default})"), options[flag]
    assert options["camera-fps"].endswith("(default: the model's own rate, 2 for Qwen2.5-Omni)")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--camera-fps", "0"], "argument --camera-fps: expected a number above 0, got 0"),
        (["--camera-fps", "-2"], "argument --camera-fps: expected a number above 0, got -2"),
        (["--camera-fps", "inf"], "argument --camera-fps: expected a number above 0, got inf"),
        (["--camera-max-pixels", "0"], "argument --camera-max-pixels: expected a number >= 1, got 0"),
        (["--image-max-pixels", "many"], "argument --image-max-pixels: expected a whole number, got 'many'"),
        (["--image-low-detail-pixels", "-1"], "argument --image-low-detail-pixels: expected a number >= 1, got -1"),
    ],
)
def test_a_bad_value_is_a_cli_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and "Traceback" not in err


def test_a_picture_limit_over_the_message_limit_is_refused_before_the_model_loads(capsys):
    status = main(["serve", "--image-max-bytes", "7000000", "--max-message-bytes", "8000000", "--port", "0"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip() == (
        "error: --image-max-bytes 7000000: a picture that large is a data URI of 9333336 bytes, over "
        "--max-message-bytes 8000000"
    )
