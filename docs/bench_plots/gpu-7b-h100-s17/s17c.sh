source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --turns 1"
for r in 1 2 3; do date -u +%T; $B --concurrency 16 --out $OUT/u16-$r > $OUT/u16-$r.log 2>&1; echo "u16-$r rc=$?"; done
for r in 1 2; do date -u +%T; $B --concurrency 32 --out $OUT/u32-$r > $OUT/u32-$r.log 2>&1; echo "u32-$r rc=$?"; done; date -u +%T
for x in u16-1 u16-2 u16-3 u32-1 u32-2; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; python3 scripts/first_chunk_wait.py $OUT/$x.log > $OUT/wait-$x.md; done
cat $OUT/wait-*.md; grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
