/* dtensor-ckpt - distributed checkpoints seen from outside a training run, without MPI.
 *
 *   dtensor-ckpt info PATH                 step, named values, every tensor (dtype, shape, the mesh
 *                                          and placements it was saved from, boxes, bytes)
 *   dtensor-ckpt verify PATH               reads every byte and checks every checksum and header
 *   dtensor-ckpt consolidate PATH OUT.safetensors [--max-file-bytes N[K|M|G]] [--with-optimizer]
 *                                          whole tensors in one safetensors file, or, past N
 *                                          bytes, Hugging Face's sharded form (OUT.index.json
 *                                          and model-0000i-of-0000n.safetensors beside it)
 *   dtensor-ckpt import SRC DIR [--name NAME] [--step N]
 *                                          a safetensors file (or a *.safetensors.index.json and
 *                                          its shards) as a one-rank checkpoint DIR/NAME that
 *                                          dt_checkpoint_load places onto any mesh
 *
 * PATH is a checkpoint directory (DIR/NAME) or a directory holding a `latest` pointer. A thin
 * layer over the local functions of dtensor/checkpoint.h (no dt_init). Exit status 0 on success,
 * 1 when the library fails (its message on stderr), 2 on a bad command line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtensor/checkpoint.h"
#include "dtensor/dtensor.h"

static void usage(FILE* f) {
  fprintf(f,
          "usage: dtensor-ckpt info PATH\n"
          "       dtensor-ckpt verify PATH\n"
          "       dtensor-ckpt consolidate PATH OUT.safetensors [--max-file-bytes N[K|M|G]]\n"
          "                    [--with-optimizer]\n"
          "       dtensor-ckpt import SRC.safetensors|SRC.safetensors.index.json DIR "
          "[--name NAME]\n"
          "                    [--step N]\n"
          "       dtensor-ckpt --help\n"
          "Inspects, checks and converts dtensor checkpoints without MPI. PATH is a checkpoint\n"
          "directory (DIR/NAME) or a directory whose `latest` file names one.\n"
          "\n"
          "  info         the step, named values and every tensor: dtype, shape, the mesh and\n"
          "               placements it was saved from, its boxes and bytes\n"
          "  verify       reads every byte of every file, checks every checksum and header; names\n"
          "               the first damaged file and tensor\n"
          "  consolidate  whole tensors (parameters and plain tensors) as one safetensors file\n"
          "    --max-file-bytes N   past N bytes of tensors (suffix K, M or G: KiB, MiB, GiB),\n"
          "                         Hugging Face's sharded form instead: OUT.index.json\n"
          "                         (metadata.total_size, weight_map) and\n"
          "                         model-0000i-of-0000n.safetensors in OUT's directory\n"
          "    --with-optimizer     the optimizer state (optim.*) too\n"
          "  import       a safetensors file, or a Hugging Face index and its shards, as a\n"
          "               one-rank checkpoint DIR/NAME (DIR/latest names it) that\n"
          "               dt_checkpoint_load places onto any mesh and placements\n"
          "    --name NAME          the checkpoint's name (default step_%%08d of --step)\n"
          "    --step N             the step recorded in its index (default 0)\n"
          "\n"
          "Exit status: 0 success, 1 the library failed (its message on stderr), 2 bad usage.\n");
}

static int usage_error(const char* fmt, const char* a) {
  fprintf(stderr, "dtensor-ckpt: ");
  fprintf(stderr, fmt, a ? a : "");
  fprintf(stderr, " (dtensor-ckpt --help)\n");
  return 2;
}

static int lib_failed(void) {
  fprintf(stderr, "dtensor-ckpt: %s\n", dt_last_error());
  return 1;
}

/* "N", "NK", "NM", "NG" (binary multiples) into *out > 0; 0 on anything else or overflow. */
static int parse_bytes(const char* s, int64_t* out) {
  if (s == NULL || *s < '0' || *s > '9') return 0;
  errno = 0;
  char* end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s) return 0;
  int shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10;
  else if (*end == 'M' || *end == 'm') shift = 20;
  else if (*end == 'G' || *end == 'g') shift = 30;
  if (shift) end++;
  if (*end != '\0' || v == 0 || v > ((unsigned long long)INT64_MAX >> shift)) return 0;
  *out = (int64_t)(v << shift);
  return 1;
}

/* A decimal integer >= 0 into *out; 0 on anything else. */
static int parse_step(const char* s, int64_t* out) {
  if (s == NULL || *s < '0' || *s > '9') return 0;
  errno = 0;
  char* end = NULL;
  long long v = strtoll(s, &end, 10);
  if (errno != 0 || *end != '\0') return 0;
  *out = (int64_t)v;
  return 1;
}

static int is_help(const char* a) { return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0; }

