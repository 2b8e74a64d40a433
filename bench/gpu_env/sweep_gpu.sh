#!/usr/bin/env bash
# The sweep that decides REDER's settings, in ONE device call of at most 10 minutes: the environment, the
# carried corpus, a packing measurement (bench.sweep packing: 1, 2, 4, 8 REDER trainings at once on the GPU,
# ~3 minutes), its sizing (bench.sweep size: how many trials at once, each how long, ASHA's rungs), then
# `run_pipeline.py tune` with configs/multi30k_quick.yaml's REDER as the base and SPACE as the search space, on
# the quick run's distilled corpus (`distill.corpus`) and its data stages reused (no teacher, no distillation,
# no tokenizing). Its best.yaml's model, loss and train sections become the quick recipe's REDER settings.
# Comes back under $OUT: sweep.log, packing.json, sizing.json, trials.csv, best.yaml, bleu_vs_params.png,
# results.tar.gz (mlflow.db, the sweep's manifest and report).
#
#   bash bench/gpu_env/sweep_gpu.sh [KEY=VALUE ...]   on the GPU machine; carry bench/gpu_env/site.tar.xz,
#                                bench/gpu_env/data (the Multi30k files) and bench/gpu_env/data/corpus.tar.gz (a
#                                quick_gpu.sh run's corpus.tar.gz: its finished ingest, spm, tokenize and distill
#                                stage directories)
#   bash bench/gpu_env/sweep_gpu.sh --rehearse [KEY=VALUE ...]   here, on the CPU, at a tiny budget (the
#                                rehearsal's models of where.sh, 2 trials); CORPUS= a rehearsed quick_gpu.sh
#                                run's corpus.tar.gz
# Environment: OUT (the device tool's; a temporary directory when unset), CORPUS (the corpus tarball),
# SWEEP_LIMIT_S (the whole script's, default 570), PACKING_TRIALS ("1 2 4 8"), PACKING_S (20 s each),
# TRIALS (8), SPACE (the tune.space YAML below), SWEEP_WORKDIR (default /tmp/m30ks).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"  # a rehearsal's OUT may not exist yet (the device tool's does)
work=${SWEEP_WORKDIR:-/tmp/m30ks}
limit=${SWEEP_LIMIT_S:-570}
trials=${TRIALS:-8}
packing_trials=${PACKING_TRIALS:-1 2 4 8}
packing_s=${PACKING_S:-20}
corpus=${CORPUS:-$here/data/corpus.tar.gz}
# What the CPU ablation left standing (docs/RESULTS.md, two seeds of three so far): NMLA over the last 20 % of the
# run (loss.nmla_start_fraction: a share of the time budget) with or without CTC beside it, ahead in every cell;
# glancing (a constant share: glance_steps 0 holds glance_end from the first update), behind at 300 CPU updates
# but known to need longer runs, at one value; the peak lr. Out: the upsampling ratio 3 and glancing blank-aligned
# frames (up to 5.8 BLEU behind). NMLA acts in the last fifth of a trial's budget, which ASHA's early rungs do
# not see: there its trials are the CTC trials they are until then; the trials that reach the end decide.
space=${SPACE:-"{loss.nmla_start_fraction: {choice: [null, 0.8]}, loss.nmla_ctc_weight: {choice: [0.0, 0.5]}, loss.glance_end: {choice: [0.0, 0.3]}, train.lr: {loguniform: [0.0004, 0.0015]}}"}
started=$(date +%s.%N)
overrides=(workdir=$work)
. "$here/where.sh"
if [ "${1:-}" = --rehearse ]; then
  shift
  rehearsal
  trials=${TRIALS:-2}
  limit=${SWEEP_LIMIT_S:-360}
  packing_trials=${PACKING_TRIALS:-1 2}
  packing_s=${PACKING_S:-5}
  packing_args=(--warmup 2 --cores 2)
  extra_fixed=60  # Ray's start on a 2-core CPU
else
  machine "$out/sweep.log" || exit 1
  packing_args=()
  extra_fixed=0
fi
export PYTHONUNBUFFERED=1
elapsed() { python3 -c "print(round($(date +%s.%N) - $started, 1))"; }
echo "environment ready after $(elapsed) s" | tee -a "$out/sweep.log"

[ -f "$corpus" ] || { echo "error: no corpus tarball at $corpus (a quick_gpu.sh run's corpus.tar.gz)" | tee -a "$out/sweep.log"; exit 1; }
mkdir -p "$work" && tar xzf "$corpus" -C "$work" || { echo "error: $corpus: not a tarball tar can read" | tee -a "$out/sweep.log"; exit 1; }
distilled=$(ls -d "$work"/distill-*/train 2>/dev/null | head -1)
[ -n "$distilled" ] || { echo "error: $corpus holds no distill-*/train directory" | tee -a "$out/sweep.log"; exit 1; }
echo "corpus: $(cd "$work" && ls -d */ | tr '\n' ' ')" | tee -a "$out/sweep.log"
overrides+=(distill.corpus=$distilled "tune.space=$space")

# The packing measurement, then the sizing for what is left of the limit (less the collection at the end).
timeout -s INT 240 "$python" -m bench.sweep packing --data "$distilled" --out "$out/packing.json" \
  --trials $packing_trials --seconds "$packing_s" "${packing_args[@]}" --config configs/multi30k_quick.yaml \
  "${overrides[@]}" "$@" 2>&1 | tee -a "$out/sweep.log" | grep -v "^\s*$" | tail -n 8
[ -f "$out/packing.json" ] || { echo "error: the packing measurement did not finish" | tee -a "$out/sweep.log"; exit 1; }
budget=$(python3 -c "print(int($limit - ($(date +%s.%N) - $started) - 25))")
sizing=$("$python" -m bench.sweep size --packing "$out/packing.json" --budget-s "$budget" --trials "$trials" \
  --fixed-s $((45 + extra_fixed)) --out "$out/sizing.json") || { echo "error: no sizing" | tee -a "$out/sweep.log"; exit 1; }
echo "sizing for $budget s: $(echo $sizing)" | tee -a "$out/sweep.log"

sweep_started=$(date +%s.%N)
# the sizing after the script's overrides, the command line's KEY=VALUE last (they win)
timeout -s INT -k 20 "$budget" "$python" run_pipeline.py tune --config configs/multi30k_quick.yaml \
  "${overrides[@]}" $sizing "$@" >> "$out/sweep.log" 2>&1
code=$?
echo "sweep: exit $code after $(python3 -c "print(round($(date +%s.%N) - $sweep_started, 1))") s" | tee -a "$out/sweep.log"

tune_dir=$(ls -dt "$work"/tune-* 2>/dev/null | head -1)
if [ -n "$tune_dir" ]; then
  for f in trials.csv best.yaml bleu_vs_params.png; do [ -f "$tune_dir/$f" ] && cp "$tune_dir/$f" "$out/"; done
  [ -f "$out/trials.csv" ] && column -s, -t < "$out/trials.csv" | head -20
  ( cd "$work" && tar czf "$out/results.tar.gz" --ignore-failed-read mlflow.db config.yaml "$(basename "$tune_dir")"/manifest.json \
      "$(basename "$tune_dir")"/report.json ) 2>/dev/null
fi
echo "done after $(elapsed) s; files in $out: $(ls "$out" | tr '\n' ' ')"
exit $code
