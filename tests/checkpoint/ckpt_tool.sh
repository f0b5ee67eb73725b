#!/usr/bin/env bash
# ckpt_tool.sh DTENSOR_CKPT CKPT_MAKE MPIEXEC WORKDIR - dtensor-ckpt against a real checkpoint:
#   ckpt_make saves one at np 4 (2x2 mesh: f32, bf16 and i64 tensors with uneven shapes, sharded,
#   nested, replicated, Partial, 0-d, zero-size, a Linear module and its AdamW state) and writes
#   each tensor's dense bytes to WORKDIR/ref;
#   info names every tensor; verify passes; every rank file opens in an independent reader
#   (read_safetensors.py: json + struct, Debian's /usr/bin/python3);
#   consolidate to one file (without and with the optimizer state) and to Hugging Face's sharded
#   form (--max-file-bytes: >= 2 shards, model.safetensors.index.json's weight_map and
#   total_size): every tensor equal to its reference byte for byte in the independent reader;
#   import of the one file and of the sharded index, each loaded by dt_checkpoint_load at np 2 on
#   another layout (1-D mesh, other shard dims) and compared with the reference;
#   a flipped data byte: verify exits 1 naming the file and the tensor; a truncated file and a
#   header length past the file: 1; consolidate onto a FIFO or an empty OUT: 1, the FIFO kept;
#   import of a FIFO or a directory: 1, at once;
#   bad command lines: 2; --help: 0.
set -euo pipefail
ckpt=$1 make=$2 mpiexec=$3 work=$4
PY=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
reader=$here/read_safetensors.py
fail() { echo "ckpt_tool: FAIL: $*" >&2; exit 1; }
[ -x "$PY" ] || fail "$PY is missing: the safetensors checks need Debian's python3"
rm -rf "$work"
mkdir -p "$work"
out=$work/out err=$work/err
# expect RC CMD...: runs CMD (stdout to $out, stderr to $err), fails unless it exits RC
expect() {
  local want=$1 rc=0
  shift
  "$@" >"$out" 2>"$err" || rc=$?
  if [ "$rc" -ne "$want" ]; then
    cat "$out" "$err" >&2
    fail "'$*' exited $rc, expected $want"
  fi
}
has() { # FILE, then strings it must contain
  local f=$1
  shift
  for s in "$@"; do grep -qF -- "$s" "$f" || { cat "$f" >&2; fail "$f lacks '$s'"; }; done
}
mpi() { "$mpiexec" --allow-run-as-root --oversubscribe "$@"; }

echo "== save at np 4"
expect 0 mpi -np 4 "$make" "$work"
cat "$out"
ck=$work/ckpt
[ "$(cat "$ck/latest")" = step_00000042 ] || fail "latest holds '$(cat "$ck/latest")'"
mapfile -t names <"$work/ref/names"
mapfile -t optim <"$work/ref/optim_names"
if [ "${#names[@]}" -lt 9 ] || [ "${#optim[@]}" -ne 6 ]; then fail "ckpt_make listed too few"; fi

echo "== info"
expect 0 "$ckpt" info "$ck"
for n in "${names[@]}" "${optim[@]}"; do
  grep -qE "^  (param|optim|tensor) +$n " "$out" || { cat "$out" >&2; fail "info lacks $n"; }
done
has "$out" "step 42" "from 4 ranks" "value step = 42" "value lr = 0.25" "bf16 (11, 7)" \
  "f32 (0, 4)"
grep -qE '^  tensor +acc .*\[P\(sum\), S\(1\)\]' "$out" ||
  { cat "$out" >&2; fail "info: acc's placements"; }
cat "$out"

echo "== verify"
expect 0 "$ckpt" verify "$ck"
has "$out" "every checksum matches" "rank_00000.safetensors"
nrank=$(find "$ck/step_00000042" -name 'rank_*.safetensors' | wc -l)
[ "$nrank" -ge 2 ] || fail "$nrank rank files"
for f in "$ck/step_00000042"/rank_*.safetensors; do
  expect 0 "$PY" "$reader" list "$f" # every rank file is a valid safetensors file
