#!/usr/bin/env bash
# gpu_runtime.sh: pack the run-time libraries that our binaries and Open MPI need into one archive
# that travels to a GPU machine without MPI (see tools/gpu_env.sh, docs/testing.md).
#
#   tools/gpu_runtime.sh [OUT_DIR] [--bin FILE|DIR ...] [--no-cuda]
#
# OUT_DIR defaults to .gpu-runtime at the repository root; the archive is OUT_DIR.tar.xz.
# --bin takes ELF files or folders (every ELF file directly inside is taken), e.g.
#   tools/gpu_runtime.sh --bin build/tests build/bench
# --no-cuda: carry libcudart and ask gpu_env.sh for cuBLASLt only if a --bin file needs them
#   (by default both are always in: the cuda backend links them).
#
# What it does (Debian 12 with openmpi-bin, libopenblas0, libcjson1 installed; root for apt):
#  1. closure: ldd of mpirun/orterun, orted, ompi_info, every Open MPI and PMIx MCA component
#     (components that need network-hardware or OpenSHMEM libraries are dropped: ucx, ofi,
#     verbs/openib, psm, psm2, netlink, oshmem) and of the --bin files;
#  2. maps each library to its Debian package (dpkg -S), downloads exactly the installed versions
#     (apt-get download; falls back to copying the installed files), unpacks them (dpkg-deb -x)
#     into OUT_DIR/root and prunes everything that is not in the closure or an Open MPI/PMIx
#     help or configuration file;
#  3. libc6 and libgcc-s1 (libc, libm, libpthread, libdl, librt, ld-linux, libgcc_s) are never
#     carried. Libraries every distribution ships in some version (libstdc++, libgfortran,
#     libquadmath, zlib, libudev) go to OUT_DIR/compat: gpu_env.sh uses the machine's own copy
#     when it has every symbol version our files need, and ours only otherwise;
#  4. CUDA: libcudart.so.* from the CUDA toolkit is carried (OUT_DIR/cuda); libcublasLt and any
#     other toolkit library is too big and is listed in OUT_DIR/manifest/external.txt, for
#     gpu_env.sh to find on the GPU machine (PyTorch's nvidia wheels or a CUDA install);
#  5. packs OUT_DIR into OUT_DIR.tar.xz and prints both sizes.
set -euo pipefail

die() { echo "gpu_runtime: error: $*" >&2; exit 1; }
note() { echo "gpu_runtime: $*" >&2; }

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=""
BINS=()
WITH_CUDA=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin)
      shift
      while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do BINS+=("$1"); shift; done
      ;;
    --no-cuda) WITH_CUDA=0; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    --*) die "unknown option $1" ;;
    *) [ -z "$OUT" ] || die "two output folders given: $OUT and $1"; OUT=$1; shift ;;
  esac
done
OUT=${OUT:-$REPO/.gpu-runtime}
OUT=${OUT%/}
case "$OUT" in /*) ;; *) OUT=$PWD/$OUT ;; esac
ARCHIVE=$OUT.tar.xz
MARKER=.dtensor-gpu-runtime
[ "$(uname -m)" = x86_64 ] || die "must run on x86-64 (the GPU machine is x86-64)"
for t in dpkg-query dpkg-deb apt-get ldd readelf xz tar; do
  command -v "$t" >/dev/null || die "missing tool: $t"
done
if [ -e "$OUT" ] && [ ! -e "$OUT/$MARKER" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  die "$OUT exists, is not empty and is not a runtime folder made by this script; not touching it"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_runtime.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

is_elf() { [ -f "$1" ] && [ "$(head -c 4 "$1" 2>/dev/null | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }

# ---- 1. the seeds: Open MPI programs, MCA components, --bin files -----------------------------
MPIRUN=$(command -v mpirun) || die "mpirun not found (apt-get install openmpi-bin)"
MPIRUN=$(readlink -f "$MPIRUN")
ORTED=$(readlink -f "$(command -v orted)") || die "orted not found"
OMPI_INFO=$(readlink -f "$(command -v ompi_info)") || die "ompi_info not found"
OMPI_VERSION=$(ompi_info --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9.]*\).*/\1/p' | head -1)
PKGLIBDIR=$(ompi_info --path pkglibdir 2>/dev/null | sed -n 's/.*Pkglibdir: *//p' | head -1)
PKGDATADIR=$(ompi_info --path pkgdatadir 2>/dev/null | sed -n 's/.*Pkgdatadir: *//p' | head -1)
SYSCONFDIR=$(ompi_info --path sysconfdir 2>/dev/null | sed -n 's/.*Sysconfdir: *//p' | head -1)
PREFIX=$(ompi_info --path prefix 2>/dev/null | sed -n 's/.*Prefix: *//p' | head -1)
[ -d "$PKGLIBDIR" ] || die "cannot find Open MPI's component folder (ompi_info --path pkglibdir)"
[ "$PREFIX" = /usr ] || die "Open MPI prefix is $PREFIX, expected Debian's /usr"

