#!/usr/bin/env bash
# Run the WebRTC and browser tests inside a loopback-only network namespace, so that no packet of
# theirs can leave 127.0.0.1 (ICE, DTLS, RTP, the uvicorn server, Chromium). Needs root (CI is)
# or unprivileged user namespaces (then: unshare -rn). Extra arguments go to pytest.
#
#   scripts/run_browser_tests.sh            # tests/integration/server/test_webrtc.py tests/browser/test_browser.py
#   scripts/run_browser_tests.sh -k webrtc  # a subset
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then unshare=(unshare -n); else unshare=(unshare -rn); fi
exec "${unshare[@]}" sh -c 'ip link set lo up && exec python -m pytest -q tests/integration/server/test_webrtc.py tests/browser/test_browser.py "$@"' sh "$@"
