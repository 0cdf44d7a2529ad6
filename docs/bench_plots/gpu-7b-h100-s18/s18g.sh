source .device/setup.sh || exit 1
export PYTHONUNBUFFERED=1
date -u +%T; timeout 300 python3 -m pytest -q -p no:warnings tests/test_token2wav_graphs.py tests/test_token2wav_compile.py tests/test_quick_first_chunk.py tests/test_token2wav_stream.py 2>&1 | tail -3; date -u +%T
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --max-wav-s 5 --turns 1 --no-plots --turn-timeout-s 120 --codec-tokens 50"
$B --concurrency 1,16,32 --out $OUT/fade > $OUT/fade.log 2>&1; echo "fade rc=$?"; date -u +%T
sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/fade/report.md | grep -E "^\| [0-9]+ "; python3 scripts/first_chunk_wait.py $OUT/fade.log > $OUT/fade/wait.md; grep users $OUT/fade/wait.md
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
cd $OUT && tar czf s18g.tgz fade fade.log && rm -rf fade fade.log
