#!/usr/bin/env bash
# The CUDA check, on a GPU host whose python3 has torch and transformers (and semantic's other
# dependencies): our model against transformers on the GPU, the runner microbenchmark against
# transformers' own decode loop, and `semantic bench` on a random-weight SmolLM2-shaped model
# (a GPU host may have no weights and no network).
#
#   benchmarks/cuda_check.sh OUT_DIR TOKENIZER_DIR
#
# TOKENIZER_DIR holds tokenizer.json and the chat template; on a machine with the bundled model,
# `cd benchmarks && python random_model.py DIR --tokenizer-only` writes one. DEVICE=cpu and
# QUICK=1 run the same steps small, on the CPU, to try the script before a GPU is at hand.
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
if [[ ${QUICK:-0} == 1 ]]; then
    micro=(--runs 1 --steps 2 --context 256 --batch 4)
    bench=(--history-sizes 500 --repeats 1 --max-tokens 16)
else
    micro=(--runs "${RUNS:-3}" --steps 32 --context 1000 --batch 32)
    bench=(--repeats 2)
fi
status=0

step() {  # step NAME COMMAND...: run it, keep its output, remember a failure and go on
    local name=$1
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$out/$name.txt"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    ((rc == 0)) || status=1
}

nvidia-smi -L
step correctness "$python" -m pytest -q -p no:cacheprovider \
    tests/integration/test_llama_vs_transformers.py -k "$device"
step micro-smollm2 "$python" benchmarks/runner_microbench.py --device "$device" \
    --shape smollm2-135m --quiet 1 "${micro[@]}"
model=$(mktemp -d)
step random-model bash -c "cd benchmarks && $python random_model.py $model --tokenizer $tokenizer"
step engine-profile "$python" benchmarks/engine_profile.py --model "$model" --device "$device" \
    --tokens 64 --top 40
step bench "$python" -m semantic bench --model "$model" --no-baseline \
    --phases "${PHASES:-decode,concurrent,prefill,history}" "${bench[@]}" \
    --json "$out/bench.json" -- --device "$device"
rm -rf "$model"
[[ ${QUICK:-0} == 1 ]] || step micro-llama-1b "$python" benchmarks/runner_microbench.py \
    --device "$device" --shape llama-1b --quiet 1 "${micro[@]}"
exit $status