done
echo "verify: ok; $nrank rank files read by the independent reader"

echo "== consolidate"
mkdir -p "$work/one" "$work/hf" "$work/kib"
expect 0 "$ckpt" consolidate "$ck" "$work/one/model.safetensors"
has "$out" "wrote $work/one/model.safetensors"
expect 0 "$PY" "$reader" compare "$work/one/model.safetensors" "$work/ref" "$work/ref/names"
cat "$out"
expect 0 "$ckpt" consolidate "$ck/step_00000042" "$work/one/all.safetensors" --with-optimizer
expect 0 "$PY" "$reader" compare "$work/one/all.safetensors" "$work/ref" "$work/ref/names" \
  "$work/ref/optim_names"
cat "$out"
# 1K (1024 bytes) holds the model (962 bytes): one file; 300 bytes: the sharded form
expect 0 "$ckpt" consolidate "$ck" "$work/kib/model.safetensors" --max-file-bytes 1K
if [ ! -f "$work/kib/model.safetensors" ] || [ -e "$work/kib/model.safetensors.index.json" ]; then
  fail "--max-file-bytes 1K did not write one file"
fi
expect 0 "$ckpt" consolidate --max-file-bytes 300 "$ck" "$work/hf/model.safetensors"
idx=$work/hf/model.safetensors.index.json
if [ ! -f "$idx" ] || [ -e "$work/hf/model.safetensors" ]; then fail "no sharded form in hf/"; fi
has "$out" "wrote $idx"
expect 0 "$PY" "$reader" compare "$idx" "$work/ref" "$work/ref/names" --min-files 2
cat "$out"
# the index itself: weight_map names every tensor once, total_size their bytes, files <= 300
# bytes of tensors unless one tensor alone is larger
expect 0 "$PY" - "$idx" "$work/ref" "$work/ref/names" <<'EOF'
import json, os, sys
idx, ref, names = sys.argv[1], sys.argv[2], sys.argv[3]
j = json.load(open(idx))
want = [l.strip() for l in open(names) if l.strip()]
assert sorted(j["weight_map"]) == sorted(want), (sorted(j["weight_map"]), want)
sizes = {n: os.path.getsize(os.path.join(ref, n + ".bin")) for n in want}
assert j["metadata"]["total_size"] == sum(sizes.values()), j["metadata"]
files = sorted(set(j["weight_map"].values()))
assert len(files) >= 2 and all(f == "model-%05d-of-%05d.safetensors" % (i + 1, len(files))
                               for i, f in enumerate(files)), files
for f in files:
    held = [sizes[n] for n, g in j["weight_map"].items() if g == f]
    assert sum(held) <= 300 or len(held) == 1, (f, held)
print("index: %d tensors in %d files, total_size %d" % (len(want), len(files), sum(sizes.values())))
EOF
cat "$out"

echo "== import, loaded at np 2 on another layout"
expect 0 "$ckpt" import "$work/one/model.safetensors" "$work/imp" --name seed --step 7
has "$out" "$work/imp/seed"
[ "$(cat "$work/imp/latest")" = seed ] || fail "import did not publish $work/imp/latest"
expect 0 "$ckpt" info "$work/imp"
has "$out" "step 7" "from 1 ranks" "model.weight"
expect 0 "$ckpt" verify "$work/imp"
expect 0 mpi -np 2 "$make" "$work" load "$work/imp"
cat "$out"
expect 0 "$ckpt" import "$idx" "$work/imp_hf"
has "$out" "$work/imp_hf/step_00000000"
expect 0 mpi -np 2 "$make" "$work" load "$work/imp_hf"
cat "$out"
expect 1 "$ckpt" import "$work/one/model.safetensors" "$work/imp" --name seed
has "$err" "dtensor-ckpt: " "exists already"
# with the optimizer: the kinds come back as the checkpoint had them (consolidate records the
# ones that are not "param" in the metadata), so consolidating again leaves the state out
expect 0 "$ckpt" import "$work/one/all.safetensors" "$work/imp_all"
expect 0 "$ckpt" info "$work/imp_all"
want_kinds=$("$ckpt" info "$ck" | awk '/^  (param|optim|tensor) /{print $1, $2}' | sort)
got_kinds=$(awk '/^  (param|optim|tensor) /{print $1, $2}' "$out" | sort)
[ -n "$want_kinds" ] && [ "$want_kinds" = "$got_kinds" ] ||
  fail "imported kinds differ: $(diff <(echo "$want_kinds") <(echo "$got_kinds"))"