# PMIx: its library is what mca_pmix_ext3x links; its components sit in <libdir>/pmix
PMIX_EXT=""
for c in "$PKGLIBDIR"/mca_pmix_ext*.so; do [ -e "$c" ] && PMIX_EXT=$c; done
[ -n "$PMIX_EXT" ] || die "no mca_pmix_ext*.so in $PKGLIBDIR (Open MPI without external PMIx?)"
PMIX_LIB=$(ldd "$PMIX_EXT" | awk '$1 ~ /^libpmix\.so/ {print $3}')
PMIX_LIB=$(readlink -f "$PMIX_LIB")
PMIX_LIBDIR=$(dirname "$PMIX_LIB")                  # /usr/lib/x86_64-linux-gnu/pmix2/lib
PMIX_PREFIX=$(dirname "$PMIX_LIBDIR")               # /usr/lib/x86_64-linux-gnu/pmix2
PMIX_COMPDIR=$PMIX_LIBDIR/pmix
# Debian configures PMIx with absolute libdir/datadir/sysconfdir (not relative to its prefix):
# gpu_env.sh must relocate each; the system config file tells where sysconfdir and datadir are
PMIX_SYSCONFDIR=$PMIX_PREFIX/share
PMIX_DATADIR=$PMIX_PREFIX/share
[ -d "$PMIX_COMPDIR" ] || die "PMIx component folder $PMIX_COMPDIR missing"

# components that need libraries for network hardware or OpenSHMEM: useless on one node with
# shared memory only, and they pull in ucx, libfabric, verbs, psm (tens of MB)
DENY='^(liboshmem|libucp|libucs|libuct|libucm|libmca_common_ucx|libfabric|libmca_common_ofi|libibverbs|librdmacm|libefa|libpsm_infinipath|libinfinipath|libpsm2|libmca_common_verbs|libnl-3|libnl-route-3)\.so'

