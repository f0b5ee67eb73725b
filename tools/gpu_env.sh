# shellcheck shell=bash
# gpu_env.sh: source on the GPU machine (bash) to run our binaries with the Open MPI, OpenBLAS and
# cJSON that tools/gpu_runtime.sh packed, and the machine's own cuBLASLt:
#
#   source tools/gpu_env.sh && mpirun -np 2 build-gpu/tests/test_host_mpi
#
# Unpacks .gpu-runtime.tar.xz (repo root) once into .gpu-runtime/ (or $TMPDIR when the repo is
# read-only; re-unpacks when the archive changes), then exports PATH, LD_LIBRARY_PATH, the
# Open MPI/PMIx relocation variables and our Open MPI defaults. Idempotent; prints one line.
# Returns non-zero, after a line starting "gpu_env: error:", when something is missing.
#
# Overrides: DTENSOR_GPU_RUNTIME_ARCHIVE (archive), DTENSOR_GPU_RUNTIME_DIR (where to unpack),
# DTENSOR_CUDA_LIBDIR (colon-separated folders searched first for cuBLASLt and other CUDA
# libraries), DTENSOR_GPU_ENV_NO_CUDA=1 (do not look for CUDA libraries: CPU-only runs).

if [ -z "${BASH_VERSION:-}" ]; then
  echo "gpu_env: error: source this file from bash" >&2
  # shellcheck disable=SC2317
  return 1 2>/dev/null || exit 1
fi