/* Splits argv[first..argc) into positional arguments (at most max) and --flags; flags with a
 * value are matched against the names in `valued`. Returns the count of positionals or -1 after a
 * usage message (exit status in *rc). *help is set by --help/-h. */
typedef struct {
  const char* name;
  const char* value;
  int present;
} flag_t;

static int split_args(int argc, char** argv, int first, const char** pos, int max, flag_t* flags,
                      int nflags, int* help, int* rc) {
  int n = 0;
  for (int i = first; i < argc; i++) {
    const char* a = argv[i];
    if (is_help(a)) {
      *help = 1;
      continue;
    }
    if (strncmp(a, "--", 2) == 0) {
      int k = 0;
      while (k < nflags && strcmp(flags[k].name, a) != 0) k++;
      if (k == nflags) {
        *rc = usage_error("unknown option '%s'", a);
        return -1;
      }
      if (flags[k].present) {
        *rc = usage_error("option '%s' given twice", a);
        return -1;
      }
      flags[k].present = 1;
      if (flags[k].value != NULL) { /* a flag taking a value: value "" marks it */
        if (i + 1 >= argc) {
          *rc = usage_error("option '%s' needs a value", a);
          return -1;
        }
        flags[k].value = argv[++i];
      }
      continue;
    }
    if (n == max) {
      *rc = usage_error("unexpected argument '%s'", a);
      return -1;
    }
    pos[n++] = a;
  }
  return n;
}

/* Which form consolidate wrote: OUT itself, or OUT.index.json (whichever is newer). */
static void say_consolidated(const char* out) {
  char idx[4200];
  snprintf(idx, sizeof idx, "%s.index.json", out);
  struct stat a, b;
  int has_a = stat(out, &a) == 0, has_b = stat(idx, &b) == 0;
  if (has_b && (!has_a || b.st_mtime > a.st_mtime ||
                (b.st_mtime == a.st_mtime && b.st_mtim.tv_nsec >= a.st_mtim.tv_nsec)))
    printf("wrote %s and the shards it lists\n", idx);
  else
    printf("wrote %s\n", out);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char* cmd = argv[1];
  if (is_help(cmd)) {
    usage(stdout);
    return 0;
  }
  const char* pos[3];
  int help = 0, rc = 2;
  if (strcmp(cmd, "info") == 0 || strcmp(cmd, "verify") == 0) {
    int n = split_args(argc, argv, 2, pos, 1, NULL, 0, &help, &rc);
    if (n < 0) return rc;
    if (help) {
      usage(stdout);
      return 0;
    }
    if (n != 1) return usage_error("%s needs PATH", cmd);
    dt_status_t st = cmd[0] == 'i' ? dt_checkpoint_info(pos[0], stdout)
                                   : dt_checkpoint_verify(pos[0], stdout);
    return st == DT_SUCCESS ? 0 : lib_failed();
  }
  if (strcmp(cmd, "consolidate") == 0) {
    flag_t flags[2] = {{"--max-file-bytes", "", 0}, {"--with-optimizer", NULL, 0}};
    int n = split_args(argc, argv, 2, pos, 2, flags, 2, &help, &rc);
    if (n < 0) return rc;
    if (help) {
      usage(stdout);
      return 0;
    }
    if (n != 2) return usage_error("%s needs PATH and OUT.safetensors", cmd);
    int64_t max = 0;
    if (flags[0].present && !parse_bytes(flags[0].value, &max))
      return usage_error("--max-file-bytes '%s' is not a byte count above 0 (N, NK, NM or NG)",
                         flags[0].value);
    if (dt_checkpoint_consolidate(pos[0], pos[1], max, flags[1].present) != DT_SUCCESS)
      return lib_failed();
    say_consolidated(pos[1]);
    return 0;
  }
  if (strcmp(cmd, "import") == 0) {
    flag_t flags[2] = {{"--name", "", 0}, {"--step", "", 0}};
    int n = split_args(argc, argv, 2, pos, 2, flags, 2, &help, &rc);
    if (n < 0) return rc;
    if (help) {
      usage(stdout);
      return 0;
    }
    if (n != 2) return usage_error("%s needs SRC and DIR", cmd);
    int64_t step = 0;
    if (flags[1].present && !parse_step(flags[1].value, &step))
      return usage_error("--step '%s' is not an integer >= 0", flags[1].value);
    const char* name = flags[0].present ? flags[0].value : NULL;
    if (dt_checkpoint_import(pos[0], pos[1], name, step) != DT_SUCCESS) return lib_failed();
    char nm[DT_CHECKPOINT_NAME_MAX];
    if (name == NULL) snprintf(nm, sizeof nm, "step_%08" PRId64, step);
    printf("imported %s as %s/%s\n", pos[0], pos[1], name ? name : nm);
    return 0;
  }
  return usage_error("unknown command '%s' (info, verify, consolidate, import)", cmd);
}
