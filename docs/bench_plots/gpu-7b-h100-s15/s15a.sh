source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120"
date -u +%T; python3 scripts/profile_steps.py --model random:7b --device cuda --threads 4 --users 4,16 --spread-ms 1000 --no-trace --timeline --out $OUT/pbase > $OUT/pbase.log 2>&1; echo "profile base rc=$?"; date -u +%T
$B --concurrency 16,32 --turns 2 --out $OUT/base > $OUT/base.log 2>&1; echo "bench base rc=$?"; date -u +%T
$B --concurrency 16,32 --turns 2 --stage-config .device/q16.yaml --out $OUT/q16 > $OUT/q16.log 2>&1; echo "bench q16 rc=$?"; date -u +%T
python3 scripts/profile_steps.py --model random:7b --device cuda --threads 4 --users 16 --spread-ms 1000 --no-trace --timeline --stage-config .device/q16.yaml --out $OUT/pq16 > $OUT/pq16.log 2>&1; echo "profile q16 rc=$?"; date -u +%T
for x in base q16; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; done
grep -A3 first_audio_ms $OUT/pbase.log | head; tail -3 $OUT/pq16.log
grep -E "Error|Traceback" $OUT/pbase.log $OUT/pq16.log | head -5
tail -c 3000 $OUT/pbase.log > $OUT/pbase.tail; rm -f $OUT/pbase.log $OUT/pq16.log
ls -R $OUT
