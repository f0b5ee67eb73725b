#!/usr/bin/env bash
# resume.sh - save, resume and reshard with the trainer (examples/train --checkpoint-dir ...):
#  - dense: 6 steps under FSDP on 4 ranks, saving every 3 steps (asynchronously; the save line
#    gives size, time and stall); the run resumed from step 3 on the same layout repeats steps
#    3-5 bit for bit (loss and gradient norm, printed with 9 digits); resumed on 1 rank (no
#    parallelism), on 2 (--tp 2), on 4 as HSDP 2x2, as --dp 2 --tp 2 and as --dp 2 --cp 2
#    (parameters sharded over dp x cp), each step's loss within
#    1e-5 of the uninterrupted run;
#  - MoE: 4 steps under --dp 2 --tp 2 --ep 2 on 8 ranks (experts sharded over ep, saved every 2
#    steps), resumed from step 2 under FSDP on 4 ranks and on 1 rank: losses within 1e-5;
#  - a seed checkpoint (--steps 0 on 1 rank) trained from under FSDP on 4 ranks matches the run
#    that initialized itself, within 1e-5; so does the seed consolidated and imported again
#    (parameters only: fresh AdamW state, step 0), given as --resume-from DIR (DIR/latest);
#  - keep_last 1 leaves one checkpoint; --resume with an empty directory starts at step 0; a
#    resume onto another model (wider) fails with a message naming the tensor and the shapes.
#  - conversions (--resume-from with nothing left to train saves what it loaded): the dense step-3
#    checkpoint onto 1 rank, --tp 2, HSDP 2x2, --dp 2 --tp 2, --dp 2 --cp 2 and back to FSDP on
#    4; the MoE one
#    from --dp 2 --tp 2 --ep 2 on 8 ranks onto FSDP on 4, 1 rank, and back to 8: every tensor,
#    parameters and AdamW state, bit-identical to the saved one (dtensor-ckpt consolidate, cmp).
# RESUME_SKIP='REGEX' leaves out the dense resumes whose line ("NP TOL ARGS") matches (the
# sanitized build: the conversions below load the same layouts bit for bit).
#   resume.sh MPIEXEC TRAIN_BINARY WORKDIR DTENSOR_CKPT
set -euo pipefail
MPI=$1 TRAIN=$2 W=$3 CKPT=$4
rm -rf "$W"
mkdir -p "$W"
run() { "$MPI" --allow-run-as-root --oversubscribe "$@" < /dev/null; }
export DTENSOR_QUIET=1
DENSE="--steps 6 --dim 32 --layers 2 --heads 4 --kv-heads 2 --vocab 64 --seq 16 --batch 8 --warmup 2 --lr 0.01"
MOE="--steps 4 --dim 32 --layers 2 --heads 4 --vocab 64 --seq 16 --batch 8 --warmup 2 --lr 0.01 --model moe --experts 4"

# copy of a checkpoint directory rewound to step $3 (the later ones removed)
rewind() {
  rm -rf "$2"
  cp -r "$1" "$2"
  for d in "$2"/step_*; do
    n=$(basename "$d")
    [ "$((10#${n#step_}))" -le "$3" ] || rm -rf "$d"
  done
  printf 'step_%08d\n' "$3" > "$2/latest"
}

# losses of steps >= $3 in metrics files $1 (reference) and $2 agree within $4 (0: bitwise)
compare() {
  python3 - "$@" <<'PY'
import json, sys
ref, got, first, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
def load(p):
    return {d["step"]: d for d in (json.loads(l) for l in open(p))}
a, b = load(ref), load(got)
steps = sorted(s for s in a if s >= first)
assert steps and sorted(b) == steps, f"{got}: steps {sorted(b)}, expected {steps}"
for s in steps:
    for k in (["loss", "grad_norm"] if tol == 0 else ["loss"]):
        x, y = a[s][k], b[s][k]
        ok = x == y if tol == 0 else abs(x - y) <= tol
        assert ok, f"{got}: step {s} {k} {y!r} vs {x!r} uninterrupted (tolerance {tol})"
print(f"ok {got}: steps {steps[0]}-{steps[-1]} within {tol}")
PY
}

