"""Checks of the command line's inputs made before any model loads (a load takes seconds to minutes).

Each check raises :class:`UsageError` with a message a user can act on; the CLI prints it as one line on
stderr and exits with status 2, as argparse does for a malformed option.
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path


class UsageError(ValueError):
    """A command-line input that cannot work: a missing file, a busy port, an unknown model."""


def check_audio_file(path: Path) -> None:
    """``path`` is an audio file soundfile reads (WAV, FLAC, OGG...) with at least one sample."""
    import soundfile as sf

    if not path.exists():
        raise UsageError(f"no such file: {path}")
    if path.is_dir():
        raise UsageError(f"{path} is a folder, not an audio file")
    try:
        info = sf.info(str(path))
    except RuntimeError as exc:  # soundfile's LibsndfileError: an unknown format, a broken header, no permission
        reason = getattr(exc, "error_string", None) or str(exc)
        raise UsageError(f"{path}: not an audio file that can be read, WAV expected ({reason})") from None
    if info.frames == 0:
        raise UsageError(f"{path}: the audio file holds no samples")


def check_model(model: str | None) -> None:
    """``model`` (``--model``) names a checkpoint folder, or a hub id already in the local Hugging Face cache;
    ``None`` and ``embedded:tiny`` (the embedded tiny model, built on first use) always pass."""
    from pipeline.embedded import EMBEDDED_MODEL

    if model in (None, EMBEDDED_MODEL):
        return
    # the packaged family's resolver: a folder, or a hub id in the local cache (reads no weights)
    from pipeline.errors import CheckpointError
    from pipeline.models import DEFAULT_FAMILY, family_of

    try:
        family_of(DEFAULT_FAMILY).resolve_checkpoint(model)
    except CheckpointError as exc:
        raise UsageError(f"--model {exc}") from None


def check_port_free(host: str, port: int) -> None:
    """Every address ``host`` resolves to can listen on ``port`` now (0: any free port, nothing to check).

    The sockets are closed again at once, so the server may bind them after its model has loaded; another
    program taking the port in between still fails there, with uvicorn's own message."""
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: not an address of this machine ({exc.strerror})") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
            try:
                probe.bind(address)
            except OSError as exc:
                raise UsageError(_bind_failure(host, port, exc)) from None


def _bind_failure(host: str, port: int, exc: OSError) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where} is already in use (another server running?); choose another port with --port"
    if exc.errno == errno.EACCES:
        return f"no permission to listen on {where} (ports below 1024 need privileges); choose another with --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine"
    return f"cannot listen on {where}: {exc.strerror}"


def check_stage_config(path: Path | None) -> None:
    """``path`` (``--stage-config``; None: the packaged one) reads as a valid pipeline configuration whose stages'
    devices this host has."""
    from pipeline.config import check_devices, load_stage_config
    from pipeline.errors import ConfigError

    try:
        check_devices(load_stage_config(path))
    except ConfigError as exc:
        raise UsageError(f"--stage-config: {exc}") from None


def check_output_file(path: Path) -> None:
    """``path`` can be written: not a folder; its folder made if missing."""
    if path.is_dir():
        raise UsageError(f"--out {path} is a folder; give a file name, such as {path / 'reply.wav'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {path}: cannot create its folder ({exc.strerror})") from None


def check_tls(certfile: Path | None, keyfile: Path | None, password: str | None, ca_certs: Path | None) -> None:
    """The TLS files (``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-ca-certs``) load as the server will load them:
    each file exists and can be read, the certificate is a PEM certificate, the key is a PEM private key that
    matches it (decrypted with ``password`` when encrypted) and the CA file holds PEM certificates. Nothing to
    check without a certificate. OpenSSL is never left to prompt for a password on the terminal."""
    import ssl

    if certfile is None:
        return
    files = {"--ssl-certfile": certfile, "--ssl-keyfile": keyfile, "--ssl-ca-certs": ca_certs}
    for option, path in files.items():
        if path is not None:
            _check_readable(option, path)
    _load_certificates("--ssl-certfile", certfile, "a PEM certificate (-----BEGIN CERTIFICATE-----)")
    key_option, key_path = ("--ssl-keyfile", keyfile) if keyfile is not None else ("--ssl-certfile", certfile)
    asked: list[bool] = []

    def give_password() -> str:
        asked.append(True)
        if password is None:
            raise UsageError(
                f"{key_option} {key_path}: the private key is encrypted; give its password with --ssl-keyfile-password"
            )
        return password

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, give_password)
    except ssl.SSLError as exc:
        raise UsageError(_key_failure(key_option, key_path, certfile, exc, password_used=bool(asked))) from None
    if ca_certs is not None:
        _load_certificates("--ssl-ca-certs", ca_certs, "PEM CA certificates")


def _check_readable(option: str, path: Path) -> None:
    if not path.exists():
        raise UsageError(f"{option}: no such file: {path}")
    if path.is_dir():
        raise UsageError(f"{option} {path} is a folder, not a PEM file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot be read ({exc.strerror})") from None


def _load_certificates(option: str, path: Path, expected: str) -> None:
    """``path`` holds at least one certificate OpenSSL loads (as trusted certificates: a server's certificate
    loads the same way, and a private key in the same file is passed over)."""
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        reason = _reason(exc)
        raise UsageError(f"{option} {path}: not {expected} that can be loaded{reason and f' ({reason})'}") from None


def _key_failure(option: str, path: Path, certfile: Path, exc, *, password_used: bool) -> str:
    reason = _reason(exc)
    detail = f" ({reason})" if reason else ""
    if reason == "KEY_VALUES_MISMATCH":
        return f"{option} {path}: the private key does not match the certificate in --ssl-certfile {certfile}"
    if password_used:
        return f"{option} {path}: the private key cannot be decrypted with --ssl-keyfile-password{detail}"
    if option == "--ssl-certfile":
        return f"--ssl-certfile {path} holds no private key that can be loaded; give the key with --ssl-keyfile"
    return f"{option} {path}: not a PEM private key that can be loaded{detail}"


def _reason(exc) -> str:
    """OpenSSL's reason code of an ``ssl.SSLError`` (``KEY_VALUES_MISMATCH``), or ``""`` when it has none."""
    return getattr(exc, "reason", None) or ""
