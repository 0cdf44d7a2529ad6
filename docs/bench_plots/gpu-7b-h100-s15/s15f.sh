source .device/setup.sh || exit 1
date -u +%T
python3 -m pytest -q -p no:cacheprovider tests/test_host_waits.py tests/test_quick_first_chunk.py tests/test_token2wav_graphs.py tests/test_talker_yields.py tests/test_kv_slots_engine.py tests/test_engine.py tests/test_token2wav_schedule.py 2>&1 | tail -15
date -u +%T
