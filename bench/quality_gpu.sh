#!/usr/bin/env bash
# The five systems of issue 7 on one GPU, same number of updates each (configs/multi30k.yaml's models):
#   bash bench/quality_gpu.sh DATA OUT [STEPS] [key=value ...]
# 1. the AR teachers (one per direction) and the KD corpus (bench.quality teachers);
# 2. three CTC REDERs trained at once, one process each (a model this size is bound by kernel launches on its
#    own; three at once kept an H100 95-100 % busy): KD + FBA/CC (CTC beam 20 and teacher reranking too), no
#    KD, KD without FBA/CC; then the DAG head with KD without FBA/CC alone (at 16,384 tokens per batch it held
#    over 38 GiB and ran out of memory beside the three on an 80 GB H100; alone, an update took 0.28 s, 3.7x a
#    CTC update, so 3,000 updates take about 14 minutes); each scored, not timed
#    (--no-speed), and saved (--save-models);
# 3. each saved REDER timed alone on the GPU beside the teachers (bench.quality speed).
# Every model is the average of its best 3 checkpoints by validation BLEU, scored every 500 updates (as the
# pipeline's train stage publishes). Then: python -m bench.quality_table OUT/T/teachers.json OUT/R-*/reder.json
set -euo pipefail
data=$1 out=$2 steps=${3:-3000}
shift $(($# < 3 ? $# : 3))
python=${PYTHON:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} PYTHONUNBUFFERED=1
common=(--data-dir "$data" --steps "$steps" --validate-every 500 --average-best 3)
mkdir -p "$out"
echo "$(date -u +%FT%TZ) teachers" >&2
"$python" -m bench.quality teachers --out "$out/T" "${common[@]}" "$@" >"$out/teachers.log" 2>&1
reder() {  # reder VARIANT BEAM [key=value ...]: train, score and save one variant (log: OUT/reder-VARIANT.log)
    local variant=$1 beam=$2
    shift 2
    echo "$(date -u +%FT%TZ) reder $variant" >&2
    "$python" -m bench.quality reder --from "$out/T" --out "$out/R-$variant" "${common[@]}" --beam "$beam" \
        --save-models --no-speed "$@" --variants "$variant" >"$out/reder-$variant.log" 2>&1
}
pids=()
reder kd 20 "$@" & pids+=($!)
reder raw 1 "$@" & pids+=($!)
reder kd_noaux 1 "$@" & pids+=($!)
for pid in "${pids[@]}"; do
    wait "$pid"
done
reder dag_kd_noaux 1 "$@"
variants=(kd raw kd_noaux dag_kd_noaux)
for variant in "${variants[@]}"; do
    echo "$(date -u +%FT%TZ) speed $variant" >&2
    "$python" -m bench.quality speed --from "$out/T" --out "$out/R-$variant" "${common[@]}" "$@" \
        >"$out/speed-$variant.log" 2>&1
done
echo "$(date -u +%FT%TZ) done" >&2
