"""The command line's checks before a model loads (``realtime/cli/preflight.py``) and its help layout."""

from __future__ import annotations

import argparse
import os
import socket

import numpy as np
import pytest
import soundfile as sf

from realtime.cli.flags import HelpFormatter
from realtime.cli.preflight import (
    UsageError,
    check_audio_file,
    check_model,
    check_output_file,
    check_port_free,
    check_stage_config,
    check_tls,
)
from realtime.config import ServerConfig
from tests.helpers.tls import self_signed


def test_audio_files_missing_empty_or_not_audio_are_named(tmp_path):
    good = tmp_path / "hello.wav"
    sf.write(good, np.zeros(800, np.float32), 8000)
    check_audio_file(good)
    empty = tmp_path / "empty.wav"
    sf.write(empty, np.zeros(0, np.float32), 16000)
    text = tmp_path / "text.wav"
    text.write_text("hello")
    for path, message in (
        (tmp_path / "absent.wav", f"no such file: {tmp_path / 'absent.wav'}"),
        (tmp_path, "is a folder, not an audio file"),
        (text, "not an audio file that can be read"),
        (empty, "holds no samples"),
    ):
        with pytest.raises(UsageError, match=message):
            check_audio_file(path)


def test_a_port_in_use_is_named_with_its_host_and_the_option_to_change():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(UsageError, match=rf"127\.0\.0\.1:{port} is already in use.*--port"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # released: free again
    check_port_free("127.0.0.1", 0)  # any free port: nothing to check
    with pytest.raises(UsageError, match="--host no-such-host.invalid: not an address of this machine"):
        check_port_free("no-such-host.invalid", 8000)
    with pytest.raises(UsageError, match="--host 192.0.2.1: not an address of this machine"):
        check_port_free("192.0.2.1", 8000)  # TEST-NET-1: never this machine's


def test_models_stage_configs_and_output_files(tmp_path):
    check_model(None)
    check_model("embedded:tiny")
    with pytest.raises(UsageError, match=f"--model {tmp_path / 'absent'}: no such folder"):
        check_model(str(tmp_path / "absent"))
    check_stage_config(None)
    with pytest.raises(UsageError, match="--stage-config: cannot read stage config"):
        check_stage_config(tmp_path / "absent.yaml")
    with pytest.raises(UsageError, match="is a folder; give a file name"):
        check_output_file(tmp_path)
    check_output_file(tmp_path / "a" / "b" / "reply.wav")
    assert (tmp_path / "a" / "b").is_dir()


def test_tls_files_that_load_pass(tmp_path):
    server = self_signed(tmp_path / "plain")
    check_tls(None, None, None, None)  # no TLS: nothing to check
    check_tls(server.cert, server.key, None, None)
    check_tls(server.cert, server.key, None, server.cert)  # its own certificate as the clients' CA
    both = tmp_path / "both.pem"
    both.write_bytes(server.cert.read_bytes() + server.key.read_bytes())
    check_tls(both, None, None, None)  # the key in the certificate's file
    encrypted = self_signed(tmp_path / "encrypted", key_password="s3cret")
    check_tls(encrypted.cert, encrypted.key, "s3cret", None)


def test_tls_files_that_cannot_work_are_named_with_the_option_and_the_fix(tmp_path):
    server, other = self_signed(tmp_path / "a"), self_signed(tmp_path / "b")
    encrypted = self_signed(tmp_path / "encrypted", key_password="s3cret")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a PEM file\n")
    absent = tmp_path / "absent.pem"
    cases = (
        ((absent, server.key, None, None), f"--ssl-certfile: no such file: {absent}"),
        ((server.cert, absent, None, None), f"--ssl-keyfile: no such file: {absent}"),
        ((server.cert, server.key, None, absent), f"--ssl-ca-certs: no such file: {absent}"),
        ((server.cert, tmp_path, None, None), f"--ssl-keyfile {tmp_path} is a folder, not a PEM file"),
        ((junk, server.key, None, None), f"--ssl-certfile {junk}: not a PEM certificate .* that can be loaded"),
        ((server.key, server.key, None, None), "--ssl-certfile .*: not a PEM certificate"),
        ((server.cert, junk, None, None), f"--ssl-keyfile {junk}: not a PEM private key that can be loaded"),
        ((server.cert, other.key, None, None), "the private key does not match the certificate in --ssl-certfile"),
        ((server.cert, None, None, None), "holds no private key that can be loaded; give the key with --ssl-keyfile"),
        ((encrypted.cert, encrypted.key, None, None), "the private key is encrypted; give its password with"),
        ((encrypted.cert, encrypted.key, "wrong", None), "cannot be decrypted with --ssl-keyfile-password"),
        ((server.cert, server.key, None, junk), f"--ssl-ca-certs {junk}: not PEM CA certificates that can be loaded"),
    )
    for args, message in cases:
        with pytest.raises(UsageError, match=message):
            check_tls(*args)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_tls_file_is_named(tmp_path):
    server = self_signed(tmp_path)
    server.key.chmod(0)
    with pytest.raises(UsageError, match=f"--ssl-keyfile {server.key}: cannot be read \\(Permission denied\\)"):
        check_tls(server.cert, server.key, None, None)


def test_tls_settings_without_a_certificate_are_refused():
    assert not ServerConfig().tls and ServerConfig().http_scheme == "http"
    assert ServerConfig(ssl_certfile="cert.pem").http_scheme == "https"
    for name in ("ssl_keyfile", "ssl_keyfile_password", "ssl_ca_certs"):
        with pytest.raises(ValueError, match=f"{name} needs ssl_certfile"):
            ServerConfig(**{name: "x"})
    assert "s3cret" not in repr(ServerConfig(ssl_certfile="c.pem", ssl_keyfile_password="s3cret"))


def test_the_help_shows_value_defaults_once_and_leaves_no_value_defaults_to_the_text():
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="a seed")
    parser.add_argument("--name", default="x", help="a name (default: x, the usual)")
    parser.add_argument("--model", default=None, help="a model (default: the tiny one)")
    parser.add_argument("--quiet", action="store_true", help="say less")
    text = " ".join(parser.format_help().split())
    assert "a seed (default: 0)" in text  # a zero default is a value
    assert "a name (default: x, the usual) --model" in text  # stated once, by the text
    assert "a model (default: the tiny one)" in text and "None" not in text and "False" not in text
