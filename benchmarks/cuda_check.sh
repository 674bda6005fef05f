#!/usr/bin/env bash
# The CUDA check, in one run of a few minutes on a GPU host whose python3 has torch (with its
# Triton) and transformers, and semantic's other dependencies: the GPU's clocks logged all along
# and the GPU warmed before anything is timed; the CUDA kernels' and graphs' tests and every
# family against transformers on CUDA (Triton kernels with and without decode graphs, and the
# stock torch path); the kernels alone and the runner against transformers' own loops; and
# `semantic bench` on a random-weight SmolLM2-shaped model (a GPU host may have no weights and
# no network). Each step keeps its output in OUT_DIR; `summary.md` puts them in one file.
#
#   benchmarks/cuda_check.sh OUT_DIR TOKENIZER_DIR
#
# TOKENIZER_DIR holds tokenizer.json and the chat template; on a machine with the bundled model,
# `cd benchmarks && python random_model.py DIR --tokenizer-only` writes one. DEVICE=cpu and
# QUICK=1 run the same steps small, on the CPU, to try the script before a GPU is at hand
# (the Triton kernels then run in Triton's interpreter; ~4 min here). STEPS=name,name runs only
# those steps; where a command may run 10 minutes at most, run it in two, each warming the GPU:
#   STEPS=warm-up,kernels,correctness,attention-kernels,layer-kernels
#   STEPS=warm-up,micro-smollm2,random-model,bench,micro-llama-1b
set -uo pipefail
out=${1:?output folder}
tokenizer=$(realpath "${2:?tokenizer folder}")
device=${DEVICE:-cuda}
mkdir -p "$out"
out=$(realpath "$out")
python=$(command -v "${PYTHON:-python3}")
[[ $python == /* ]] || python=$PWD/$python  # the steps below change folders
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [[ $device == cpu ]]; then
    export TRITON_INTERPRET=1
fi
if [[ ${QUICK:-0} == 1 ]]; then
    micro=(--runs 1 --steps 2 --context 256 --batch 4)
    bench=(--history-sizes 500 --repeats 1 --max-tokens 16)
    kernel_bench=(--quick)
else
    micro=(--runs "${RUNS:-3}" --steps 32 --context 1000 --batch 32)
    bench=(--repeats 2)
    kernel_bench=()
fi
status=0
: >"$out/summary.md"

step() {  # step NAME COMMAND...: run it, keep its output, remember a failure and go on
    local name=$1
    shift
    if [[ -n ${STEPS:-} && ,$STEPS, != *,$name,* ]]; then
        return
    fi
    echo "== $name: $*"
    local started=$SECONDS
    "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    ((rc == 0)) || status=1
    {
        echo "## $name (exit $rc, $((SECONDS - started)) s)"
        echo '```'
        tail -n "${SUMMARY_LINES:-40}" "$out/$name.txt"
        echo '```'
    } >>"$out/summary.md"
}

clocks_pid=
if [[ $device == cuda ]]; then
    nvidia-smi -L
    # The SM and memory clocks every 100 ms for the whole run: a GPU after an idle spell ran
    # 4-5x slower for its first seconds, and the log says which timings fell there.
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,utilization.gpu,temperature.gpu,power.draw \
        --format=csv -lms 100 >"$out/clocks.csv" &
    clocks_pid=$!
    # busy for 8 s, until the clocks have ramped up
    step warm-up "$python" -c 'import sys; sys.path.insert(0, "benchmarks")
from cuda_attention import warm_gpu
warm_gpu(8.0)'
fi

pytest=("$python" -m pytest -q -p no:cacheprovider)
step kernels "${pytest[@]}" tests/unit/test_cuda_attention.py tests/unit/test_cuda_layers.py \
    tests/unit/test_decode_graphs.py
step correctness "${pytest[@]}" tests/integration/test_families_vs_transformers.py \
    tests/unit/test_kv_int8.py tests/unit/test_int8_weights.py -k "$device"
step attention-kernels "$python" benchmarks/cuda_attention.py --device "$device" "${kernel_bench[@]}"
step layer-kernels "$python" benchmarks/cuda_layers.py --device "$device" "${kernel_bench[@]}"
step micro-smollm2 "$python" benchmarks/runner_microbench.py --device "$device" \
    --shape smollm2-135m --quiet 1 "${micro[@]}"
model=$(mktemp -d)
step random-model bash -c "cd benchmarks && $python random_model.py $model --tokenizer $tokenizer"
step bench "$python" -m semantic bench --model "$model" --no-baseline \
    --phases "${PHASES:-decode,concurrent,prefill,history}" "${bench[@]}" \
    --json "$out/bench.json" -- --device "$device"
rm -rf "$model"
[[ ${QUICK:-0} == 1 ]] || step micro-llama-1b "$python" benchmarks/runner_microbench.py \
    --device "$device" --shape llama-1b --quiet 1 "${micro[@]}"
if [[ -n $clocks_pid ]]; then
    kill "$clocks_pid"
    # The clocks' range over the run, for the summary.
    "$python" - "$out/clocks.csv" >>"$out/summary.md" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))[1:]
sm = [int(r[1].split()[0]) for r in rows if len(r) > 2 and r[1].strip()[0].isdigit()]
mem = [int(r[2].split()[0]) for r in rows if len(r) > 2 and r[2].strip()[0].isdigit()]
if sm:
    print(f"## clocks: SM {min(sm)}-{max(sm)} MHz (median {sorted(sm)[len(sm) // 2]}), "
          f"memory {min(mem)}-{max(mem)} MHz, {len(sm)} samples")
EOF
fi
exit $status
