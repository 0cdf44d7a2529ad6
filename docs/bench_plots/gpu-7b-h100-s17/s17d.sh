# usage: bash s17d.sh LEVELS NAME  (the sweep beside transformers' reference, at the default settings)
source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 200 --turns 1"
date -u +%T; $B --concurrency $1 --reference --out $OUT/$2 > $OUT/$2.log 2>&1; echo "$2 rc=$?"; date -u +%T
rm -f $OUT/$2/*.png $OUT/$2/results.json; cat $OUT/$2/report.md
python3 scripts/first_chunk_wait.py $OUT/$2.log > $OUT/wait-$2.md; cat $OUT/wait-$2.md
grep -c "slow engine step" $OUT/*.log; grep -i -E "error|traceback" $OUT/*.log | head -5
