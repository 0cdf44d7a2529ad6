source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --concurrency 4,16,32 --turns 2"
date -u +%T; $B --out $OUT/base > $OUT/base.log 2>&1; echo "bench base rc=$?"; date -u +%T
cp .device/pause/pipeline/*.py pipeline/
$B --stage-config .device/pause.yaml --out $OUT/pause > $OUT/pause.log 2>&1; echo "bench pause rc=$?"; date -u +%T
git checkout -q -- pipeline 2>/dev/null || true
for x in base pause; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; done
ls -R $OUT
