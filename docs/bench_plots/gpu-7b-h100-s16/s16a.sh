source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --turns 1 --concurrency 1,4,16,32"
date -u +%T; $B --out $OUT/plain > $OUT/plain.log 2>&1; echo "plain rc=$?"; date -u +%T
$B --preemptive-response-ms 200 --out $OUT/pre200 > $OUT/pre200.log 2>&1; echo "pre200 rc=$?"; date -u +%T
for x in plain pre200; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; done
python3 scripts/first_chunk_wait.py $OUT/plain.log > $OUT/wait-plain.md; python3 scripts/first_chunk_wait.py $OUT/pre200.log > $OUT/wait-pre200.md; cat $OUT/wait-*.md
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/pre200.log | head -5
