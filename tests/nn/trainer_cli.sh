#!/usr/bin/env bash
# trainer_cli.sh - examples/train as a user drives it: a JSON config (flags override it), the
# byte-level loader on a text file, the progress and final lines, the JSONL metrics, the loss
# curve PNG when gnuplot is installed, and clear failures for a bad config key, a missing data
# file and a bad flag.
#   trainer_cli.sh MPIEXEC TRAIN_BINARY SOURCE_DIR WORKDIR
set -euo pipefail
MPI=$1 TRAIN=$2 SRC=$3 W=$4
mkdir -p "$W"
run() { "$MPI" --allow-run-as-root --oversubscribe "$@"; }
cat > "$W/cfg.json" <<JSON
{"steps": 4, "batch": 4, "seq": 16, "dim": 32, "layers": 1, "heads": 4, "data": "$SRC/README.md",
 "lr": 0.003, "metrics": "$W/m.jsonl", "plot": "$W/loss.png", "mesh": "2"}
JSON
run -np 2 "$TRAIN" --config "$W/cfg.json" --steps 5 > "$W/out.txt" 2>&1 || { cat "$W/out.txt"; exit 1; }
grep -q "vocab 256" "$W/out.txt" || { echo "byte-level corpus not used"; cat "$W/out.txt"; exit 1; }
[ "$(grep -c '^step ' "$W/out.txt")" -eq 5 ] || { echo "expected 5 step lines (flag overrides config)"; exit 1; }
grep -Eq '^step +4 loss [0-9.]+ lr .* tokens/s [0-9]+ GFLOP/s [0-9.]+ MFU [0-9.]+%' "$W/out.txt" || { echo "bad progress line"; exit 1; }
[ "$(grep -Ec '^peak_memory rank [01]: parameters=[0-9.]+MiB gradients=[0-9.]+MiB optimizer=[0-9.]+MiB activations=[0-9.]+MiB communication=[0-9.]+MiB other=[0-9.]+MiB total=[0-9.]+MiB$' "$W/out.txt")" -eq 2 ] || { echo "expected a peak_memory line per rank"; cat "$W/out.txt"; exit 1; }
tail -1 "$W/out.txt" | grep -Eq '^final_loss=[0-9.]+ entropy_floor=nan tokens_per_s=[0-9]+$' || { echo "bad final line"; tail -1 "$W/out.txt"; exit 1; }
[ "$(wc -l < "$W/m.jsonl")" -eq 5 ] || { echo "metrics: expected 5 lines"; exit 1; }
grep -q '"mfu":' "$W/m.jsonl" || { echo "metrics lack mfu"; exit 1; }
if command -v gnuplot > /dev/null; then
  [ -s "$W/loss.png" ] || { echo "no loss curve although gnuplot is installed"; exit 1; }
fi
echo '{"stepz": 3}' > "$W/bad.json"
if run -np 1 "$TRAIN" --config "$W/bad.json" > "$W/bad.txt" 2>&1; then echo "bad key accepted"; exit 1; fi
grep -q "unknown config key 'stepz'" "$W/bad.txt" || { cat "$W/bad.txt"; exit 1; }
if run -np 1 "$TRAIN" --data "$W/nope.txt" --steps 1 > "$W/nofile.txt" 2>&1; then echo "missing file accepted"; exit 1; fi
grep -q "cannot open" "$W/nofile.txt" || { cat "$W/nofile.txt"; exit 1; }
if run -np 1 "$TRAIN" --frobnicate 3 > "$W/flag.txt" 2>&1; then echo "bad flag accepted"; exit 1; fi
grep -q "bad argument '--frobnicate'" "$W/flag.txt" || { cat "$W/flag.txt"; exit 1; }
echo "trainer_cli: passed"
