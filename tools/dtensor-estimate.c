/* dtensor-estimate - will it fit, and which layout is fastest: the trainer's model and step run on
 * a simulated world (dt_init_simulated: the meta backend, simulated communicators, the simulated
 * clock), without MPI, GPUs or tensor memory.
 *
 *   dtensor-estimate --np N [--budget 80GiB] [--machine h100|h200|FILE.json] [TRAINER FLAGS]
 *   dtensor-estimate --np N --plan [--budget 80GiB] [--top K] [TRAINER FLAGS]
 *
 * The model, batch, device and layout are the trainer's (examples/train.c: --config FILE.json
 * and the same flags; `train --help` lists them). Without --plan it estimates that layout: the
 * trainer's estimate lines for the worst rank (peak memory per category, the traffic per mesh
 * dim, the step time and tokens/s), then a verdict against --budget. The worst rank is found by
 * evaluating the ranks whose shards differ: the first and the last coordinate of every mesh dim
 * (under the chunk rule the first holds the largest shards, the last the smallest or none; every
 * other rank lies between), i.e. at most four ranks of the trainer's meshes.
 *
 * --plan enumerates the layouts of N ranks: DDP, FSDP (reshard after forward 1 and 0), HSDP
 * (every R x S with R, S > 1), and the parallel configs dp x tp x ep x cp (tp dividing N, ep with
 * --model moe, cp: context parallelism, with ep too) with and without sequence and loss
 * parallelism (together) and both reshard modes; each with and without activation checkpointing and at 1, 2 and 4 micro-batches (where
 * the batch divides and every data rank keeps a sequence per pass), at the same global batch.
 * Layouts the trainer refuses (tp not dividing the heads, ...) are listed with its reason.
 * Those that fit the budget are ranked by estimated tokens/s; the table shows --top K (default 20)
 * of them and the smallest of those that do not fit.
 *
 * Exit status: 0 when the layout fits (or, with --plan, some layout fits; always 0 without
 * --budget), 1 when nothing fits or an estimate failed, 2 on bad flags (the tool's, or flags the
 * trainer refuses).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../examples/train_config.h"

#define MAX_ARGS 256

typedef struct {
  char desc[200];   /* the layout's flags */
  int ok;           /* estimated */
  int rc;           /* the trainer's exit status when not */
  char why[512];    /* refused: the trainer's message */
  double peak;      /* worst rank's total peak, bytes */
  int peak_rank;
  double step_ms, exposed_ms, tokens_s;
  int time_rank;
  char cats[512]; /* worst rank's peak_memory line */
} result_t;

/* --plan's layouts: trainer flags, one string each, in a growing array. */
typedef struct {
  char (*v)[200];
  int n, cap, failed;
} layouts_t;

static void layouts_add(layouts_t* l, const char* fmt, ...) {
  if (l->failed) return;
  if (l->n == l->cap) {
    const int cap = l->cap ? 2 * l->cap : 256;
    char(*v)[200] = realloc(l->v, (size_t)cap * sizeof *v);
    if (v == NULL) {
      l->failed = 1;
      return;
    }
    l->v = v;
    l->cap = cap;
  }
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(l->v[l->n++], sizeof l->v[0], fmt, ap);
  va_end(ap);
}

/* "80GiB", "80GB", "80G", "512MiB", "1e9": bytes; -1 when malformed or outside [1 byte, 8 EiB]. */
static double parse_bytes(const char* s) {
  char* end;
  errno = 0;
  if (strpbrk(s, "xXpP") != NULL) return -1; /* strtod's hexadecimal floats */
  double v = strtod(s, &end);
  if (end == s || errno != 0 || !(v > 0) || !isfinite(v)) return -1;
  static const struct {
    const char* unit;
    double mult;
  } units[] = {{"", 1},         {"B", 1},         {"KiB", 1024.0}, {"MiB", 1048576.0},
               {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"K", 1024.0}, {"M", 1048576.0},
               {"G", 1073741824.0}, {"T", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6},
               {"GB", 1e9}, {"TB", 1e12}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcmp(end, units[i].unit)) {
      const double b = v * units[i].mult; /* a byte at least, and finite in its unit too */
      return isfinite(b) && b >= 1.0 && b <= 9.2e18 ? b : -1;
    }
  return -1;
}

