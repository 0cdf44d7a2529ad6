"""The Ray Serve application's arguments and the example Serve config (no cluster: seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="ray[serve] is not installed (pip install -e '.[ray]')")

import yaml  # noqa: E402
from ray.serve.schema import ServeDeploySchema  # noqa: E402

from realtime.deploy.ray_serve import SHUTDOWN_MARGIN_S, app  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "ray" / "serve.yaml"


def options(args: dict):
    return app(args)._bound_deployment._deployment_config


def test_the_example_serve_config_is_valid_and_builds_the_app():
    schema = ServeDeploySchema.model_validate(yaml.safe_load(EXAMPLE.read_text()))
    (application,) = schema.applications
    assert application.import_path == "realtime.deploy.ray_serve:app"
    args = dict(application.args)
    args["server_flags"] = [f for f in args["server_flags"] if f != "/etc/omni-realtime/api-key"]
    args["server_flags"].remove("--api-key-file")  # the example's key file does not exist here
    config = options(args)
    assert config.max_ongoing_requests == 16
    assert config.autoscaling_config.target_ongoing_requests == 12
    assert (config.autoscaling_config.min_replicas, config.autoscaling_config.max_replicas) == (1, 8)
    assert config.graceful_shutdown_timeout_s == 30 + SHUTDOWN_MARGIN_S


def test_capacity_autoscaling_and_grace_follow_the_arguments():
    fixed = options({"server_flags": ["--max-sessions", "6"], "min_replicas": 2, "max_replicas": 2, "num_gpus": 0})
    assert fixed.num_replicas == 2 and fixed.autoscaling_config is None and fixed.max_ongoing_requests == 6
    scaled = options({"server_flags": ["--max-sessions", "8"], "max_replicas": 3, "drain_grace_s": 5})
    assert scaled.autoscaling_config.target_ongoing_requests == 6  # three quarters of the capacity
    assert scaled.graceful_shutdown_timeout_s == 5 + SHUTDOWN_MARGIN_S


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"server_flags": ["--port", "9000"]}, "belong to Serve's proxy"),
        ({"server_flags": ["--ssl-certfile=/x.pem"]}, "belong to Serve's proxy"),
        ({"server_flags": ["--no-such-flag"]}, "unrecognized --no-such-flag"),
        ({"server_flags": ["--max-sessions", "0"]}, "max_sessions must be >= 1"),
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas <= max_replicas"),
        ({"num_gpus": -1}, "must be >= 0"),
        ({"replicas": 2}, "replicas"),
    ],
)
def test_bad_arguments_fail_before_any_replica_starts(args, message):
    with pytest.raises(ValueError, match=message):
        app(args)
