"""A newcomer's first commands, run as a user runs them (``python -m realtime.cli.main`` in a subprocess, an empty model
cache): ``serve`` starts and stops with no warning in its output but the deliberate random-weights banner; each bad
input gets its one-line message and exit status 2, with no traceback, before any model loads (each case through
the CLI's entry function in-process, two of them also in a subprocess); every command's ``--help`` shows each
option's default."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest

from tests.helpers.background import BackgroundProcess
from tests.helpers.paths import REPO
from tests.helpers.tls import self_signed

pytestmark = pytest.mark.slow

ENV = os.environ | {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "100"}

RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?P<level>[A-Z]+) (?P<logger>\S+): ?(?P<message>.*)$")
"""A log record's first line in the CLI's format (``realtime/cli/main.py``)."""
RECORD_INSIDE = re.compile(r".\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ \S+:")
"""A log record's start after other text on the same line."""
RULE = re.compile(r"^!{20,}$")
"""The lines that frame the random-weights banner."""
WARNS = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|[Ww]arning|\[transformers\]|Traceback")
"""A line that warns: a log record at WARNING or above (the CLI's format or uvicorn's ``WARNING:``), a Python
warning (``DeprecationWarning: ...``), anything transformers logs (``[transformers] ...``), a traceback."""


def unexpected_warnings(lines: list[str]) -> tuple[list[str], int]:
    """The lines of ``lines`` that warn (:data:`WARNS`), and how many random-weights banners were left out.

    The banner is deliberate: a WARNING record whose message says ``RANDOM WEIGHTS``, or a WARNING record with an
    empty message followed by a box of :data:`RULE` lines whose first inner line says ``RANDOM WEIGHTS`` (the
    record's header and its whole box are the banner)."""
    flagged, banners, i = [], 0, 0
    while i < len(lines):
        line = lines[i].rstrip("\n")
        record = RECORD.match(line)
        if record and record["level"] == "WARNING" and "RANDOM WEIGHTS" in record["message"]:
            banners, i = banners + 1, i + 1
            continue
        box_end = _banner_box_end(lines, i + 1) if record and record["level"] == "WARNING" else None
        if box_end is not None and not record["message"].strip():
            banners, i = banners + 1, box_end + 1
            continue
        if WARNS.search(line):
            flagged.append(line)
        i += 1
    return flagged, banners


def _banner_box_end(lines: list[str], start: int) -> int | None:
    """The index of the closing rule of a random-weights box opening at ``lines[start]``, else None."""
    if start + 1 >= len(lines) or not RULE.match(lines[start].strip()) or "RANDOM WEIGHTS" not in lines[start + 1]:
        return None
    for end in range(start + 2, len(lines)):
        if RULE.match(lines[end].strip()):
            return end
    return None


def test_the_warning_scan_tells_the_banner_from_warnings():
    banner = [
        "2026-01-01 10:00:00,000 WARNING pipeline.engine: MODEL /x HAS RANDOM WEIGHTS: a test model",
        "2026-01-01 10:00:00,001 WARNING realtime.server.app: ",
        "!" * 40,
        "  MODEL /x HAS RANDOM WEIGHTS: a test model, not an assistant.",
        "  Pass --model PATH_OR_ID for a real checkpoint.",
        "!" * 40,
        "INFO:     Application startup complete.",
    ]
    assert unexpected_warnings(banner) == ([], 2)
    noise = [
        "[transformers] Model config: tts_text_start_token_id must be `None` or an integer, got 1001.",
        "/site-packages/uvicorn/x.py:1: UvicornDeprecationWarning: The websockets implementation is deprecated",
        "WARNING:  something uvicorn says",
        "2026-01-01 10:00:00,000 WARNING realtime.server.app: slow",
        "2026-01-01 10:00:00,000 WARNING realtime.server.app: ",  # an empty record without the banner's box
        "!" * 40,
        "  not the banner",
        "!" * 40,
        "Traceback (most recent call last):",
    ]
    flagged, banners = unexpected_warnings(noise)
    assert banners == 0 and flagged == [line for line in noise if WARNS.search(line)] and len(flagged) == 6