SEEDS=("$MPIRUN" "$ORTED" "$OMPI_INFO")
COMPONENTS=()
DROPPED=()
for c in "$PKGLIBDIR"/*.so "$PMIX_COMPDIR"/*.so; do
  [ -e "$c" ] || continue
  if ldd "$c" | awk '{print $1}' | grep -Eq "$DENY"; then
    DROPPED+=("$(basename "$c" .so)")
  else
    COMPONENTS+=("$c")
  fi
done
BIN_FILES=()
for b in ${BINS[@]+"${BINS[@]}"}; do
  if [ -d "$b" ]; then
    for f in "$b"/*; do is_elf "$f" && BIN_FILES+=("$(readlink -f "$f")"); done
  elif is_elf "$b"; then
    BIN_FILES+=("$(readlink -f "$b")")
  else
    die "--bin $b: not an ELF file or folder"
  fi
done
[ ${#BIN_FILES[@]} -gt 0 ] || note "warning: no --bin given: only Open MPI's own closure is packed (no OpenBLAS, cJSON, CUDA)"

# ---- 2. ldd closure: "soname<TAB>path as ldd resolved it" --------------------------------------
: >"$WORK/needed"
: >"$WORK/notfound"
for f in "${SEEDS[@]}" "${COMPONENTS[@]}" ${BIN_FILES[@]+"${BIN_FILES[@]}"}; do
  ldd "$f" 2>/dev/null | awk -v f="$f" -v nf="$WORK/notfound" '
    /=> not found/ { print f ": " $1 >> nf; next }
    $2 == "=>" && $3 ~ /^\// { print $1 "\t" $3 }' >>"$WORK/needed"
done
if [ -s "$WORK/notfound" ]; then
  cat "$WORK/notfound" >&2
  die "some libraries are not found here (see above): fix the build or install them"
fi
sort -u "$WORK/needed" -o "$WORK/needed"

# which package owns a path (usrmerge: dpkg may know it under /lib or /usr/lib)
owner_of() {
  local p cand
  for p in "$@"; do
    for cand in "$p" "${p/#\/usr\/lib\//\/lib\/}" "${p/#\/lib\//\/usr\/lib\/}"; do
      dpkg-query -S "$cand" 2>/dev/null | awk -F': ' 'NR==1 {sub(/,.*/, "", $1); print $1}' | grep . && return 0
    done
  done
  return 1
}

