source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --concurrency 4,16,32 --turns 2"
date -u +%T; $B --stage-config .device/mixed.yaml --out $OUT/mixed > $OUT/mixed.log 2>&1; echo "bench mixed rc=$?"; date -u +%T
$B --out $OUT/base > $OUT/base.log 2>&1; echo "bench base rc=$?"; date -u +%T
python3 scripts/profile_steps.py --model random:7b --device cuda --threads 4 --users 16 --spread-ms 1000 --no-trace --timeline --stage-config .device/mixed.yaml --out $OUT/pmixed > $OUT/pmixed.log 2>&1; echo "profile mixed rc=$?"; date -u +%T
for x in mixed base; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; done
grep -E "Error|Traceback" $OUT/pmixed.log | head -5; tail -c 2000 $OUT/pmixed.log > $OUT/pmixed.tail; rm -f $OUT/pmixed.log
ls -R $OUT
