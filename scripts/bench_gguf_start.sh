#!/usr/bin/env bash
# One GGUF file served by radixlm, llama.cpp and vLLM-CPU, one server at a time: first start
# to healthy, each process's RSS while serving, one stream and 16 at once, a ~2,000-token
# prompt's TTFT.
#
#   bash scripts/bench_gguf_start.sh FILE.gguf [out_dir] [engine ...]
#
# engines (default: radixlm llama):
#   radixlm  the file with radixlm's defaults (its block formats on the CPU) and any flags in
#            RADIXLM_ARGS (e.g. "--kv-cache-dtype bfloat16"); the first start runs with an
#            empty RADIXLM_CACHE_DIR (out_dir/cache), so it includes the folder's conversion
#            (config and tokenizer).
#   llama    llama.cpp's server from ~/peer-llama (../shared/peers/README.md), 2 threads.
#   vllm     vLLM-CPU from ~/peer-vllm on a float Hugging Face folder of the same weights
#            (FLOAT_DIR, default FILE without .gguf + "-hf-float32"; written first by
#            scripts/gguf_to_hf_float.py when missing, outside the timings), --dtype
#            VLLM_DTYPE (default bfloat16 where the CPU has avx512_bf16, else float32),
#            VLLM_KV_GB of KV cache (default 4).
# Each engine: start until /v1/models answers (s, at most START_TIMEOUT, default 600), RSS of
# the server and its children (MB) after the one-stream run and after the long prompts; one
# short warm-up request, then bench_serving at concurrency 1 (C1_PROMPTS requests, default 3)
# and 16 (16 requests), OUTPUT_LEN tokens each (default 128), ~40-token chat prompts,
# temperature 0, REPEAT runs each (default 1); then the TTFT of two ~2,000-token random
# prompts with max_tokens 1. One JSON line per engine goes to out_dir/summary.jsonl (the
# medians over the repeats), bench_serving's runs to out_dir/runs.jsonl and prefill.jsonl.
# RSS is printed when idle after the start, after the c1 run and after the 2k prompts, each
# with the largest process's smaps breakdown in out_dir/smaps-LABEL-STAGE.txt
# (scripts/rss_breakdown.py). Nothing is left running: the trap stops the server on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
FILE=$(realpath "$1"); shift
OUT=${1:-/tmp/bench-gguf}; shift || true
ENGINES=${*:-"radixlm llama"}
OUTPUT_LEN=${OUTPUT_LEN:-128}
REPEAT=${REPEAT:-1}
C1_PROMPTS=${C1_PROMPTS:-3}
START_TIMEOUT=${START_TIMEOUT:-600}
FLOAT_DIR=${FLOAT_DIR:-${FILE%.gguf}-hf-float32}
VLLM_DTYPE=${VLLM_DTYPE:-$(grep -q avx512_bf16 /proc/cpuinfo && echo bfloat16 || echo float32)}
VLLM_KV_GB=${VLLM_KV_GB:-4}
TAG=$(basename "$FILE" .gguf)
PORT=18091
PY=.venv/bin/python
mkdir -p "$OUT"
PID=""
stop() {
  if [ -n "$PID" ]; then
    pkill -TERM -P "$PID" 2>/dev/null || true   # the server's own children (vLLM's engine core)
    kill "$PID" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$PID" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    PID=""
  fi
}
trap stop EXIT
trap 'exit 130' INT TERM

rss() {  # RSS (MB) of $PID and each descendant, by command, and their sum; $1: the stage;
  # the sum goes to $OUT/.rss-STAGE, the largest process's smaps breakdown to
  # $OUT/smaps-LABEL-STAGE.txt (scripts/rss_breakdown.py)
  $PY - "$PID" "$1" "$OUT/.rss-$1" "$OUT/smaps-$label-$1.txt" <<'PYEOF'
import sys, psutil
sys.path.insert(0, "scripts")
from rss_breakdown import report
p = psutil.Process(int(sys.argv[1]))
total, largest = 0.0, (0, 0)
for q in [p, *p.children(recursive=True)]:
    try:
        rss = q.memory_info().rss
        print(f"  rss {rss / 2**20:7.0f} MB  pid {q.pid}  {sys.argv[2]}  {' '.join(q.cmdline())[:80]}")
        total += rss / 2**20
        largest = max(largest, (rss, q.pid))
    except psutil.Error:
        pass
print(f"  rss {total:7.0f} MB  all together  {sys.argv[2]}")
with open(sys.argv[3], "w") as f:
    f.write(f"{total:.0f}")
with open(sys.argv[4], "w") as f:
    f.write(report(largest[1], 16) + "\n")
PYEOF
}

serving() {  # label, output file, bench_serving arguments...
  local label=$1 file=$2; shift 2
  $PY -m radixlm.bench.serving --base-url "http://127.0.0.1:$PORT" --label "$label" \
    --warmup 0 --disable-tqdm --output-file "$file" "$@" \
    | { grep -E "==|requests:|throughput|TTFT|TPOT|spread|error" || true; }
}

