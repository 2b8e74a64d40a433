#!/usr/bin/env bash
# Decoding speed on the GPU against the peers, and the `gpu` tests, in short device calls (PARTS). Three parts, each
# under its own limit so that what ran comes back under $OUT (peers.log/peers.json, compile.log/peers_compile.json,
# gpu_tests.log, env.log):
#   peers    bench.peers --device cuda on every engine (REDER's eager paths, our AR teacher, CTranslate2): batch-1
#            latency and batch-64 sentences/s, the fast paths' tokens against the eager reference path's; untrained
#            models of one size, the AR outputs forced to 14 tokens + EOS (the 100 German references average 14.5
#            pieces of the bench's joint 8,000-piece model: a little short, so no ratio is in REDER's favour);
#   compile  bench.peers --engines reder --compile: the trunk under torch.compile with CUDA graphs (compiling its
#            buckets took over 80 s on an H200: a part of its own, so that the eager numbers come back without it);
#   tests    `pytest -m gpu` on the GPU test files, the quick ones first.
#
#   bash bench/gpu_env/gpu_checks.sh      on the GPU machine; carry what the parts need:
#     - bench/gpu_env/data (the Multi30k files: bench/README.md "The GPU machine");
#     - .whl (CTranslate2's wheel for CPython 3.12, `pip download`, bench/README.md): installed into /tmp/ct2-site;
#       without it the ct2 engine is skipped. CTranslate2's wheels load CUDA 12's cuBLAS (libcublas.so.12) when
#       they first multiply; where the machine has only CUDA 13's, a link libcublas.so.12 -> libcublas.so.13 is
#       made in /tmp/cublas12 and env.log says so (not yet tried on a GPU: peers.log says whether it worked);
#     - bench/gpu_env/site.tar.xz (pack.sh: Ray and MLflow) for tests/pipeline/test_gpu.py, whose tests start
#       Ray; without it that file is left out and the other test files run. The wheel (43 MB) and the bundle
#       (37 MB) do not travel together (64 MiB): a call with the wheel, then one with the bundle (PARTS=tests).
# Environment: OUT (the device tool's; a temporary directory when unset), PARTS (default "peers compile tests"),
# PEERS_S (default 200), COMPILE_S (240), TESTS_S (170: all ten `gpu` tests took 162 s on an H200), TEST_FILES
# (default every file with `gpu` tests), PEERS_ARGS (more bench.peers arguments, after the script's), DEVICE (default
# cuda; `DEVICE=cpu PYTHON=.venv/bin/python PEERS_ARGS="--d-model 64 --ffn 128 --layers 1 --vocab 2000 --sentences 6
# --repeats 1"` rehearses it here: the gpu tests skip, bench.peers runs on the CPU).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"  # a rehearsal's OUT may not exist yet (the device tool's does)
device=${DEVICE:-cuda}
parts=" ${PARTS:-peers compile tests} "
started=$(date +%s)
elapsed() { echo $(( $(date +%s) - started )); }
data=$root/../shared/data/multi30k  # ../shared stays behind: on the GPU machine, the carried copy
files=(${TEST_FILES:-tests/reder/test_ctc.py tests/reder/test_autoregressive.py tests/reder/test_dag_triton.py
       tests/reder/test_static.py tests/reder/test_attention.py tests/pipeline/test_gpu.py})
if [ "$device" = cuda ]; then
  python=python3
  data=$root/bench/gpu_env/data/multi30k
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/env.log"
  if [ -f "$here/site.tar.xz" ]; then
    bash "$here/unpack.sh" > /tmp/env.sh && . /tmp/env.sh || exit 1
    export RAY_AUTH_MODE=disabled
  else  # no Ray here: the test file that starts it stays out
    files=($(printf '%s\n' "${files[@]}" | grep -v '^tests/pipeline/test_gpu.py$'))
    echo "no bundle (bench/gpu_env/site.tar.xz): tests/pipeline/test_gpu.py left out" | tee -a "$out/env.log"
  fi
  export PYTHONPATH=$root:${PYTHONPATH:-}
  wheel=$(ls "$root"/.whl/ctranslate2-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ct2-site "$wheel" \
      >> "$out/env.log" 2>&1 && export PYTHONPATH=$PYTHONPATH:/tmp/ct2-site
    if ! ldconfig -p | grep -q 'libcublas\.so\.12 '; then
      found=$(timeout 60 find /opt /usr /lib \( -name 'libcublas.so.12' -o -name 'libcublas.so.13' \) 2>/dev/null | sort | head -5)
      echo "cuBLAS here: $(echo $found)" | tee -a "$out/env.log"
      twelve=$(echo "$found" | grep 'so\.12$' | head -1)
      thirteen=$(echo "$found" | grep 'so\.13$' | head -1)
      if [ -n "$twelve" ]; then
        export LD_LIBRARY_PATH=$(dirname "$twelve")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
      elif [ -n "$thirteen" ]; then
        mkdir -p /tmp/cublas12 && ln -sf "$thirteen" /tmp/cublas12/libcublas.so.12
        lt=$(dirname "$thirteen")/libcublasLt.so.13
        [ -e "$lt" ] && ln -sf "$lt" /tmp/cublas12/libcublasLt.so.12
        export LD_LIBRARY_PATH=/tmp/cublas12:$(dirname "$thirteen")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        echo "CTranslate2 runs on CUDA 13's cuBLAS through /tmp/cublas12/libcublas.so.12 -> $thirteen" | tee -a "$out/env.log"
      fi
    fi
    $python -c "import ctranslate2 as c; print('ctranslate2', c.__version__, 'cuda devices', c.get_cuda_device_count(),
    'compute types', sorted(c.get_supported_compute_types('cuda')))" >> "$out/env.log" 2>&1
  fi
else
  python=${PYTHON:-python3}
fi
export PYTHONUNBUFFERED=1
echo "environment ready after $(elapsed) s" | tee -a "$out/env.log"

if [[ $parts == *" peers "* ]]; then
  timeout -k 10 "${PEERS_S:-200}" $python -m bench.peers --device "$device" --engines reder,teacher,ct2 --sentences 100 \
    --ar-tokens 14 --latency-repeats 3 --data "$data" --out "$out/peers.json" ${PEERS_ARGS:-} > "$out/peers.log" 2>&1
  echo "bench.peers: exit $? after $(elapsed) s" | tee -a "$out/peers.log"
fi
if [[ $parts == *" compile "* ]]; then
  timeout -k 10 "${COMPILE_S:-240}" $python -m bench.peers --device "$device" --engines reder --compile --sentences 100 \
    --data "$data" --out "$out/peers_compile.json" ${PEERS_ARGS:-} > "$out/compile.log" 2>&1
  echo "bench.peers --compile: exit $? after $(elapsed) s" | tee -a "$out/compile.log"
fi
# The quick tests first: the CTC alignment on CUDA, the teachers' batched search, the DAG kernels, CUDA graphs of
# the inference trunk, the attention without cuDNN; then the harness, distill and train stage on the GPU (two of
# them start Ray: about a minute each on an H200).
if [[ $parts == *" tests "* ]]; then
  timeout -k 10 "${TESTS_S:-170}" $python -m pytest -m gpu -q -rs -p no:cacheprovider --durations 10 "${files[@]}" \
    > "$out/gpu_tests.log" 2>&1
  echo "gpu tests: exit $? after $(elapsed) s" | tee -a "$out/gpu_tests.log"
fi
echo "files in $out: $(ls "$out" | tr '\n' ' ')"
