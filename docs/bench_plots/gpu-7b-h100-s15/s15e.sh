source .device/setup.sh || exit 1
B="python3 -m realtime.cli bench --model random:7b --device cuda --threads 4 --min-samples 6 --text-tokens 10 --codec-tokens 50 --max-wav-s 5 --turn-timeout-s 120 --turns 1"
date -u +%T; $B --concurrency 1,4,16,32,64 --out $OUT/sweep > $OUT/sweep.log 2>&1; echo "sweep rc=$?"; date -u +%T
$B --concurrency 1,4,16,32,64 --stage-config .device/nopause.yaml --out $OUT/nopause > $OUT/nopause.log 2>&1; echo "nopause rc=$?"; date -u +%T
for x in sweep nopause; do echo "== $x"; sed -n '/^| users | turns/,/^audio s\/s/p' $OUT/$x/report.md | grep -E "^\| [0-9]+ "; rm -f $OUT/$x/*.png $OUT/$x/results.json; done
python3 scripts/first_audio_path.py $OUT/sweep.log > $OUT/path.md; head -9 $OUT/path.md
ls -R $OUT
