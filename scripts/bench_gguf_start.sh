#!/usr/bin/env bash
# One GGUF file served by radixlm and by llama.cpp, one server at a time: first start to
# healthy, each process's RSS while serving, one stream and 16 at once.
#
#   bash scripts/bench_gguf_start.sh FILE.gguf [out_dir] [engine ...]
#
# engines: radixlm (defaults: the file's block formats on the CPU), llama (llama.cpp
# server from ~/peer-llama, ../shared/peers/README.md). radixlm's first start runs with
# an empty RADIXLM_CACHE_DIR (out_dir/cache), so it includes the folder's conversion.
# Each engine: start until /v1/models answers (s), RSS of the server and its children
# (MB), then bench_serving at concurrency 1 (4 requests) and 16 (16 requests), OUTPUT_LEN
# tokens each (default 128), ~40-token chat prompts, temperature 0; then the TTFT of two
# ~2,000-token random prompts with max_tokens 1. RSS is printed when idle after the
# start, after the c1 run and after the 2k prompts, each with the largest process's
# smaps breakdown in out_dir/smaps-ENGINE-STAGE.txt (scripts/rss_breakdown.py).
set -euo pipefail
cd "$(dirname "$0")/.."
FILE=$(realpath "$1"); shift
OUT=${1:-/tmp/bench-gguf}; shift || true
ENGINES=${*:-"radixlm llama"}
OUTPUT_LEN=${OUTPUT_LEN:-128}
PORT=18091
PY=.venv/bin/python
mkdir -p "$OUT"
PID=""
stop() { if [ -n "$PID" ]; then kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; PID=""; fi; }
trap stop EXIT

rss() {  # RSS (MB) of $PID and each descendant, by command; $1: the stage, for
  # $OUT/smaps-ENGINE-STAGE.txt (scripts/rss_breakdown.py of the largest process)
  $PY - "$PID" "$1" "$OUT/smaps-$engine-$1.txt" <<'EOF'
import sys, psutil
sys.path.insert(0, "scripts")
from rss_breakdown import report
p = psutil.Process(int(sys.argv[1]))
largest = (0, 0)
for q in [p, *p.children(recursive=True)]:
    try:
        rss = q.memory_info().rss
        print(f"  rss {rss / 2**20:7.0f} MB  pid {q.pid}  {sys.argv[2]}  {' '.join(q.cmdline())[:80]}")
        largest = max(largest, (rss, q.pid))
    except psutil.Error:
        pass
with open(sys.argv[3], "w") as f:
    f.write(report(largest[1], 16) + "\n")
EOF
}

echo "file: $FILE ($(( $(stat -c %s "$FILE") / 1048576 )) MiB); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); $(date -u)"
for engine in $ENGINES; do
  case $engine in
    radixlm)
      rm -rf "$OUT/cache"
      cmd=(env RADIXLM_CACHE_DIR="$OUT/cache" .venv/bin/radixlm serve --model-path "$FILE" --port $PORT) ;;
    llama)
      cmd=("$HOME/peer-llama/bin/python" -m llama_cpp.server --model "$FILE" --host 127.0.0.1
           --port $PORT --n_ctx 4096 --n_threads 2 --n_threads_batch 2 --interrupt_requests False) ;;
    *) echo "unknown engine $engine"; continue ;;
  esac
  echo "### $engine"
  t0=$(date +%s.%N)
  "${cmd[@]}" > "$OUT/$engine.log" 2>&1 &
  PID=$!
  until curl -sf "127.0.0.1:$PORT/v1/models" > /dev/null; do
    kill -0 "$PID" 2>/dev/null || { echo "$engine did not start (see $OUT/$engine.log)"; PID=""; continue 2; }
    sleep 0.2
  done
  echo "start to healthy: $(echo "$(date +%s.%N) - $t0" | bc) s"
  sleep 2; rss idle
  for c in 1 16; do
    n=$(( c == 1 ? 4 : 16 ))
    $PY -m radixlm.bench.serving --base-url "http://127.0.0.1:$PORT" --label "$engine-c$c" \
      --concurrency $c --num-prompts $n --output-len "$OUTPUT_LEN" --warmup 1 --disable-tqdm \
      --output-file "$OUT/runs.jsonl" | { grep -E "==|requests:|throughput|TTFT|TPOT|error" || true; }
    if [ $c = 1 ]; then rss after-c1; fi
  done
  $PY -m radixlm.bench.serving --base-url "http://127.0.0.1:$PORT" --label "$engine-2k" \
    --dataset random --random-input-len 2000 --output-len 1 --concurrency 1 --num-prompts 2 \
    --warmup 0 --disable-tqdm --output-file "$OUT/prefill.jsonl" | { grep -E "==|requests:|TTFT|error" || true; }
  rss after-2k
  stop
done