/* Runs train_main(argv) in a child with its output in `out` and `err` (NUL-terminated, cut at
 * cap). Returns its exit status (-1: it did not exit normally). */
static int run_child(char** argv, int argc, char* out, size_t out_cap, char* err, size_t err_cap) {
  char po[] = "/tmp/dt_estimate_out_XXXXXX", pe[] = "/tmp/dt_estimate_err_XXXXXX";
  int fo = mkstemp(po), fe = mkstemp(pe);
  if (fo < 0 || fe < 0) {
    snprintf(err, err_cap, "cannot create temporary files: %s", strerror(errno));
    if (fo >= 0) close(fo), unlink(po);
    if (fe >= 0) close(fe), unlink(pe);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = train_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  int status = 0;
  if (pid > 0) waitpid(pid, &status, 0);
  const int fds[2] = {fo, fe};
  char* bufs[2] = {out, err};
  size_t caps[2] = {out_cap, err_cap};
  for (int k = 0; k < 2; k++) {
    ssize_t n = 0, got;
    lseek(fds[k], 0, SEEK_SET);
    while ((size_t)n + 1 < caps[k] && (got = read(fds[k], bufs[k] + n, caps[k] - 1 - (size_t)n)) > 0)
      n += got;
    bufs[k][n] = '\0';
    close(fds[k]);
  }
  unlink(po);
  unlink(pe);
  if (pid < 0) {
    snprintf(err, err_cap, "fork failed: %s", strerror(errno));
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The value after "key=" on the line starting with `prefix`, or NAN. */
static double field(const char* text, const char* prefix, const char* key) {
  const char* line = strstr(text, prefix);
  if (line == NULL) return NAN;
  const char* eol = strchr(line, '\n');
  char k[64];
  snprintf(k, sizeof k, " %s=", key);
  const char* at = strstr(line, k);
  if (at == NULL || (eol && at > eol)) return NAN;
  return strtod(at + strlen(k), NULL);
}

/* The first line of s (a message) into dst. */
static void first_line(char* dst, size_t cap, const char* s) {
  const char* p = s;
  while (*p == '\n') p++;
  size_t n = strcspn(p, "\n");
  if (n >= cap) n = cap - 1;
  memcpy(dst, p, n);
  dst[n] = '\0';
}

/* The reason in a failed child's stderr: its last line that is not one of the library's notices
 * ("[dtensor ...] ...", e.g. which cost model it loaded); the trainer's notes (--device's) come
 * before the refusal that ends it. Else its first line. */
static void reason_line(char* dst, size_t cap, const char* err) {
  const char* last = NULL;
  for (const char* p = err; *p;) {
    while (*p == '\n') p++;
    if (*p && strncmp(p, "[dtensor", 8) != 0) last = p;
    p += strcspn(p, "\n");
  }
  first_line(dst, cap, last ? last : err);
}

/* Estimates one layout (base args + layout args) on every rank of `ranks`; the worst rank's
 * memory and time into r. Prints the trainer's output of the worst memory rank when `echo`.
 * What the first successful child of the process wrote to stderr (the library's notices, the
 * trainer's warnings: every child would repeat them) goes to stderr once. */
static void estimate(char** base, int nbase, const char* layout, const int* ranks, int nranks,
                     result_t* r, int echo) {
  static char out[1 << 20], err[1 << 16], keep[1 << 20];
  memset(r, 0, sizeof *r);
  snprintf(r->desc, sizeof r->desc, "%s", layout);
  r->peak = -1;
  r->step_ms = -1;
  char* argv[MAX_ARGS + 8];
  char lay[512], rank_s[16];
  snprintf(lay, sizeof lay, "%s", layout);
  int argc = 0;
  for (int i = 0; i < nbase; i++) argv[argc++] = base[i];
  for (char* tok = strtok(lay, " "); tok && argc < MAX_ARGS; tok = strtok(NULL, " "))
    argv[argc++] = tok;
  argv[argc++] = "--estimate-rank";
  argv[argc++] = rank_s;
  argv[argc] = NULL;
  for (int k = 0; k < nranks; k++) {
    if (k > 0 && ranks[k] == ranks[k - 1]) continue;
    snprintf(rank_s, sizeof rank_s, "%d", ranks[k]);
    int rc = run_child(argv, argc, out, sizeof out, err, sizeof err);
    if (rc != 0) {
      r->rc = rc;
      reason_line(r->why, sizeof r->why, err[0] ? err : "the estimate failed");
      if (rc < 0 && !err[0]) snprintf(r->why, sizeof r->why, "the estimate crashed");
      r->ok = 0;
      return;
    }
    static int notices_shown = 0;
    if (!notices_shown) {
      notices_shown = 1;
      fputs(err, stderr);
    }
    char prefix[64];
    snprintf(prefix, sizeof prefix, "peak_memory_bytes rank %d:", ranks[k]);
    double peak = field(out, prefix, "total");
    snprintf(prefix, sizeof prefix, "estimate_step rank %d:", ranks[k]);
    double ms = field(out, prefix, "time_ms");
    if (isnan(peak) || isnan(ms)) {
      snprintf(r->why, sizeof r->why, "no estimate lines in the trainer's output");
      return;
    }
    if (ms > r->step_ms) {
      r->step_ms = ms;
      r->exposed_ms = field(out, prefix, "exposed_comm_ms");
      r->tokens_s = field(out, prefix, "tokens_per_s");
      r->time_rank = ranks[k];
    }
    if (peak > r->peak) {
      r->peak = peak;
      r->peak_rank = ranks[k];
      snprintf(prefix, sizeof prefix, "peak_memory rank %d:", ranks[k]);
      const char* line = strstr(out, prefix);
      if (line) first_line(r->cats, sizeof r->cats, line + strlen(prefix));
      if (echo) snprintf(keep, sizeof keep, "%s", out);
    }
  }
  r->ok = 1;
  if (echo) { /* the worst rank's lines, the trainer's header and the final line left out */
    for (char* line = strtok(keep, "\n"); line; line = strtok(NULL, "\n"))
      if (strncmp(line, "final_loss=", 11) != 0) printf("%s\n", line);
  }
}

/* The ranks whose shards differ: first and last coordinates of a mesh whose inner dim has
 * `inner` ranks (1-D: inner 1), sorted. */
static int distinct_ranks(int np, int inner, int* out) {
  int c[4] = {0, inner - 1, np - inner, np - 1}, n = 0;
  for (int i = 0; i < 4; i++) {
    int dup = 0;
    for (int j = 0; j < n; j++) dup |= out[j] == c[i];
    if (!dup && c[i] >= 0 && c[i] < np) out[n++] = c[i];
  }
  for (int i = 1; i < n; i++) /* sort */
    for (int j = i; j > 0 && out[j] < out[j - 1]; j--) {
      int t = out[j];
      out[j] = out[j - 1];
      out[j - 1] = t;
    }
  return n;
}

static int by_speed(const void* a, const void* b) {
  const result_t *x = a, *y = b;
  return (x->tokens_s < y->tokens_s) - (x->tokens_s > y->tokens_s);
}
static int by_peak(const void* a, const void* b) {
  const result_t *x = a, *y = b;
  return (x->peak > y->peak) - (x->peak < y->peak);
}

static void usage(FILE* f) {
  fprintf(f,
          "usage: dtensor-estimate --np N [--budget 80GiB] [--machine h100|h200|FILE.json]\n"
          "                        [--plan [--top K]] [TRAINER FLAGS: --config FILE.json, --dim, "
          "--layers, --batch, --seq, --dp/--tp/--ep/--cp/--sp, --parallel, --checkpoint, --device ...]\n"
          "  Estimates the trainer's step on a simulated world of N ranks (no MPI, no tensor "
          "memory):\n"
          "  the worst rank's peak memory per category, the traffic per mesh dim, the step time.\n"
          "  --plan ranks the layouts of N ranks that fit --budget by estimated tokens/s.\n"
          "  --machine prices the step time (default: the loaded cost model, dtensor-calibrate -o).\n"
          "  Exit 0 fits (or no --budget), 1 nothing fits or an estimate failed, 2 bad flags.\n");
}

int main(int argc, char** argv) {
  char* base[MAX_ARGS];
  int nbase = 0, np = 0, plan = 0, top = 20;
  double budget = -1;
  base[nbase++] = "train";
  base[nbase++] = "--estimate-only";
  train_opts_t o; /* the model flags, read here only to know the mesh for the worst rank */
  train_opts_defaults(&o, "");
  o.np = 0; /* 0: no --np yet (neither a flag nor the config's key) */
  char err[1200];
  /* the trainer reads --config first and lets the flags override it, wherever they stand */
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--config") && !train_opts_load_file(&o, argv[i + 1], err, sizeof err)) {
      fprintf(stderr, "dtensor-estimate: cannot use config %s: %s\n", argv[i + 1], err);
      return 2;
    }
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--plan")) {
      plan = 1;
    } else if ((!strcmp(a, "--budget") || !strcmp(a, "--top")) && i + 1 == argc) {
      fprintf(stderr, "dtensor-estimate: %s needs a value\n", a);
      return 2;
    } else if (!strcmp(a, "--budget") && i + 1 < argc) {
      budget = parse_bytes(argv[++i]);
      if (budget <= 0) {
        fprintf(stderr, "dtensor-estimate: --budget %s: a size from 1 byte to 8 EiB, such as "
                "80GiB, 80GB or 85899345920\n", argv[i]);
        return 2;
      }
    } else if (!strcmp(a, "--top") && i + 1 < argc) {
      char* end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || v < 1 || v > 10000) {
        fprintf(stderr, "dtensor-estimate: --top needs a count in [1, 10000]\n");
        return 2;
      }
      top = (int)v;
    } else if (!strcmp(a, "--estimate-only") || !strcmp(a, "--estimate-rank")) {
      fprintf(stderr, "dtensor-estimate: %s is the tool's to set\n", a);
      return 2;
    } else {
      if (nbase + 2 >= MAX_ARGS) {
        fprintf(stderr, "dtensor-estimate: too many arguments\n");
        return 2;
      }
      base[nbase++] = argv[i];
      if (!strncmp(a, "--", 2)) { /* the trainer checks every flag; note what the layout needs */
        char key[64];
        snprintf(key, sizeof key, "%s", a + 2);
        for (char* p = key; *p; p++)
          if (*p == '-') *p = '_';
        if (strcmp(key, "config") && strcmp(key, "help") && !train_opts_known(key)) {
          fprintf(stderr, "dtensor-estimate: unknown flag %s (dtensor-estimate --help, train "
                  "--help)\n", a);
          return 2;
        }
        if ((!strcmp(key, "config") || !train_opts_is_switch(key)) && i + 1 == argc) {
          /* the trainer would take the tool's --estimate-rank as its value */
          fprintf(stderr, "dtensor-estimate: %s needs a value\n", a);
          return 2;
        }
        if (!strcmp(key, "config") && i + 1 < argc) {
          base[nbase++] = argv[++i]; /* read above */
        } else if (!train_opts_is_switch(key) && i + 1 < argc) {
          base[nbase++] = argv[++i];
          if (!train_opts_set(&o, key, argv[i], err, sizeof err)) {
            fprintf(stderr, "dtensor-estimate: %s %s: %s\n", a, argv[i], err);
            return 2;
          }
        } else if (train_opts_is_switch(key)) {
          train_opts_set(&o, key, "1", err, sizeof err);
        }
      }
    }
  }
  np = o.np;
  if (np == 0) {
    fprintf(stderr, "dtensor-estimate: --np N (the world size) is required\n");
    usage(stderr);
    return 2;
  }
  if (plan && (o.dp || o.tp || o.ep || o.cp || o.sp || o.loss_parallel || o.async_tp ||
               strcmp(o.parallel, "none") || o.mesh[0] || o.plan[0] || o.checkpoint ||
               o.reshard_after_forward != 1 || o.micro_batches != 1)) {
    fprintf(stderr, "dtensor-estimate: --plan chooses the layout: drop --dp, --tp, --ep, --cp, --sp, "
            "--loss-parallel, --async-tp, --parallel, --mesh, a config's \"plan\", --checkpoint, "
            "--reshard-after-forward and --micro-batches\n");
    return 2;
  }
  int ranks[4];
  if (!plan) {
    int inner = 1;
    if (o.tp > 0) inner = o.tp;
    else if (o.mesh[0]) {
      int shape[4], nd;
      if (train_mesh_parse(o.mesh, shape, &nd) && nd > 1) inner = o.mesh[0] ? shape[nd - 1] : 1;
    }
    int nr = distinct_ranks(np, inner > np ? 1 : inner, ranks);
    result_t r;
    estimate(base, nbase, "", ranks, nr, &r, 1);
    if (!r.ok) {
      fprintf(stderr, "dtensor-estimate: %s\n", r.why);
      return r.rc == 2 ? 2 : 1; /* the trainer refused the flags, or the estimate failed */
    }
    printf("# ranks evaluated:");
    for (int k = 0; k < nr; k++) printf(" %d", ranks[k]);
    printf("; the worst: rank %d by memory (peak %.2f GiB), rank %d by time (%.1f ms per step)\n",
           r.peak_rank, r.peak / 1073741824.0, r.time_rank, r.step_ms);
    if (budget > 0) {
      int fits = r.peak <= budget;
      printf("fits=%s peak_gib=%.2f budget_gib=%.2f step_ms=%.1f tokens_per_s=%.0f\n",
             fits ? "yes" : "no", r.peak / 1073741824.0, budget / 1073741824.0, r.step_ms,
             r.tokens_s);
      return fits ? 0 : 1;
    }
    return 0;
  }
  /* --plan: the layouts of np ranks (as many as the world's divisors make) */
  layouts_t lays = {0};
  const int moe = !strcmp(o.model, "moe");
  /* each layout at K = 1, 2, 4 micro-batches where the batch divides and every data rank still
   * gets a sequence per pass; with and without activation checkpointing */
  for (int k = 1; k <= 4; k *= 2)
    for (int ck = 0; ck < 2; ck++) {
      char cks[64];
      snprintf(cks, sizeof cks, "%s%s", ck ? " --checkpoint" : "", "");
      if (k > 1) snprintf(cks + strlen(cks), sizeof cks - strlen(cks), " --micro-batches %d", k);
      const int ok_k = o.batch % k == 0; /* data ranks checked per layout below */
#define ADD(data_ranks, ...)                                                        \
  do {                                                                              \
    if (ok_k && o.batch / k >= (data_ranks)) layouts_add(&lays, __VA_ARGS__);       \
  } while (0)
      if (np > 1) {
        ADD(np, "--parallel ddp%s", cks);
        ADD(np, "--parallel fsdp%s", cks);
        ADD(np, "--parallel fsdp --reshard-after-forward 0%s", cks);
        for (int r = 2; r < np; r++)
          if (np % r == 0) ADD(np, "--parallel hsdp --mesh %dx%d%s", r, np / r, cks);
      } else {
        ADD(1, "--parallel none --dp 1%s", cks);
      }
      for (int t = 1; t <= np; t++) {
        if (np % t) continue;
        for (int e = 1; e <= np / t; e++) {
          if ((np / t) % e || (e > 1 && !moe)) continue;
          for (int cp = 1; cp <= np / t / e; cp++) { /* context parallel */
            if ((np / t / e) % cp || (t == 1 && e == 1 && cp == 1)) continue;
            int d = np / t / e / cp;
            char eps[48] = ""; /* --ep only for MoE, --cp where it is > 1 */
            int n = e > 1 ? snprintf(eps, sizeof eps, " --ep %d", e) : 0;
            if (cp > 1) snprintf(eps + n, sizeof eps - (size_t)n, " --cp %d", cp);
            for (int sp = 0; sp <= (t > 1); sp++)
              for (int ra = 1; ra >= (d * e > 1 ? 0 : 1); ra--)
                ADD(d * e, "--dp %d --tp %d%s%s%s%s", d, t, eps, sp ? " --sp --loss-parallel" : "",
                    ra ? "" : " --reshard-after-forward 0", cks);
          }
        }
      }
#undef ADD
    }
  const int nl = lays.n;
  char(*lay)[200] = lays.v;
  result_t* res = calloc((size_t)nl + 1, sizeof *res);
  result_t* sorted = calloc((size_t)nl + 1, sizeof *sorted);
  if (lays.failed || res == NULL || sorted == NULL) {
    fprintf(stderr, "dtensor-estimate: no memory for %d layouts\n", nl);
    return 1;
  }
  int nfit = 0, nover = 0, nref = 0;
  for (int i = 0; i < nl; i++) {
    int inner = 1, t = 0, r = 0, s = 0;
    if (sscanf(lay[i], "--dp %*d --tp %d", &t) == 1) inner = t;
    else if (sscanf(lay[i], "--parallel hsdp --mesh %dx%d", &r, &s) == 2) inner = s;
    int nr = distinct_ranks(np, inner, ranks);
    estimate(base, nbase, lay[i], ranks, nr, &res[i], 0);
    if (!res[i].ok) nref++;
    else if (budget > 0 && res[i].peak > budget) nover++;
    else nfit++;
  }
  /* fitting ones first (by tokens/s), then those over the budget (by peak), then refused */
  int a = 0, b = nfit, c = nfit + nover;
  for (int i = 0; i < nl; i++) {
    if (!res[i].ok) sorted[c++] = res[i];
    else if (budget > 0 && res[i].peak > budget) sorted[b++] = res[i];
    else sorted[a++] = res[i];
  }
  qsort(sorted, (size_t)nfit, sizeof *sorted, by_speed);
  qsort(sorted + nfit, (size_t)nover, sizeof *sorted, by_peak);
  printf("# %d layouts of %d ranks: %d fit%s, %d over the budget, %d refused by the trainer\n", nl,
         np, nfit, budget > 0 ? "" : " (no --budget)", nover, nref);
  int w = 6; /* the layout column as wide as its widest printed entry */
  for (int i = 0; i < nfit + nover; i++)
    if ((i < nfit && i < top) || (i >= nfit && i < nfit + 5)) {
      const int len = (int)strlen(sorted[i].desc);
      if (len > w) w = len;
    }
  printf("%-4s %-*s %10s %9s %10s %9s\n", "rank", w, "layout", "tokens/s", "step_ms",
         "exposed_ms", "peak_GiB");
  for (int i = 0; i < nfit && i < top; i++)
    printf("%-4d %-*s %10.0f %9.1f %10.1f %9.3f\n", i + 1, w, sorted[i].desc,
           sorted[i].tokens_s, sorted[i].step_ms, sorted[i].exposed_ms,
           sorted[i].peak / 1073741824.0);
  for (int i = nfit; i < nfit + nover && i < nfit + 5; i++)
    printf("%-4s %-*s %10.0f %9.1f %10.1f %9.3f  over budget\n", "-", w, sorted[i].desc,
           sorted[i].tokens_s, sorted[i].step_ms, sorted[i].exposed_ms,
           sorted[i].peak / 1073741824.0);
  for (int i = nfit + nover; i < nl; i++) printf("#   refused: %s: %s\n", sorted[i].desc, sorted[i].why);
  int rc = 0;
  if (nfit == 0) {
    if (nover > 0)
      fprintf(stderr, "dtensor-estimate: no layout fits in %.2f GiB: the smallest peak is %.2f "
              "GiB (%s)\n", budget / 1073741824.0, sorted[nfit].peak / 1073741824.0,
              sorted[nfit].desc);
    else
      fprintf(stderr, "dtensor-estimate: the trainer refused every layout (see above)\n");
    rc = 1;
  } else {
    printf("best: %s (%.0f tokens/s, peak %.2f GiB)\n", sorted[0].desc, sorted[0].tokens_s,
           sorted[0].peak / 1073741824.0);
  }
  free(sorted);
  free(res);
  free(lay);
  return rc;
}