echo "file: $FILE ($(( $(stat -c %s "$FILE") / 1048576 )) MiB); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); $(date -u)"
echo "radixlm commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- radixlm || echo '+changes')"
for engine in $ENGINES; do
  case $engine in
    radixlm)
      rm -rf "$OUT/cache"
      # shellcheck disable=SC2206  # RADIXLM_ARGS: extra flags, split on spaces
      cmd=(env RADIXLM_CACHE_DIR="$OUT/cache" .venv/bin/radixlm serve --model-path "$FILE"
           --host 127.0.0.1 --port $PORT ${RADIXLM_ARGS:-}) ;;
    llama)
      [ -x "$HOME/peer-llama/bin/python" ] || { echo "skip llama: no ~/peer-llama"; continue; }
      cmd=("$HOME/peer-llama/bin/python" -m llama_cpp.server --model "$FILE" --host 127.0.0.1
           --port $PORT --n_ctx 4096 --n_threads 2 --n_threads_batch 2 --interrupt_requests False) ;;
    vllm)
      [ -x "$HOME/peer-vllm/bin/python" ] || { echo "skip vllm: no ~/peer-vllm"; continue; }
      if [ ! -f "$FLOAT_DIR/model.safetensors.index.json" ]; then
        echo "writing $FLOAT_DIR (float32) from the file first"
        $PY scripts/gguf_to_hf_float.py "$FILE" "$FLOAT_DIR"
      fi
      cmd=(env VLLM_CPU_KVCACHE_SPACE="$VLLM_KV_GB" VLLM_CPU_OMP_THREADS_BIND=0-1 HF_HUB_OFFLINE=1
           "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:$HOME/peer-vllm/lib/libiomp5.so"
           "$HOME/peer-vllm/bin/python" -m vllm.entrypoints.openai.api_server --model "$FLOAT_DIR"
           --served-model-name default --host 127.0.0.1 --port $PORT --dtype "$VLLM_DTYPE"
           --max-model-len 4096) ;;
    *) echo "unknown engine $engine"; continue ;;
  esac
  label="$engine-$TAG"
  echo "### $label"
  lines0=0; [ -f "$OUT/runs.jsonl" ] && lines0=$(wc -l < "$OUT/runs.jsonl")
  plines0=0; [ -f "$OUT/prefill.jsonl" ] && plines0=$(wc -l < "$OUT/prefill.jsonl")
  t0=$(date +%s.%N)
  "${cmd[@]}" > "$OUT/$label.log" 2>&1 &
  PID=$!
  started=0
  while [ "$(echo "$(date +%s.%N) - $t0 < $START_TIMEOUT" | bc)" = 1 ]; do
    if curl -sf "127.0.0.1:$PORT/v1/models" > /dev/null; then started=1; break; fi
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.2
  done
  if [ $started = 0 ]; then
    echo "$engine did not start in $START_TIMEOUT s (see $OUT/$label.log)"; stop; continue
  fi
  start_s=$(echo "$(date +%s.%N) - $t0" | bc)
  echo "start to healthy: $start_s s"
  sleep 2; rss idle
  serving "$label-warmup" /dev/null --concurrency 1 --num-prompts 1 --output-len 8 > /dev/null
  serving "$label-c1" "$OUT/runs.jsonl" --concurrency 1 --num-prompts "$C1_PROMPTS" \
    --output-len "$OUTPUT_LEN" --repeat "$REPEAT"
  rss after-c1
  serving "$label-c16" "$OUT/runs.jsonl" --concurrency 16 --num-prompts 16 \
    --output-len "$OUTPUT_LEN" --repeat "$REPEAT"
  serving "$label-2k" "$OUT/prefill.jsonl" --dataset random --random-input-len 2000 \
    --output-len 1 --concurrency 1 --num-prompts 2
  rss after-2k
  stop
  $PY - "$OUT" "$label" "$engine" "$FILE" "$start_s" "$(cat "$OUT/.rss-after-c1")" "$(cat "$OUT/.rss-after-2k")" \
      "$(git rev-parse --short HEAD)" "$OUTPUT_LEN" "$lines0" "$plines0" <<'PYEOF'
import json, os, statistics, sys, time
out, label, engine, file, start_s, rss1, rss2, commit, olen, l0, p0 = sys.argv[1:]
def runs(name, lab):  # this invocation's runs: the lines after those the file had before
    with open(f"{out}/{name}") as f:
        lines = f.read().splitlines()[int(l0 if name == "runs.jsonl" else p0):]
    return [r for r in map(json.loads, filter(str.strip, lines)) if r["label"] == lab]
def med(rs, key, sub=None, scale=1.0):
    xs = [(r[key][sub] if sub else r[key]) * scale for r in rs]
    return round(statistics.median(xs), 3) if xs else None
c1, c16, pre = runs("runs.jsonl", f"{label}-c1"), runs("runs.jsonl", f"{label}-c16"), \
    runs("prefill.jsonl", f"{label}-2k")
row = {"engine": engine, "file": file, "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
       "radixlm_commit": commit if engine == "radixlm" else None,
       "radixlm_args": os.environ.get("RADIXLM_ARGS", "") if engine == "radixlm" else None,
       "output_len": int(olen),
       "start_s": round(float(start_s), 1), "rss_mb_c1": int(rss1), "rss_mb_after_2k": int(rss2),
       "c1_tok_s": med(c1, "output_throughput"),
       "c1_tpot_p50_ms": med(c1, "tpot", "p50", 1e3), "c16_tok_s": med(c16, "output_throughput"),
       "ttft_2k_p50_s": med(pre, "ttft", "p50"), "repeats": len(c1),
       "failed": sum(r["num_failed"] for r in c1 + c16 + pre)}
print("summary:", json.dumps(row))
with open(f"{out}/summary.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
PYEOF
done