# dense, FSDP on 4 ranks, async saves every 3 steps
run -np 4 "$TRAIN" $DENSE --parallel fsdp --checkpoint-dir "$W/ck" --checkpoint-every 3 \
  --async-checkpoint --metrics "$W/full.jsonl" > "$W/full.txt" 2>&1 || { cat "$W/full.txt"; exit 1; }
grep -Eq '^# checkpoint step_00000003: [0-9.]+ MiB of tensors, training stalled [0-9.]+ s \(writing in the background\)$' "$W/full.txt" || { echo "no async save line"; cat "$W/full.txt"; exit 1; }
grep -Eq '^# checkpoint step_00000006 saved: [0-9.]+ MiB in files, [0-9.]+ s, training stalled [0-9.]+ s$' "$W/full.txt" || { echo "no saved line"; cat "$W/full.txt"; exit 1; }
[ -d "$W/ck/step_00000003" ] && [ -d "$W/ck/step_00000006" ] || { echo "missing checkpoints"; ls "$W/ck"; exit 1; }
[ "$(cat "$W/ck/latest")" = step_00000006 ] || { echo "latest is not step 6"; exit 1; }

i=0
while read -r np tol args; do
  i=$((i + 1))
  rewind "$W/ck" "$W/r$i" 3
  run -np "$np" "$TRAIN" $DENSE $args --checkpoint-dir "$W/r$i" --resume \
    --metrics "$W/r$i.jsonl" > "$W/r$i.txt" 2>&1 || { cat "$W/r$i.txt"; exit 1; }
  grep -q "^# resumed from $W/r$i/step_00000003 at step 3" "$W/r$i.txt" || { echo "run $i did not resume"; cat "$W/r$i.txt"; exit 1; }
  compare "$W/full.jsonl" "$W/r$i.jsonl" 3 "$tol"
done < <(grep -Ev "${RESUME_SKIP:-^$}" <<EOF
4 0 --parallel fsdp
1 1e-5
2 1e-5 --tp 2
4 1e-5 --parallel hsdp --mesh 2x2
4 1e-5 --dp 2 --tp 2
4 1e-5 --dp 2 --cp 2
EOF
)

# MoE: FSDP x TP x EP on 8 ranks, resumed under FSDP on 4 and on 1
run -np 8 "$TRAIN" $MOE --dp 2 --tp 2 --ep 2 --checkpoint-dir "$W/moe" --checkpoint-every 2 \
  --metrics "$W/moe.jsonl" > "$W/moe.txt" 2>&1 || { cat "$W/moe.txt"; exit 1; }
grep -q "expert parallel over mesh dim" "$W/moe.txt" || { echo "MoE did not run expert parallel"; exit 1; }
for spec in "4 --parallel fsdp" "1"; do
  set -- $spec
  np=$1
  shift
  rewind "$W/moe" "$W/moe_r$np" 2
  run -np "$np" "$TRAIN" $MOE "$@" --checkpoint-dir "$W/moe_r$np" --resume \
    --metrics "$W/moe_r$np.jsonl" > "$W/moe_r$np.txt" 2>&1 || { cat "$W/moe_r$np.txt"; exit 1; }
  compare "$W/moe.jsonl" "$W/moe_r$np.jsonl" 2 1e-5
done