_dt_gpu_env_main() {
  local self repo archive dir sum state R info pmix_prefix pmix_libdir pmix_datadir pmix_sysconfdir
  local ompi_version
  local base_path base_ld added ldconf e d f soname tags tag ok sys missing ext_dirs cudart_from
  local compat_sys compat_ours sp searched driver driver_dir glibc_need glibc_have
  local foreign vader_note tmo need
  local -A found=()
  # the caller may run with set -euo pipefail: not in here (restored on return by local -)
  local -
  set +e +u +o pipefail
  self=${BASH_SOURCE[0]:-}
  if [ -n "$self" ]; then
    repo=$(cd "$(dirname "$self")/.." && pwd)
  else
    repo=${DTENSOR_REPO:-$PWD}
  fi
  archive=${DTENSOR_GPU_RUNTIME_ARCHIVE:-$repo/.gpu-runtime.tar.xz}
  dir=${DTENSOR_GPU_RUNTIME_DIR:-$repo/.gpu-runtime}

  # ---- unpack once --------------------------------------------------------------------------------
  if [ -f "$archive" ]; then
    sum=$(cksum <"$archive")
    if [ -z "${DTENSOR_GPU_RUNTIME_DIR:-}" ] && [ ! -f "$dir/.dtensor-gpu-runtime" ] &&
       { [ ! -w "$(dirname "$dir")" ] || { [ -e "$dir" ] && [ ! -w "$dir" ]; }; }; then
      dir=${TMPDIR:-/tmp}/dtensor-gpu-runtime-$(id -u)
    fi
    if [ -f "$dir/.dtensor-gpu-runtime" ] && [ "$(cat "$dir/.archive-stamp" 2>/dev/null)" = "$sum" ]; then
      state=reused
    else
      if [ -e "$dir" ] && [ ! -f "$dir/.dtensor-gpu-runtime" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
        echo "gpu_env: error: $dir exists and is not a runtime folder; set DTENSOR_GPU_RUNTIME_DIR" >&2
        return 1
      fi
      if ! { rm -rf "$dir.unpack.$$" && mkdir -p "$dir.unpack.$$"; }; then
        echo "gpu_env: error: cannot create $dir.unpack.$$" >&2; return 1
      fi
      if command -v xz >/dev/null 2>&1 && xz --version >/dev/null 2>&1; then
        xz -dc "$archive" | tar -xf - -C "$dir.unpack.$$"
      else # no xz: Python's tarfile reads .tar.xz
        python3 -c 'import sys, tarfile
t = tarfile.open(sys.argv[1])
kw = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}
t.extractall(sys.argv[2], **kw)' "$archive" "$dir.unpack.$$"
      fi || { rm -rf "$dir.unpack.$$"; echo "gpu_env: error: cannot unpack $archive" >&2; return 1; }
      if [ ! -f "$dir.unpack.$$/.dtensor-gpu-runtime" ]; then
        rm -rf "$dir.unpack.$$"
        echo "gpu_env: error: $archive did not unpack into a runtime folder" >&2; return 1
      fi
      echo "$sum" >"$dir.unpack.$$/.archive-stamp"
      if ! { rm -rf "$dir" && mv "$dir.unpack.$$" "$dir"; }; then
        echo "gpu_env: error: cannot move the runtime into $dir" >&2; return 1
      fi
      state=unpacked
    fi
  elif [ -f "$dir/.dtensor-gpu-runtime" ]; then
    state="folder, no archive"
  else
    echo "gpu_env: error: no runtime: neither $archive nor $dir/ (make it with tools/gpu_runtime.sh and carry .gpu-runtime.tar.xz)" >&2
    return 1
  fi
  R=$(cd "$dir" && pwd)
  info=$R/manifest/info.txt
  pmix_prefix=$(sed -n 's/^pmix_prefix=//p' "$info")
  pmix_libdir=$(sed -n 's/^pmix_libdir=//p' "$info")
  pmix_datadir=$(sed -n 's/^pmix_datadir=//p' "$info")
  pmix_sysconfdir=$(sed -n 's/^pmix_sysconfdir=//p' "$info")
  ompi_version=$(sed -n 's/^openmpi=//p' "$info")

  # ---- glibc: our files were built on Debian 12 ---------------------------------------------------
  glibc_need=$(cat "$R/manifest/glibc-min.txt" 2>/dev/null)
  glibc_have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [ -n "$glibc_need" ] && [ -n "$glibc_have" ] &&
     [ "$(printf '%s\n%s\n' "$glibc_need" "$glibc_have" | sort -V | head -1)" != "$glibc_need" ]; then
    echo "gpu_env: error: this machine's glibc $glibc_have is older than $glibc_need, which the runtime needs" >&2
    return 1
  fi

  # ---- start from PATH / LD_LIBRARY_PATH without what an earlier source added ----------------------
  _dt_strip() {
    local IFS=: out="" e
    for e in $1; do
      [ -n "$e" ] || continue
      case ":${DTENSOR_GPU_ENV_ADDED:-}:" in *":$e:"*) continue ;; esac
      case "$e" in "$R"/*) continue ;; esac
      out=${out:+$out:}$e
    done
    printf '%s' "$out"
  }
  base_path=$(_dt_strip "$PATH")
  base_ld=$(_dt_strip "${LD_LIBRARY_PATH:-}")
  ldconf=$( { ldconfig -p || /sbin/ldconfig -p || /usr/sbin/ldconfig -p; } 2>/dev/null)
  # where the dynamic loader would find a soname without us: LD_LIBRARY_PATH, cache, default dirs
  _dt_syslib() {
    local IFS=: d
    for d in $base_ld; do [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }; done
    d=$(printf '%s\n' "$ldconf" | awk -v s="$1" '$1 == s && /x86-64/ {print $NF; exit}')
    [ -n "$d" ] && [ -e "$d" ] && { echo "$d"; return 0; }
    for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64; do
      [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }
    done
    return 1
  }

  # ---- compat libraries: the machine's own copy when it has every symbol version we need ------------
  rm -rf "$R/compat-active" && mkdir -p "$R/compat-active"
  compat_sys="" compat_ours=""
  for f in "$R"/compat/*; do
    [ -e "$f" ] || continue
    soname=${f##*/}
    ok=0
    if sys=$(_dt_syslib "$soname"); then
      ok=1
      tags=$(awk -F'\t' -v s="$soname" '$1 == s {print $2}' "$R/manifest/compat-needs.tsv")
      for tag in $tags; do
        grep -qazxF -- "$tag" "$sys" || { ok=0; break; }
      done
    fi
    if [ $ok = 1 ]; then
      compat_sys="$compat_sys ${soname%%.so*}"
    else
      # the carried copy was built for Debian 12's glibc
      need=$(awk -F'\t' -v s="$soname" '$1 == s {print $2}' "$R/manifest/compat-glibc.tsv" 2>/dev/null)
      if [ -n "$need" ] && [ -n "$glibc_have" ] &&
         [ "$(printf '%s\n%s\n' "$need" "$glibc_have" | sort -V | head -1)" != "$need" ]; then
        echo "gpu_env: error: this machine's ${sys:-no} $soname lacks what our files need, and the carried one needs glibc $need (this machine has $glibc_have)" >&2
        return 1
      fi
      ln -s "../compat/$soname" "$R/compat-active/$soname"
      compat_ours="$compat_ours ${soname%%.so*}"
    fi
  done

  # ---- CUDA libraries we do not carry (cuBLASLt): PyTorch's wheels or a CUDA install ---------------
  ext_dirs="" missing="" searched=""
  if [ "${DTENSOR_GPU_ENV_NO_CUDA:-0}" != 1 ] && [ -s "$R/manifest/external.txt" ]; then
    local cands=() seen_py=""
    tmo=""; command -v timeout >/dev/null 2>&1 && tmo="timeout 30"
    local IFS_save=$IFS
    IFS=:
    for d in ${DTENSOR_CUDA_LIBDIR:-}; do [ -n "$d" ] && cands+=("$d"); done
    for d in $base_path; do
      if [ -z "$d" ] || [ ! -x "$d/python3" ]; then continue; fi
      case " $seen_py " in *" $d/python3 "*) continue ;; esac
      seen_py="$seen_py $d/python3"
      searched="$searched $d/python3"
      IFS=$IFS_save
      while IFS= read -r sp; do
        [ -d "$sp" ] || continue
        for e in "$sp"/nvidia/cu13/lib "$sp"/nvidia/cublas/lib "$sp"/nvidia/*/lib "$sp"/torch/lib; do
          [ -d "$e" ] && cands+=("$e")
        done
      done < <($tmo "$d/python3" -c 'import site, sys
p = []
try: p += site.getsitepackages()
except Exception: pass
try: p.append(site.getusersitepackages())
except Exception: pass
print("\n".join(x for x in p + sys.path if x))' 2>/dev/null)
      IFS=:
    done
    IFS=$IFS_save
    for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
      [ -n "$d" ] || continue
      for e in "$d/lib64" "$d/targets/x86_64-linux/lib"; do [ -d "$e" ] && cands+=("$e"); done
    done
    cands+=(/usr/lib/x86_64-linux-gnu /usr/lib64)
    while read -r soname; do
      [ -n "$soname" ] || continue
      f=""
      for d in "${cands[@]}"; do
        if [ -e "$d/$soname" ]; then f=$d; break; fi
      done
      if [ -z "$f" ]; then
        missing="$missing $soname"
        continue
      fi
      f=$(cd "$f" && pwd)
      case "$f" in /lib|/usr/lib|/lib64|/usr/lib64|/lib/x86_64-linux-gnu|/usr/lib/x86_64-linux-gnu) continue ;; esac
      case ":$ext_dirs:" in *":$f:"*) ;; *) ext_dirs=${ext_dirs:+$ext_dirs:}$f ;; esac
      found[$soname]=$f
    done <"$R/manifest/external.txt"
    # NCCL, optional (218 MB: not carried): PyTorch's wheels ship one. Without it the library
    # moves device data through host-staged MPI and says so.
    if [ -z "${DTENSOR_NCCL:-}" ]; then
      for d in "${cands[@]}"; do
        if [ -e "$d/libnccl.so.2" ]; then
          export DTENSOR_NCCL="$(cd "$d" && pwd)/libnccl.so.2"
          break
        fi
      done
    fi
  fi
  cudart_from=""
  if [ -n "$(ls "$R"/cuda/ 2>/dev/null)" ]; then
    cudart_from=carried
    local IFS_save2=$IFS; IFS=:
    for d in $ext_dirs; do
      for f in "$R"/cuda/libcudart.so.*; do
        [ -e "$d/${f##*/}" ] && { cudart_from=$d; break 2; }
      done
    done
    IFS=$IFS_save2
  fi

  # ---- the driver's libcuda.so.1: usually on the loader's path already ----------------------------
  driver="" driver_dir=""
  if driver=$(_dt_syslib libcuda.so.1); then
    :
  else
    for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/wsl/lib; do
      if [ -e "$d/libcuda.so.1" ]; then driver=$d/libcuda.so.1; driver_dir=$d; break; fi
    done
  fi

  # ---- export -------------------------------------------------------------------------------------
  added="$R/bin:$R/lib${ext_dirs:+:$ext_dirs}:$R/cuda:$R/compat-active${driver_dir:+:$driver_dir}"
  export PATH="$R/bin${base_path:+:$base_path}"
  export LD_LIBRARY_PATH="$R/lib${ext_dirs:+:$ext_dirs}:$R/cuda:$R/compat-active${base_ld:+:$base_ld}${driver_dir:+:$driver_dir}"
  export DTENSOR_GPU_ENV_ADDED="$added"
  export DTENSOR_GPU_RUNTIME="$R"
  # Open MPI 4.1 relocation: every install dir derives from OPAL_PREFIX (libdir, pkglibdir =
  # components, pkgdatadir = help files) except sysconfdir, configured as the absolute /etc/openmpi
  export OPAL_PREFIX="$R/root/usr"
  export OPAL_SYSCONFDIR="$R/root/etc/openmpi"
  # PMIx 4.2 (pinstalldirs env): Debian configured libdir, datadir and sysconfdir as absolute
  # paths, so PMIX_PREFIX alone does not move them. PMIX_LIBDIR moves the component folder
  # (<libdir>/pmix, always searched: PMIX_MCA_mca_base_component_path only adds folders),
  # PMIX_DATADIR the help files, PMIX_SYSCONFDIR pmix-mca-params.conf
  export PMIX_PREFIX="$R/root$pmix_prefix"
  export PMIX_EXEC_PREFIX="$R/root$pmix_prefix"
  export PMIX_LIBDIR="$R/root$pmix_libdir"
  export PMIX_DATAROOTDIR="$R/root$pmix_datadir"
  export PMIX_DATADIR="$R/root$pmix_datadir"
  export PMIX_SYSCONFDIR="$R/root$pmix_sysconfdir"
  # hwloc: no plugins (pci, gl, opencl, libxml): keep the machine's own (another version) out
  export HWLOC_PLUGINS_PATH="$R/hwloc-plugins"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export OMPI_MCA_btl=self,vader
  vader_note=""
  if [ -z "${OMPI_MCA_btl_vader_single_copy_mechanism:-}" ] && [ "$(uname -r)" = 4.4.0 ]; then
    # gVisor (reports kernel 4.4.0): cross-memory attach (process_vm_readv) between ranks is
    # not to be relied on there; export OMPI_MCA_btl_vader_single_copy_mechanism=cma to override
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
    vader_note=" | gVisor: vader single copy off"
  fi
  hash -r 2>/dev/null
  foreign=$(env | sed -n 's/^\(\(OMPI_MCA\|PMIX_MCA\|OPAL\)_[A-Za-z0-9_]*\)=.*/\1/p' |
    grep -vxE 'OMPI_MCA_(rmaps_base_oversubscribe|btl|btl_vader_single_copy_mechanism)|OPAL_(PREFIX|SYSCONFDIR)' |
    tr '\n' ' ')

  # ---- one line -----------------------------------------------------------------------------------
  if [ -n "$missing" ]; then
    echo "gpu_env: error: not found on this machine:$missing (searched DTENSOR_CUDA_LIBDIR, site-packages of${searched:- no python3 on PATH} [nvidia/*/lib, torch/lib], /usr/local/cuda*/lib64, /usr/lib/x86_64-linux-gnu); point DTENSOR_CUDA_LIBDIR at the folder holding it, or set DTENSOR_GPU_ENV_NO_CUDA=1 for CPU-only runs. Open MPI is set up." >&2
    return 1
  fi
  local cublas_note="cuBLASLt: not needed"
  if [ "${DTENSOR_GPU_ENV_NO_CUDA:-0}" = 1 ]; then
    cublas_note="CUDA libraries: not searched"
  elif [ -s "$R/manifest/external.txt" ]; then
    cublas_note=""
    while read -r soname; do
      [ -n "$soname" ] || continue
      cublas_note="$cublas_note${cublas_note:+, }${soname%%.so*} ${found[$soname]:-system path}"
    done <"$R/manifest/external.txt"
  fi
  echo "gpu_env: Open MPI ${ompi_version:-?} from $R ($state) | $cublas_note | NCCL ${DTENSOR_NCCL:-not found (device data through host-staged MPI)}${cudart_from:+ | cudart $cudart_from} | system:${compat_sys:- none} | carried compat:${compat_ours:- none} | libcuda.so.1 ${driver:-not found (no NVIDIA driver)}$vader_note${foreign:+ | kept outside settings: $foreign}" >&2
  return 0
}

if [ -n "${BASH_VERSION:-}" ] && [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "gpu_env: source this file (source tools/gpu_env.sh), do not run it" >&2
  exit 2
fi
_dt_gpu_env_main "$@"
_dt_gpu_env_rc=$?
unset -f _dt_gpu_env_main _dt_strip _dt_syslib
eval "unset _dt_gpu_env_rc; return $_dt_gpu_env_rc"