CUDA_DIR=${CUDA_HOME:-/usr/local/cuda}
PRIVATE_PKGS='^(openmpi-bin|openmpi-common|libopenmpi[0-9]*|libpmix[0-9]*|libhwloc[0-9]*|libevent-.*|libopenblas.*|libcjson[0-9]*|libmunge[0-9]*|libcmocka[0-9]*)(:amd64)?$'
SYSTEM_PKGS='^(libc6|libgcc-s1)(:amd64)?$'
: >"$WORK/libs"      # class<TAB>soname<TAB>realpath<TAB>package
: >"$WORK/external"
: >"$WORK/unowned"
while IFS=$'\t' read -r soname path; do
  real=$(readlink -f "$path")
  if pkg=$(owner_of "$path" "$real"); then
    if [[ $pkg =~ $SYSTEM_PKGS ]]; then continue; fi
    if [[ $pkg =~ $PRIVATE_PKGS ]]; then class=lib; else class=compat; fi
    printf '%s\t%s\t%s\t%s\n' "$class" "$soname" "$real" "$pkg" >>"$WORK/libs"
  else
    case "$soname" in
      libcudart.so.*) printf 'cuda\t%s\t%s\t-\n' "$soname" "$real" >>"$WORK/libs" ;;
      libcuda.so.*|libnvidia-*) ;;  # the driver: the GPU machine has its own
      *)
        case "$real" in
          /usr/local/cuda*|"$(readlink -f "$CUDA_DIR")"/*) echo "$soname" >>"$WORK/external" ;;
          *) printf 'lib\t%s\t%s\t-\n' "$soname" "$real" >>"$WORK/libs"; echo "$real" >>"$WORK/unowned" ;;
        esac
        ;;
    esac
  fi
done <"$WORK/needed"
sort -u "$WORK/libs" -o "$WORK/libs"
if [ -s "$WORK/unowned" ]; then
  note "warning: carried as plain copies (no Debian package owns them): $(sort -u "$WORK/unowned" | tr '\n' ' ')"
fi
# CUDA: carry libcudart and ask for cuBLASLt even when no --bin needs them (the cuda backend
# links both); --no-cuda leaves them out unless a --bin file needs them
if [ $WITH_CUDA = 1 ]; then
  if ! grep -q "^cuda	libcudart" "$WORK/libs"; then
    cr=""
    for c in "$CUDA_DIR"/lib64/libcudart.so.[0-9]*; do
      [[ $c =~ libcudart\.so\.[0-9]+$ ]] && [ -e "$c" ] && cr=$c
    done
    if [ -n "$cr" ]; then
      printf 'cuda\t%s\t%s\t-\n' "$(basename "$cr")" "$(readlink -f "$cr")" >>"$WORK/libs"
    else
      note "warning: no libcudart.so.N in $CUDA_DIR/lib64: cudart not carried"
    fi
  fi
  lt=libcublasLt.so.13
  for c in "$CUDA_DIR"/lib64/libcublasLt.so.[0-9]*; do
    [[ $c =~ libcublasLt\.so\.[0-9]+$ ]] && [ -e "$c" ] && lt=$(basename "$c")
  done
  grep -q '^libcublasLt\.so\.' "$WORK/external" 2>/dev/null || echo "$lt" >>"$WORK/external"
fi
sort -u "$WORK/external" -o "$WORK/external"

# packages: those owning the closure, plus the owners of Open MPI's help and config files
{
  awk -F'\t' '$4 != "-" {print $4}' "$WORK/libs"
  owner_of "$MPIRUN"; owner_of "$ORTED"; owner_of "$OMPI_INFO"
  for c in "${COMPONENTS[@]}"; do owner_of "$c"; done
  for h in "$PKGDATADIR"/help-*.txt; do owner_of "$h"; break; done
  owner_of "$SYSCONFDIR/openmpi-mca-params.conf"
  owner_of "$PMIX_LIB"
} | sort -u >"$WORK/packages"

# ---- 3. download and unpack ---------------------------------------------------------------------
rm -rf "$OUT"
mkdir -p "$OUT/root" "$OUT/manifest" "$WORK/debs"
touch "$OUT/$MARKER"
# one apt-get call for all (exact installed versions); on failure apt-get update and retry, and
# copy the installed files of a package whose exact version cannot be downloaded any more
SPECS=()
while read -r pkg; do SPECS+=("$pkg=$(dpkg-query -W -f='${Version}' "$pkg")"); done <"$WORK/packages"
download() { (cd "$WORK/debs" && apt-get download -q "$@" >"$WORK/apt.log" 2>&1); }
if ! download "${SPECS[@]}"; then
  if [ "$(id -u)" = 0 ]; then
    note "apt-get download failed; running apt-get update and retrying"
    apt-get update -qq >/dev/null 2>&1 || true
  fi
  if ! download "${SPECS[@]}"; then
    for spec in "${SPECS[@]}"; do download "$spec" || true; done
  fi
fi
: >"$OUT/manifest/packages.tsv"
for spec in "${SPECS[@]}"; do
  pkg=${spec%%=*}; ver=${spec#*=}
  name=${pkg%%:*}
  deb=""
  for c in "$WORK/debs/${name}_"*.deb; do [ -e "$c" ] && deb=$c; done
  if [ -n "$deb" ]; then
    dpkg-deb -x "$deb" "$OUT/root"
    method=download size=$(stat -c %s "$deb")
  else
    note "warning: $spec not downloadable ($(tail -1 "$WORK/apt.log")); copying the installed files"
    dpkg-query -L "$pkg" | while read -r f; do
      if [ -f "$f" ] || [ -L "$f" ]; then
        mkdir -p "$OUT/root$(dirname "$f")"
        cp -a "$f" "$OUT/root$f"
      fi
    done
    method=copy size=0
  fi
  printf '%s\t%s\t%s\t%s\n' "$pkg" "$ver" "$method" "$size" >>"$OUT/manifest/packages.tsv"
done

# ---- 4. prune: keep the closure, the programs, the components, help and config files -----------
in_root() { # the unpacked copy of a host path (usrmerge-aware)
  local p
  for p in "$1" "${1/#\/usr\/lib\//\/lib\/}" "${1/#\/lib\//\/usr\/lib\/}"; do
    if [ -f "$OUT/root$p" ] && [ ! -L "$OUT/root$p" ]; then echo "$p"; return 0; fi
  done
  return 1
}
: >"$WORK/keep"
add_keep() { local r; r=$(in_root "$1") || die "$1 is not in the unpacked packages"; echo "$r" >>"$WORK/keep"; }
for f in "$MPIRUN" "$ORTED" "$OMPI_INFO" "${COMPONENTS[@]}"; do add_keep "$f"; done
while IFS=$'\t' read -r class soname real pkg; do
  [ "$class" = cuda ] && continue
  if [ "$pkg" = - ]; then
    mkdir -p "$OUT/root$(dirname "$real")"; cp -L "$real" "$OUT/root$real"
  fi
  add_keep "$real"
done <"$WORK/libs"
sort -u "$WORK/keep" -o "$WORK/keep"
# data we keep whole: Open MPI help/config, PMIx help/config
KEEP_TREES=("$PKGDATADIR" "$SYSCONFDIR" "$PMIX_PREFIX/share")
(cd "$OUT/root" && find . \( -type f -o -type l \) | sed 's|^\.||') | while read -r f; do
  grep -qxF "$f" "$WORK/keep" && continue
  keep=0
  for t in "${KEEP_TREES[@]}"; do case "$f" in "$t"/*) keep=1 ;; esac; done
  case "$f" in *.supp|*/pmixcc-wrapper-data.txt|*-wrapper-data.txt) keep=0 ;; esac
  [ $keep = 1 ] || rm -f "$OUT/root$f"
