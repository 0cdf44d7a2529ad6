source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --turns 1"
date -u +%T; $B --concurrency 1,4,16,32,64 --out $OUT/default > $OUT/default.log 2>&1; echo "default rc=$?"; date -u +%T
$B --concurrency 64 --preemptive-response-ms off --out $OUT/off64 > $OUT/off64.log 2>&1; echo "off64 rc=$?"; date -u +%T
for x in default off64; do echo "== $x"; grep -E "^- server|in process" $OUT/$x/report.md | head -2; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; done
for x in default off64; do python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/wait-$x.md; python3 scripts/first_audio_path.py $OUT/$x.log > $OUT/path-$x.md; done
cat $OUT/wait-*.md; tail -8 $OUT/path-default.md
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
