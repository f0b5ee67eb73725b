#!/usr/bin/python3
"""read_safetensors.py - an independent safetensors reader for tests/checkpoint/ckpt_tool.sh
(json and struct only: no dtensor code, no safetensors package).

  read_safetensors.py list PATH
      prints "name dtype shape nbytes" per tensor of PATH (a .safetensors file or a Hugging Face
      *.safetensors.index.json with its shards)
  read_safetensors.py compare PATH REFDIR NAMES_FILE... [--min-files N]
      every tensor of PATH equals REFDIR/<name>.bin byte for byte, and PATH holds exactly the
      names listed in the NAMES_FILEs (one a line); an index needs at least N shard files

Each file is checked against the format's rules: an 8-byte little-endian header length within
the file and safetensors' 100 MB limit; a header of UTF-8 JSON, one object opening with '{',
padded with spaces only, without duplicate keys; "__metadata__" (optional) mapping strings to
strings; every other key an object of exactly dtype (a known name), shape (integers >= 0) and
data_offsets [begin, end] with end - begin = numel * itemsize; the entries tiling the data part
in order of their offsets without holes or overlaps, up to the end of the file. dtensor's writer
also pads the header so the data starts at a multiple of 8: checked too. An index needs
metadata.total_size (the sum of its tensors' bytes) and a weight_map naming, for each tensor,
the shard file that holds it (and every tensor of each shard listed). Exit status 0 when all
holds, 1 with a message otherwise, 2 on a bad command line.
"""
import json
import os
import struct
import sys

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
            "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
HEADER_MAX = 100_000_000


class FormatError(Exception):
    pass