done
find "$OUT/root" -depth -type d -empty -delete
mkdir -p "$OUT/root$PKGLIBDIR" "$OUT/root$PMIX_COMPDIR"
# Debian's pmix-mca-params.conf adds the absolute /usr/.../pmix2/lib/pmix to PMIx's component
# path; relocated, the default path (PMIX_LIBDIR/pmix, set by gpu_env.sh) is the right one
conf=$OUT/root$PMIX_SYSCONFDIR/pmix-mca-params.conf
if [ -f "$conf" ]; then
  sed -i 's|^\(mca_base_component_path *=.*\)|# relocated: gpu_env.sh sets PMIX_LIBDIR, whose pmix/ folder is searched\n# \1|' "$conf"
fi

# ---- 5. the folders gpu_env.sh puts on PATH and LD_LIBRARY_PATH ----------------------------------
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/compat" "$OUT/cuda" "$OUT/hwloc-plugins"
relink() { # relink DIR/NAME -> root path
  local rp; rp=$(in_root "$3") || die "$3 not unpacked"
  ln -sfn "../root$rp" "$OUT/$1/$2"
}
relink bin orterun "$MPIRUN"
relink bin mpirun "$MPIRUN"
relink bin mpiexec "$MPIRUN"
relink bin orted "$ORTED"
relink bin ompi_info "$OMPI_INFO"
while IFS=$'\t' read -r class soname real pkg; do
  if [ "$class" = cuda ]; then
    cp -L "$real" "$OUT/cuda/$(basename "$real")"
    [ "$(basename "$real")" = "$soname" ] || ln -sfn "$(basename "$real")" "$OUT/cuda/$soname"
  else
    relink "$class" "$soname" "$real"
  fi
done <"$WORK/libs"

