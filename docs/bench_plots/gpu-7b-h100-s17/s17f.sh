source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 200 --turns 1 --concurrency 64 --pause-inside-ms 300"
date -u +%T; $B --out $OUT/p64-pre > $OUT/p64-pre.log 2>&1; echo "p64-pre rc=$?"; date -u +%T
$B --preemptive-response-ms off --out $OUT/p64-off > $OUT/p64-off.log 2>&1; echo "p64-off rc=$?"; date -u +%T
for x in p64-pre p64-off; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/wait-$x.md; cat $OUT/wait-$x.md; done
python3 scripts/first_audio_path.py $OUT/p64-pre.log | tail -4
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