def _no_duplicates(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise FormatError("duplicate key %r" % k)
        d[k] = v
    return d


def _is_size(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def read_file(path):
    """{name: (dtype, shape, bytes)} of one safetensors file, in header order."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise FormatError("%s: %d bytes, too short" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > HEADER_MAX or n > len(raw) - 8:
        raise FormatError("%s: header length %d exceeds the file or the limit" % (path, n))
    if (8 + n) % 8 != 0:
        raise FormatError("%s: the data starts at byte %d, not a multiple of 8" % (path, 8 + n))
    try:
        text = raw[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError("%s: the header is not UTF-8: %s" % (path, e))
    if not text.startswith("{"):
        raise FormatError("%s: the header does not open with '{'" % path)
    try:
        hdr, end = json.JSONDecoder(object_pairs_hook=_no_duplicates).raw_decode(text)
    except ValueError as e:
        raise FormatError("%s: the header is not JSON: %s" % (path, e))
    if text[end:].strip(" ") != "":
        raise FormatError("%s: the header has %r after its JSON" % (path, text[end:end + 20]))
    data = raw[8 + n:]
    entries = []
    for key, e in hdr.items():
        if key == "__metadata__":
            if not isinstance(e, dict) or not all(isinstance(v, str) for v in e.values()):
                raise FormatError("%s: __metadata__ is not a map of strings" % path)
            continue
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise FormatError("%s: entry %r is not {dtype, shape, data_offsets}" % (path, key))
        dt, shape, off = e["dtype"], e["shape"], e["data_offsets"]
        if dt not in ITEMSIZE:
            raise FormatError("%s: entry %r: unknown dtype %r" % (path, key, dt))
        if not isinstance(shape, list) or not all(_is_size(s) for s in shape):
            raise FormatError("%s: entry %r: bad shape %r" % (path, key, shape))
        if (not isinstance(off, list) or len(off) != 2 or not all(_is_size(o) for o in off)
                or off[0] > off[1]):
            raise FormatError("%s: entry %r: bad data_offsets %r" % (path, key, off))
        numel = 1
        for s in shape:
            numel *= s
        if off[1] - off[0] != numel * ITEMSIZE[dt]:
            raise FormatError("%s: entry %r: %d bytes for %d elements of %s"
                              % (path, key, off[1] - off[0], numel, dt))
        entries.append((off[0], off[1], key, dt, shape))
    at = 0
    for b, e, key, _, _ in sorted(entries):
        if b != at:
            raise FormatError("%s: entry %r starts at data byte %d, expected %d"
                              % (path, key, b, at))
        at = e
    if at != len(data):
        raise FormatError("%s: the entries cover %d of %d data bytes" % (path, at, len(data)))
    return {key: (dt, shape, data[b:e]) for b, e, key, dt, shape in entries}


def read_path(path):
    """(tensors, number of files) of a .safetensors file or a Hugging Face index."""
    if not path.endswith(".index.json"):
        return read_file(path), 1
    with open(path, "rb") as f:
        try:
            idx = json.loads(f.read().decode("utf-8"), object_pairs_hook=_no_duplicates)
        except ValueError as e:
            raise FormatError("%s: not JSON: %s" % (path, e))
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    meta = idx.get("metadata") if isinstance(idx, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) and "/" not in v
                                           for v in wm.values()):
        raise FormatError("%s: no weight_map of tensor -> file name" % path)
    if not isinstance(meta, dict) or not _is_size(meta.get("total_size")):
        raise FormatError("%s: no metadata.total_size" % path)
    d = os.path.dirname(path) or "."
    tensors = {}
    files = sorted(set(wm.values()))
    for fn in files:
        for key, t in read_file(os.path.join(d, fn)).items():
            if wm.get(key) != fn:
                raise FormatError("%s: tensor %r of %s is mapped to %r"
                                  % (path, key, fn, wm.get(key)))
            if key in tensors:
                raise FormatError("%s: tensor %r in two shards" % (path, key))
            tensors[key] = t
    missing = set(wm) - set(tensors)
    if missing:
        raise FormatError("%s: weight_map lists %s, in no shard" % (path, sorted(missing)))
    total = sum(len(t[2]) for t in tensors.values())
    if meta["total_size"] != total:
        raise FormatError("%s: metadata.total_size %d, the tensors hold %d bytes"
                          % (path, meta["total_size"], total))
    return tensors, len(files)


def main(argv):
    if len(argv) >= 2 and argv[0] == "list":
        tensors, _ = read_path(argv[1])
        for key, (dt, shape, data) in tensors.items():
            print(key, dt, "x".join(str(s) for s in shape) or "scalar", len(data))
        return 0
    if len(argv) >= 4 and argv[0] == "compare":
        args, min_files = argv[1:], 1
        if "--min-files" in args:
            i = args.index("--min-files")
            min_files = int(args[i + 1])
            del args[i:i + 2]
        path, ref, lists = args[0], args[1], args[2:]
        want = []
        for lf in lists:
            with open(lf) as f:
                want += [line.strip() for line in f if line.strip()]
        tensors, nfiles = read_path(path)
        if sorted(tensors) != sorted(want):
            raise FormatError("%s holds %s, expected %s" % (path, sorted(tensors), sorted(want)))
        if nfiles < min_files:
            raise FormatError("%s: %d files, expected at least %d" % (path, nfiles, min_files))
        for key, (_, _, data) in tensors.items():
            with open(os.path.join(ref, key + ".bin"), "rb") as f:
                r = f.read()
            if r != data:
                first = next((i for i in range(min(len(r), len(data))) if r[i] != data[i]),
                             min(len(r), len(data)))
                raise FormatError("%s: tensor %r differs from %s/%s.bin (%d vs %d bytes, first "
                                  "difference at byte %d)" % (path, key, ref, key, len(data),
                                                              len(r), first))
        print("read_safetensors: %s: %d tensors in %d file(s), %d bytes, equal to %s"
              % (path, len(tensors), nfiles, sum(len(t[2]) for t in tensors.values()), ref))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (FormatError, OSError) as e:
        print("read_safetensors: %s" % e, file=sys.stderr)
        sys.exit(1)