# ---- 6. manifest: what gpu_env.sh checks on the GPU machine ------------------------------------
cp "$WORK/external" "$OUT/manifest/external.txt"
awk -F'\t' '{print $1 "\t" $2 "\t" $3}' "$WORK/libs" >"$OUT/manifest/libs.tsv"
printf '%s\n' ${DROPPED[@]+"${DROPPED[@]}"} >"$OUT/manifest/dropped-components.txt"
# symbol versions our files need from the compat libraries and from glibc: verneed lines are
# "needing file<TAB>soname<TAB>version"
: >"$WORK/verneed"
for f in $(sed "s|^|$OUT/root|" "$WORK/keep") "$OUT"/cuda/* ${BIN_FILES[@]+"${BIN_FILES[@]}"}; do
  [ -L "$f" ] && continue
  readelf -V -W "$f" 2>/dev/null | awk -v f="$f" '
    /Version needs section/ {inneed=1; next}
    /Version (definition|symbols) section/ {inneed=0}
    inneed && /File:/ {for (i=1;i<=NF;i++) if ($i=="File:") cur=$(i+1)}
    inneed && /Name:/ {for (i=1;i<=NF;i++) if ($i=="Name:") print f "\t" cur "\t" $(i+1)}' >>"$WORK/verneed"
done
# the compat libraries' own files ("root path<TAB>soname")
: >"$WORK/compat-files"
while IFS=$'\t' read -r class soname real pkg; do
  [ "$class" = compat ] && printf '%s\t%s\n' "$OUT/root$(in_root "$real")" "$soname" >>"$WORK/compat-files"
done <"$WORK/libs"
awk -F'\t' 'NR==FNR { if ($1=="compat") c[$2]=1; next } ($2 in c) {print $2 "\t" $3}' "$WORK/libs" "$WORK/verneed" |
  sort -u >"$OUT/manifest/compat-needs.tsv"
# glibc: what is always loaded (everything but the compat libraries) ...
awk -F'\t' 'NR==FNR {cf[$1]=1; next} !($1 in cf) && $3 ~ /^GLIBC_[0-9]/ {sub(/^GLIBC_/, "", $3); print $3}' \
  "$WORK/compat-files" "$WORK/verneed" | sort -V | tail -1 >"$OUT/manifest/glibc-min.txt"
# ... and what each compat library needs when the carried one has to be used
while IFS=$'\t' read -r file soname; do
  v=$(awk -F'\t' -v f="$file" '$1 == f && $3 ~ /^GLIBC_[0-9]/ {sub(/^GLIBC_/, "", $3); print $3}' "$WORK/verneed" |
    sort -V | tail -1)
  printf '%s\t%s\n' "$soname" "${v:-0}"
done <"$WORK/compat-files" >"$OUT/manifest/compat-glibc.tsv"
{
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ) host=$(hostname) os=$(# shellcheck disable=SC1091
. /etc/os-release && echo "$ID-$VERSION_ID")"
  echo "openmpi=$OMPI_VERSION"
  echo "ompi_prefix=/usr"
  echo "ompi_sysconfdir=$SYSCONFDIR"
  echo "ompi_pkglibdir=$PKGLIBDIR"
  echo "pmix_prefix=$PMIX_PREFIX"
  echo "pmix_compdir=$PMIX_COMPDIR"
  echo "pmix_libdir=$PMIX_LIBDIR"
  echo "pmix_datadir=$PMIX_DATADIR"
  echo "pmix_sysconfdir=$PMIX_SYSCONFDIR"
} >"$OUT/manifest/info.txt"

# ---- 7. pack ------------------------------------------------------------------------------------
rm -f "$ARCHIVE" "$ARCHIVE.tmp"
tar -C "$OUT" --owner=0 --group=0 --numeric-owner --sort=name --exclude=./.archive-stamp -cf - . |
  xz -9 -T2 -c >"$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
cksum <"$ARCHIVE" >"$OUT/.archive-stamp"

# ---- report -------------------------------------------------------------------------------------
human() { numfmt --to=iec-i --suffix=B "$1" 2>/dev/null || echo "$1 B"; }
unpacked=$(du -sb "$OUT" | cut -f1)
packed=$(stat -c %s "$ARCHIVE")
echo "packages ($(wc -l <"$OUT/manifest/packages.tsv")):"
awk -F'\t' '{printf "  %-28s %-24s %s\n", $1, $2, $3}' "$OUT/manifest/packages.tsv"
echo "carried: $(grep -c . "$OUT/manifest/libs.tsv") libraries ($(awk -F'\t' '{print $1}' "$OUT/manifest/libs.tsv" | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}' | sed 's/, $//')), ${#COMPONENTS[@]} MCA components (dropped ${#DROPPED[@]}: network hardware/oshmem)"
echo "needed from the GPU machine: $(tr '\n' ' ' <"$OUT/manifest/external.txt")(found by gpu_env.sh), glibc >= $(cat "$OUT/manifest/glibc-min.txt")"
echo "unpacked: $(human "$unpacked") ($unpacked bytes) in $OUT"
echo "archive:  $(human "$packed") ($packed bytes) in $ARCHIVE"
echo "On the GPU machine: carry $(basename "$ARCHIVE") and the build folder, then"
echo "  source tools/gpu_env.sh && mpirun -np 2 <build>/tests/test_host_mpi"