grep -qE "^  optim +${optim[0]} " "$out" || fail "no optim kind after import"
expect 0 "$ckpt" consolidate "$work/imp_all" "$work/one/again.safetensors"
expect 0 "$PY" "$reader" compare "$work/one/again.safetensors" "$work/ref" "$work/ref/names"
# the metadata names a tensor the file lacks, or a kind that does not exist: corrupt
for bad in '"dtensor_kind:nope": "optim"' "\"dtensor_kind:${optim[0]}\": \"bias\""; do
  "$PY" - "$work/one/all.safetensors" "$work/one/bad.safetensors" "$bad" <<'EOF'
import json, struct, sys
src, dst, entry = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
h["__metadata__"].update(json.loads("{" + entry + "}"))
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open(dst, "wb").write(struct.pack("<Q", len(t)) + t + raw[8 + n:])
EOF
  rm -rf "$work/imp_bad"
  expect 1 "$ckpt" import "$work/one/bad.safetensors" "$work/imp_bad"
  has "$err" "dtensor-ckpt: " "__metadata__ 'dtensor_kind:"
  [ ! -e "$work/imp_bad/step_00000000" ] || fail "a refused import left a checkpoint"
done

echo "== damaged checkpoints"
# a flipped byte inside the data of tensor proj's first box
cp -r "$ck/step_00000042" "$work/flip"
read -r file off < <("$PY" - "$work/flip/index.json" <<'EOF'
import json, sys
ix = json.load(open(sys.argv[1]))
t = next(t for t in ix["tensors"] if t["name"] == "proj")
b = t["boxes"][0]
print(ix["files"][b["file"]]["name"], b["data_offset"] + b["nbytes"] // 2)
EOF
)
"$PY" - "$work/flip/$file" "$off" <<'EOF'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(off)
    b = f.read(1)
    f.seek(off)
    f.write(bytes([b[0] ^ 0x10]))
EOF
expect 1 "$ckpt" verify "$work/flip"
has "$err" "dtensor-ckpt: " "$file" "tensor 'proj'" "checksum"
cat "$err"
expect 1 "$ckpt" consolidate "$work/flip" "$work/one/flip.safetensors"
has "$err" "$file" "tensor 'proj'"
[ ! -e "$work/one/flip.safetensors" ] || fail "consolidate of a damaged checkpoint left a file"
# a truncated rank file
cp -r "$ck/step_00000042" "$work/trunc"
truncate -s -3 "$work/trunc/rank_00001.safetensors"
expect 1 "$ckpt" verify "$work/trunc"
has "$err" "dtensor-ckpt: " "rank_00001.safetensors"
cat "$err"
expect 1 "$PY" "$reader" list "$work/trunc/rank_00001.safetensors" # the reader sees it too
# a header length past the end of the file
cp -r "$ck/step_00000042" "$work/hdr"
printf '\377\377\377\377\000\000\000\000' |
  dd of="$work/hdr/rank_00000.safetensors" bs=1 count=8 conv=notrunc status=none
expect 1 "$ckpt" verify "$work/hdr"
has "$err" "rank_00000.safetensors" "header length"
expect 1 "$ckpt" info "$work/nothing"
# an OUT that is not a regular file is refused before anything is written (it was renamed over:
# a FIFO, or /dev/null as root, replaced by the file), and an empty OUT (it wrote ".tmp")
mkfifo "$work/fifo"
expect 1 "$ckpt" consolidate "$ck" "$work/fifo"
has "$err" "dtensor-ckpt: " "$work/fifo exists and is not a regular file"
[ -p "$work/fifo" ] || fail "consolidate replaced the FIFO $work/fifo"
expect 1 "$ckpt" consolidate "$ck" ""
has "$err" "out_path is empty"
# an OUT inside the checkpoint it reads, or over its directory's `latest`, is refused (it
# replaced `latest` with the safetensors file: the directory had no checkpoint any more)
cp "$ck/latest" "$work/latest.before"
for dst in "$ck/latest" "$ck/step_00000042/model.safetensors"; do
  expect 1 "$ckpt" consolidate "$ck" "$dst"
  has "$err" "would write into the checkpoint"
done
cmp -s "$ck/latest" "$work/latest.before" || fail "consolidate changed $ck/latest"
[ ! -e "$ck/step_00000042/model.safetensors" ] || fail "consolidate wrote into the checkpoint"
expect 0 "$ckpt" verify "$ck"
# a SRC that is not a regular file: refused, not opened and waited on (a FIFO hung the import)
expect 1 timeout 60 "$ckpt" import "$work/fifo" "$work/imp5"
has "$err" "dtensor-ckpt: " "$work/fifo is not a regular file"
expect 1 "$ckpt" import "$ck" "$work/imp5"
has "$err" "$ck is not a regular file"
# a file or Hugging Face index of no tensors is refused (it made an empty checkpoint)
"$PY" -c "import json, struct, sys
h = json.dumps({'__metadata__': {}}).encode()
open(sys.argv[1], 'wb').write(struct.pack('<Q', len(h)) + h)
json.dump({'metadata': {'total_size': 0}, 'weight_map': {}}, open(sys.argv[2], 'w'))" \
  "$work/empty.safetensors" "$work/empty.safetensors.index.json"
for src in "$work/empty.safetensors" "$work/empty.safetensors.index.json"; do
  expect 1 "$ckpt" import "$src" "$work/imp6"
  has "$err" "holds no tensor"
done
[ ! -e "$work/imp6" ] || fail "a refused import made $work/imp6"
[ ! -e "$work/imp5/step_00000000" ] || fail "a refused import left a checkpoint"
expect 1 "$ckpt" import "$work/trunc/rank_00001.safetensors" "$work/imp3"
[ ! -e "$work/imp3/step_00000000" ] || fail "a failed import left a checkpoint"

echo "== usage"
expect 0 "$ckpt" --help
has "$out" info verify consolidate import --max-file-bytes --with-optimizer --name --step
expect 0 "$ckpt" verify --help
expect 2 "$ckpt"
expect 2 "$ckpt" bogus "$ck"
expect 2 "$ckpt" info
expect 2 "$ckpt" verify "$ck" extra
expect 2 "$ckpt" consolidate "$ck"
expect 2 "$ckpt" consolidate "$ck" "$work/x.safetensors" --max-file-bytes 12Q
expect 2 "$ckpt" consolidate "$ck" "$work/x.safetensors" --max-file-bytes 0
expect 2 "$ckpt" consolidate "$ck" "$work/x.safetensors" --max-file-bytes
expect 2 "$ckpt" consolidate "$ck" "$work/x.safetensors" --bogus
expect 2 "$ckpt" import "$work/one/model.safetensors" "$work/imp4" --step -3
has "$err" "dtensor-ckpt: " "--step"
if [ -e "$work/x.safetensors" ] || [ -e "$work/imp4" ]; then fail "a usage error wrote a file"; fi
rm -rf "$work"
echo "ckpt_tool: all checks passed"