# conversions, bit for bit: DIR/NAME loaded with args and saved again, consolidated, compared
convert() { # convert SRC_CKPT DST_DIR NP MODEL_ARGS... ; the converted checkpoint's bytes = SRC's
  src=$1 dst=$2 np=$3
  shift 3
  rm -rf "$dst"
  run -np "$np" "$TRAIN" "$@" --resume-from "$src" --checkpoint-dir "$dst" > "$dst.txt" 2>&1 || { cat "$dst.txt"; exit 1; }
  name=$(basename "$src")
  [ -d "$dst/$name" ] || { echo "no converted checkpoint $dst/$name"; cat "$dst.txt"; exit 1; }
  "$CKPT" consolidate "$src" "$dst.src.safetensors" --with-optimizer > /dev/null
  "$CKPT" consolidate "$dst/$name" "$dst.safetensors" --with-optimizer > /dev/null
  cmp "$dst.src.safetensors" "$dst.safetensors" || { echo "$dst: tensors differ from $src"; exit 1; }
  echo "ok $dst: $np ranks $*: every tensor bit-identical"
}
convert "$W/ck/step_00000003" "$W/c1" 1 $DENSE --steps 3
convert "$W/c1/step_00000003" "$W/c2" 2 $DENSE --steps 3 --tp 2
convert "$W/c2/step_00000003" "$W/c3" 4 $DENSE --steps 3 --parallel hsdp --mesh 2x2
convert "$W/c3/step_00000003" "$W/c4" 4 $DENSE --steps 3 --dp 2 --tp 2
convert "$W/c4/step_00000003" "$W/c4cp" 4 $DENSE --steps 3 --dp 2 --cp 2
convert "$W/c4cp/step_00000003" "$W/c5" 4 $DENSE --steps 3 --parallel fsdp
cmp "$W/c1.src.safetensors" "$W/c5.safetensors" || { echo "the round trip changed a tensor"; exit 1; }
convert "$W/moe/step_00000002" "$W/mc1" 4 $MOE --steps 2 --parallel fsdp
convert "$W/mc1/step_00000002" "$W/mc2" 1 $MOE --steps 2
convert "$W/mc2/step_00000002" "$W/mc3" 8 $MOE --steps 2 --dp 2 --tp 2 --ep 2
cmp "$W/mc1.src.safetensors" "$W/mc3.safetensors" || { echo "the MoE round trip changed a tensor"; exit 1; }

# a seed checkpoint: the initial weights saved on 1 rank, trained from under FSDP on 4 ranks
run -np 1 "$TRAIN" $DENSE --steps 0 --checkpoint-dir "$W/seed" > "$W/seed.txt" 2>&1 || { cat "$W/seed.txt"; exit 1; }
[ "$(cat "$W/seed/latest")" = step_00000000 ] || { echo "no seed checkpoint"; cat "$W/seed.txt"; exit 1; }
run -np 4 "$TRAIN" $DENSE --parallel fsdp --checkpoint-dir "$W/seed" --resume \
  --metrics "$W/seed.jsonl" > "$W/seed4.txt" 2>&1 || { cat "$W/seed4.txt"; exit 1; }
grep -q "resumed from $W/seed/step_00000000 at step 0" "$W/seed4.txt" || { echo "seed not loaded"; exit 1; }
compare "$W/full.jsonl" "$W/seed.jsonl" 0 1e-5
# the same weights through another tool: consolidated, imported (parameters only: no AdamW state,
# no step), then given to --resume-from as the directory whose `latest` names it
"$CKPT" consolidate "$W/seed/step_00000000" "$W/seed.safetensors" > /dev/null
"$CKPT" import "$W/seed.safetensors" "$W/imported" > /dev/null
run -np 4 "$TRAIN" $DENSE --parallel fsdp --resume-from "$W/imported" \
  --metrics "$W/imported.jsonl" > "$W/imported.txt" 2>&1 || { cat "$W/imported.txt"; exit 1; }
grep -q "started from the parameters of $W/imported/step_00000000 (no AdamW state" \
  "$W/imported.txt" || { echo "imported seed not loaded"; cat "$W/imported.txt"; exit 1; }
compare "$W/full.jsonl" "$W/imported.jsonl" 0 1e-5

# keep_last, an empty directory, another model
run -np 2 "$TRAIN" $DENSE --steps 3 --checkpoint-dir "$W/keep" --checkpoint-every 1 --keep-last 1 \
  --resume > "$W/keep.txt" 2>&1 || { cat "$W/keep.txt"; exit 1; }
grep -q "no checkpoint in $W/keep yet, starting at step 0" "$W/keep.txt" || { echo "no fresh-start line"; cat "$W/keep.txt"; exit 1; }
[ "$(ls -d "$W"/keep/step_* | wc -l)" -eq 1 ] && [ -d "$W/keep/step_00000003" ] || { echo "keep_last 1 kept:"; ls "$W/keep"; exit 1; }
rewind "$W/ck" "$W/wide" 3
if run -np 2 "$TRAIN" $DENSE --dim 48 --checkpoint-dir "$W/wide" --resume > "$W/wide.txt" 2>&1; then
  echo "a resume onto a wider model succeeded"
  exit 1
fi
grep -q "tok_emb' was saved as f32 (64, 32), the one to load into is f32 (64, 48)" "$W/wide.txt" || { echo "unclear shape error"; cat "$W/wide.txt"; exit 1; }
echo "resume.sh: ok"
