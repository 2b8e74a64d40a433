#!/usr/bin/env bash
# The GPU tests (`pytest -m gpu`) and the compiled decode path timed on CUDA (bench.peers --compile) in one
# short device call, made right after quick_gpu.sh while the machine is still warm (the
# environment is then unpacked already) or alone (it unpacks it). Each part under its own limit, so that what
# ran comes back under $OUT: gpu_tests.log, peers.log, peers_compile.json.
#
#   bash bench/gpu_env/gpu_checks.sh      on the GPU machine; carry bench/gpu_env/site.tar.xz (pack.sh)
# Environment: OUT (the device tool's; a temporary directory when unset), TESTS_S (default 170: all ten `gpu`
# tests took 162 s on an H200), PEERS_S (default 240: compiling the buckets took over 80 s there), DEVICE
# (default cuda; `DEVICE=cpu PYTHON=.venv/bin/python` rehearses it here: the gpu tests skip, bench.peers runs on
# the CPU).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"  # a rehearsal's OUT may not exist yet (the device tool's does)
device=${DEVICE:-cuda}
started=$(date +%s)
data=$root/../shared/data/multi30k  # ../shared stays behind: on the GPU machine, the carried copy
if [ "$device" = cuda ]; then
  python=python3
  data=$root/bench/gpu_env/data/multi30k
  bash bench/gpu_env/unpack.sh > /tmp/env.sh && . /tmp/env.sh || exit 1
  export PYTHONPATH=$root:${PYTHONPATH:-} RAY_AUTH_MODE=disabled
else
  python=${PYTHON:-python3}
fi
export PYTHONUNBUFFERED=1
echo "environment ready after $(( $(date +%s) - started )) s" | tee "$out/gpu_tests.log"

# Every `gpu` test, the quick ones first: the CTC alignment on CUDA, the teachers' batched search, the DAG
# kernels, CUDA graphs of the inference trunk, the attention without cuDNN; then the harness, distill and train
# stage on the GPU (two of them start Ray: about a minute each on an H200).
timeout -k 10 "${TESTS_S:-170}" $python -m pytest -m gpu -q -rs -p no:cacheprovider --durations 10 \
  tests/reder/test_ctc.py tests/reder/test_autoregressive.py tests/reder/test_dag_triton.py \
  tests/reder/test_static.py tests/reder/test_attention.py tests/pipeline/test_gpu.py \
  >> "$out/gpu_tests.log" 2>&1
echo "gpu tests: exit $? after $(( $(date +%s) - started )) s" | tee -a "$out/gpu_tests.log"

timeout -k 10 "${PEERS_S:-240}" $python -m bench.peers --device "$device" --engines reder --compile --sentences 100 \
  --data "$data" --out "$out/peers_compile.json" > "$out/peers.log" 2>&1
echo "bench.peers --compile: exit $? after $(( $(date +%s) - started )) s" | tee -a "$out/peers.log"
echo "files in $out: $(ls "$out" | tr '\n' ' ')"