def _cli(*args: str, env: dict[str, str] = ENV, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "realtime.cli.main", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - start


# --- serve starts clean -------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_serve_starts_and_stops_with_no_warning_but_the_random_weights_banner(tmp_path):
    """``serve`` as the README starts it (the embedded tiny model, built into an empty cache), with a WebRTC media
    worker process: its whole output, stdout and stderr, from the start through Ctrl-C, warns of nothing but the
    random weights. Ctrl-C (SIGINT to the whole process group, as a terminal sends it: the worker gets it too) and
    SIGTERM (to the server alone, as a service manager sends it) stop it with the same lines, the last one
    ``stopped``."""
    cache = tmp_path / "cache"
    endings = {}
    for stop in ("ctrl-c", "sigterm"):
        lines, returncode = _serve_then_stop(cache, stop)
        log = "".join(lines)
        assert "Application startup complete" in log and returncode == 0, log
        flagged, banners = unexpected_warnings(lines)
        assert banners >= 1, "the random-weights banner is missing:\n" + log
        assert flagged == [], "\n".join(flagged)
        ending = lines[next(i for i, line in enumerate(lines) if "Uvicorn running on" in line) + 1 :]
        endings[stop] = [re.sub(r"^\S+ \S+ |\[\d+\]", "", line.rstrip("\n")) for line in ending]
    assert endings["ctrl-c"] == endings["sigterm"] and endings["ctrl-c"][-1] == "INFO omni-realtime: stopped", endings


def _serve_then_stop(cache: Path, stop: str) -> tuple[list[str], int]:
    """``serve`` in a session of its own, stopped once it listens: ``ctrl-c`` signals SIGINT to its process group,
    ``sigterm`` signals SIGTERM to the server's process; its output lines and exit status."""
    args = ["serve", "--port", "0", "--cache-dir", str(cache), "--media-workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "realtime.cli.main", *args],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Uvicorn running on" in line:  # uvicorn's last start line, after "Application startup complete"
                break
    finally:
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    return lines + rest.splitlines(keepends=True), proc.returncode


# --- bad input: one line, status 2, before any model loads --------------------------------------


def _busy_port() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (command line, texts its error line must hold)."""
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("these are notes, not audio\n")
    missing_wav = tmp_path / "absent.wav"
    missing_dir = tmp_path / "no-such-model"
    server, other = self_signed(tmp_path / "tls"), self_signed(tmp_path / "other")
    missing_cert = tmp_path / "absent.pem"
    return {
        "missing wav": (["demo", "--input-wav", str(missing_wav)], [f"no such file: {missing_wav}"]),
        "non-audio wav": (["demo", "--input-wav", str(not_audio)], [str(not_audio), "not an audio file"]),
        "demo: missing model folder": (["demo", "--model", str(missing_dir)], [str(missing_dir), "no such folder"]),
        "serve: missing model folder": (["serve", "--model", str(missing_dir)], [str(missing_dir), "no such folder"]),
        "serve: hub id not downloaded": (
            ["serve", "--model", "omni-test/not-downloaded"],
            ["not in the local Hugging Face cache", "`hf download omni-test/not-downloaded`"],
        ),
        "serve: missing certificate": (
            ["serve", "--ssl-certfile", str(missing_cert), "--ssl-keyfile", str(server.key)],
            [f"--ssl-certfile: no such file: {missing_cert}"],
        ),
        "serve: key of another certificate": (
            ["serve", "--ssl-certfile", str(server.cert), "--ssl-keyfile", str(other.key)],
            [str(other.key), "the private key does not match the certificate"],
        ),
        "bench: missing model folder": (
            ["bench", "--quick", "--model", str(missing_dir), "--out", str(tmp_path / "bench")],
            [str(missing_dir), "no such folder"],
        ),
    }


IN_A_SUBPROCESS = ("non-audio wav", "serve: hub id not downloaded")
"""The bad inputs also run as a user runs them (a demo and a serve case): exit status 2 and no traceback from the
real process; every case runs through :func:`realtime.cli.main.main` in this process."""


@pytest.mark.timeout(300)
def test_bad_inputs_get_one_line_and_status_2_before_any_model_loads(tmp_path, monkeypatch, capsys, caplog):
    """Each bad input of a newcomer: its message on stderr, exit status 2, no traceback, and no model loaded (the
    embedded model's cache stays empty, no server or engine starts, and it returns well within a model load's time even
    on 2 busy cores). Every case runs through the CLI's entry function in this process (:func:`_main_here`, on an
    empty Hugging Face cache); those of :data:`IN_A_SUBPROCESS` also in a subprocess."""
    import huggingface_hub.constants

    import realtime.server.app
    from pipeline.engine import OmniEngine

    hub = tmp_path / "hub"  # an empty Hugging Face cache
    env = ENV | {"HF_HUB_CACHE": str(hub)}
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(realtime.server.app, "run_server", _no_model_loads)  # past serve's checks
    monkeypatch.setattr(OmniEngine, "from_pretrained", _no_model_loads)  # past demo's checks
    cache = tmp_path / "cache"
    failures = []
    with _busy_port() as listener:
        host, port = listener.getsockname()
        cases = _bad_inputs(tmp_path) | {
            "port in use": (["serve", "--port", str(port)], [f"{host}:{port} is already in use", "--port"]),
        }
        assert set(IN_A_SUBPROCESS) <= set(cases)
        for name, (args, texts) in cases.items():
            cache_args = ["--cache-dir", str(cache)] if args[0] in ("serve", "demo") else []
            runs = {"here": _main_here([*args, *cache_args], capsys, caplog)}
            if name in IN_A_SUBPROCESS:
                done, seconds = _cli(*args, *cache_args, env=env)
                runs["subprocess"] = (done.returncode, done.stdout, done.stderr, seconds)
            for where, (status, stdout, stderr, seconds) in runs.items():
                output = stdout + stderr
                error_lines = [line for line in stderr.splitlines() if line.startswith("error: ")]
                ok = (
                    status == 2
                    and len(error_lines) == 1
                    and all(text in error_lines[0] for text in texts)
                    and "Traceback" not in output
                    and seconds < 20
                    and not cache.exists()
                )
                if not ok:
                    failures.append(f"{name} ({where}): status {status} in {seconds:.1f} s:\n{output}")
    assert not failures, "\n\n".join(failures)


def _no_model_loads(*args, **kwargs) -> None:
    raise AssertionError("the command went past its checks: a bad input must be refused before any model loads")


def _main_here(argv: list[str], capsys, caplog) -> tuple[int | None, str, str, float]:
    """``omni-realtime ARGV`` through :func:`realtime.cli.main.main` in this process, as ``sys.exit(main())`` ends:
    (exit status, stdout, stderr, seconds). An exception out of it, or a record logged with one, is a traceback the
    user would have seen: its text goes into stderr."""
    from realtime.cli.main import main

    capsys.readouterr()
    caplog.clear()
    start = time.monotonic()
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        status = exc.code
    except Exception:
        status, trace = None, traceback.format_exc()
    else:
        trace = ""
    seconds = time.monotonic() - start
    out, err = capsys.readouterr()
    logged = [record.getMessage() for record in caplog.records if record.exc_info]
    trace += "".join(f"Traceback of a logged record: {message}\n" for message in logged)
    return status, out, err + trace, seconds


# --- help -----------------------------------------------------------------------------------------

COMMANDS = ([], ["serve"], ["demo"], ["bench"], ["make-tiny-model"])
HELP = {
    tuple(command): BackgroundProcess(
        [sys.executable, "-m", "realtime.cli.main", *command, "--help"], env=ENV, cwd=REPO
    )
    for command in COMMANDS
}
"""Each command's ``--help`` as a user runs it, started in the background (tests/helpers/background.py)."""


def help_entries(text: str) -> list[tuple[str, str]]:
    """The ``(invocation, help)`` of each option an argparse help text lists (``--port PORT``, its help joined
    into one line)."""
    entries: list[list[str]] = []
    for line in text.splitlines():
        if re.match(r"^  -", line):
            invocation, _, help_text = line.strip().partition("  ")
            entries.append([invocation, help_text.strip()])
        elif entries and re.match(r"^\s{3,}\S", line):
            entries[-1][1] = f"{entries[-1][1]} {line.strip()}".strip()
        elif not line.strip() or not line.startswith(" "):
            if entries and entries[-1][0] != "":
                entries.append(["", ""])  # a section ends: no continuation lines after it
    return [(invocation, help_text) for invocation, help_text in entries if invocation]


def _required_options(usage: str) -> set[str]:
    """Options the usage lists outside brackets (required, so without a default)."""
    unbracketed = re.sub(r"\[[^\]]*\]", "", usage)
    return set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", unbracketed))


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=pytest.mark.background(HELP[tuple(c)])) for c in COMMANDS],
    ids=lambda c: " ".join(c) or "omni-realtime",
)
def test_help_explains_every_option_with_its_default_in_plain_words(command):
    done = HELP[tuple(command)].wait(timeout_s=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    text = done.stdout
    assert "``" not in text and ":class:" not in text and ":data:" not in text, text  # no reStructuredText markup
    entries = help_entries(text)
    usage = text.split("\n\n")[0]
    assert entries and all(help_text for _, help_text in entries), entries  # every option explained
    takes_value = [
        (invocation, help_text)
        for invocation, help_text in entries
        if any(not token.startswith("-") for token in re.split(r"[ ,]+", invocation) if token)
    ]
    assert takes_value, text
    missing = [
        invocation
        for invocation, help_text in takes_value
        if "(default: " not in help_text and invocation.split()[0] not in _required_options(usage)
    ]
    assert missing == [], f"options whose help shows no default: {missing}\n{text}"


# --- the demo -------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_demo_log_records_never_land_inside_the_streamed_text(tiny_model_dir, tmp_path):
    """``demo --text Hello`` with stdout and stderr on one terminal: the reply's text is a line of its own, and each
    log record starts a line, the engine's record of the reply's end included (it comes after the text)."""
    args = ["--model", str(tiny_model_dir), "--threads", "1", "--seed", "0", "--out", str(tmp_path / "reply.wav")]
    done = subprocess.run(
        [sys.executable, "-m", "realtime.cli.main", "demo", "--text", "Hello", *args],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=150,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout
    glued = [line for line in lines if RECORD_INSIDE.search(line)]
    assert glued == [], "log records glued onto other output:\n" + "\n".join(glued)
    (ended,) = [i for i, line in enumerate(lines) if RECORD.match(line) and " completed after " in line]
    status = next(i for i, line in enumerate(lines) if " of audio written to " in line)
    assert ended < status and not RECORD.match(lines[ended - 1]), "the reply's text, then its end's record"


@pytest.mark.timeout(180)
def test_demo_says_where_it_wrote_and_why_the_reply_ended(tiny_model_dir, tmp_path, capsys):
    """The demo's last line: the reply's status with its reason, the audio's length and the file it went to (a
    folder made for it); its default file is in a folder git ignores."""
    import soundfile as sf

    from realtime.cli.main import DEMO_OUT, main

    out = tmp_path / "new-folder" / "reply.wav"
    args = ["demo", "--model", str(tiny_model_dir), "--threads", "1", "--seed", "0", "--out", str(out)]
    assert main([*args, "--max-output-tokens", "3"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.match(rf"incomplete \(max_output_tokens\): \d+\.\d\d s of audio written to {re.escape(str(out))} ", last)
    assert sf.info(str(out)).samplerate == 24000
    ignored = subprocess.run(["git", "check-ignore", "-q", str(DEMO_OUT)], cwd=REPO)
    assert ignored.returncode == 0, f"{DEMO_OUT} is not covered by .gitignore"
