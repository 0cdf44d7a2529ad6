source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --turns 1 --concurrency 1,4,16,32 --pause-inside-ms 300"
date -u +%T; $B --out $OUT/pause --preemptive-response-ms 200 > $OUT/pause-pre200.log 2>&1; echo "pause-pre200 rc=$?"; date -u +%T
mv $OUT/pause $OUT/pause-pre200
$B --out $OUT/pause-plain > $OUT/pause-plain.log 2>&1; echo "pause-plain rc=$?"; date -u +%T
for x in pause-plain pause-pre200; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; done
for x in pause-plain pause-pre200; do python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/wait-$x.md; python3 scripts/first_audio_path.py $OUT/$x.log > $OUT/path-$x.md; done
cat $OUT/wait-*.md; tail -8 $OUT/path-pause-pre200.md
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
