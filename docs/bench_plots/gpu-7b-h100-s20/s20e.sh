source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
date -u +%T
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_token2wav_graphs.py tests/test_token2wav_stream.py tests/test_token2wav_schedule.py tests/test_playout.py tests/test_talker_lead.py > $OUT/tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/tests.log
date -u +%T
timeout 240 python3 scripts/profile_token2wav.py --device cuda --threads 4 --slots 1,2,4,6,8,10,12,14,16 --top 3 --json $OUT/t2w.json > $OUT/t2w.log 2>&1; echo "profile rc=$?"
grep -E "^\||warm-up" $OUT/t2w.log | head -14
date -u +%T
