source .device/setup.sh || exit 1
date -u +%T; timeout 240 python3 -m pytest -q -p no:warnings tests/test_token2wav_graphs.py tests/test_first_chunk_lane.py tests/test_talker_yields.py 2>&1 | tail -3; date -u +%T
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --turns 1 --concurrency 16,32"
$B --stage-config .device/lane.yaml --out $OUT/lane > $OUT/lane.log 2>&1; echo "lane rc=$?"; date -u +%T
$B --out $OUT/main > $OUT/main.log 2>&1; echo "main rc=$?"; date -u +%T
for x in lane main; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/wait-$x.md; cat $OUT/wait-$x.md; done
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
