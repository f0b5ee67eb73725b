/* dtensor-estimate - will it fit, and which layout is fastest: the trainer's model and step run on
 * a simulated world (dt_init_simulated: the meta backend, simulated communicators, the simulated
 * clock), without MPI, GPUs or tensor memory.
 *
 *   dtensor-estimate --np N [--budget 80GiB] [--machine h100|h200|FILE.json] [TRAINER FLAGS]
 *   dtensor-estimate --np N --plan [--budget 80GiB] [--top K] [--jobs J] [TRAINER FLAGS]
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
 * of them and the smallest of those that do not fit. Each layout's ranks are estimated in child
 * processes, --jobs J (default: the online CPUs) at once; the table does not depend on J.
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

/* One trainer run in a child process: its output goes to two temporary files, read back when
 * it has exited. */
typedef struct {
  pid_t pid; /* > 0 while running */
  int fo, fe;
  char po[32], pe[32];
} child_t;

/* Forks train_main(argv) with its output to temporary files. 0, or -1 with the reason in err. */
static int child_start(child_t* c, char** argv, int argc, char* err, size_t err_cap) {
  snprintf(c->po, sizeof c->po, "/tmp/dt_estimate_out_XXXXXX");
  snprintf(c->pe, sizeof c->pe, "/tmp/dt_estimate_err_XXXXXX");
  c->pid = -1;
  c->fo = mkstemp(c->po);
  c->fe = mkstemp(c->pe);
  if (c->fo < 0 || c->fe < 0) {
    snprintf(err, err_cap, "cannot create temporary files: %s", strerror(errno));
    if (c->fo >= 0) close(c->fo), unlink(c->po);
    if (c->fe >= 0) close(c->fe), unlink(c->pe);
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  c->pid = fork();
  if (c->pid == 0) {
    dup2(c->fo, 1);
    dup2(c->fe, 2);
    int rc = train_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    _exit(rc);
  }
  if (c->pid < 0) {
    snprintf(err, err_cap, "fork failed: %s", strerror(errno));
    close(c->fo), unlink(c->po);
    close(c->fe), unlink(c->pe);
    return -1;
  }
  return 0;
}

/* After the child has exited with `status`: its output into out and err (NUL-terminated, cut at
 * their caps), the files removed. Returns its exit status (-1: it did not exit normally). */
static int child_finish(child_t* c, int status, char* out, size_t out_cap, char* err,
                        size_t err_cap) {
  const int fds[2] = {c->fo, c->fe};
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
  unlink(c->po);
  unlink(c->pe);
  c->pid = 0;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Runs train_main(argv) in a child and waits for it (see child_finish). */
static int run_child(char** argv, int argc, char* out, size_t out_cap, char* err, size_t err_cap) {
  child_t c;
  out[0] = '\0';
  if (child_start(&c, argv, argc, err, err_cap) != 0) return -1;
  int status = 0;
  while (waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
  }
  return child_finish(&c, status, out, out_cap, err, err_cap);
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

/* The trainer's argv for one layout and rank: base args, the layout's flags, the rank. `lay`
 * (the layout's copy, cut into tokens) and `rank_s` must outlive argv. Returns argc. */
static int layout_argv(char** argv, char** base, int nbase, const char* layout, char* lay,
                       size_t lay_cap, char* rank_s, size_t rank_cap, int rank) {
  snprintf(lay, lay_cap, "%s", layout);
  snprintf(rank_s, rank_cap, "%d", rank);
  int argc = 0;
  for (int i = 0; i < nbase; i++) argv[argc++] = base[i];
  char* save = NULL;
  for (char* tok = strtok_r(lay, " ", &save); tok && argc < MAX_ARGS; tok = strtok_r(NULL, " ", &save))
    argv[argc++] = tok;
  argv[argc++] = "--estimate-rank";
  argv[argc++] = rank_s;
  argv[argc] = NULL;
  return argc;
}

static void result_init(result_t* r, const char* layout) {
  memset(r, 0, sizeof *r);
  snprintf(r->desc, sizeof r->desc, "%s", layout);
  r->peak = -1;
  r->step_ms = -1;
}

/* One rank's run of a layout into r (the worst rank's memory and time so far). Returns 0 when
 * the layout is decided: refused or failed (r->ok stays 0), so its other ranks need not count.
 * What the first successful run wrote to stderr (the library's notices, the trainer's warnings:
 * every run would repeat them) goes to stderr once. With `keep`, the output of the worst memory
 * rank is copied there. */
static int absorb(result_t* r, int rank, int rc, const char* out, const char* err, char* keep,
                  size_t keep_cap) {
  if (rc != 0) {
    r->rc = rc;
    reason_line(r->why, sizeof r->why, err[0] ? err : "the estimate failed");
    if (rc < 0 && !err[0]) snprintf(r->why, sizeof r->why, "the estimate crashed");
    r->ok = 0;
    return 0;
  }
  static int notices_shown = 0;
  if (!notices_shown) {
    notices_shown = 1;
    fputs(err, stderr);
  }
  char prefix[64];
  snprintf(prefix, sizeof prefix, "peak_memory_bytes rank %d:", rank);
  double peak = field(out, prefix, "total");
  snprintf(prefix, sizeof prefix, "estimate_step rank %d:", rank);
  double ms = field(out, prefix, "time_ms");
  if (isnan(peak) || isnan(ms)) {
    snprintf(r->why, sizeof r->why, "no estimate lines in the trainer's output");
    r->ok = 0;
    return 0;
  }
  if (ms > r->step_ms) {
    r->step_ms = ms;
    r->exposed_ms = field(out, prefix, "exposed_comm_ms");
    r->tokens_s = field(out, prefix, "tokens_per_s");
    r->time_rank = rank;
  }
  if (peak > r->peak) {
    r->peak = peak;
    r->peak_rank = rank;
    snprintf(prefix, sizeof prefix, "peak_memory rank %d:", rank);
    const char* line = strstr(out, prefix);
    if (line) first_line(r->cats, sizeof r->cats, line + strlen(prefix));
    if (keep) snprintf(keep, keep_cap, "%s", out);
  }
  r->ok = 1;
  return 1;
}

/* Estimates one layout (base args + layout args) on every rank of `ranks` (sorted), one after
 * the other; the worst rank's memory and time into r. Prints the trainer's output of the worst
 * memory rank when `echo`. */
static void estimate(char** base, int nbase, const char* layout, const int* ranks, int nranks,
                     result_t* r, int echo) {
  static char out[1 << 20], err[1 << 16], keep[1 << 20];
  result_init(r, layout);
  char* argv[MAX_ARGS + 8];
  char lay[512], rank_s[16];
  for (int k = 0; k < nranks; k++) {
    if (k > 0 && ranks[k] == ranks[k - 1]) continue;
    int argc = layout_argv(argv, base, nbase, layout, lay, sizeof lay, rank_s, sizeof rank_s,
                           ranks[k]);
    int rc = run_child(argv, argc, out, sizeof out, err, sizeof err);
    if (!absorb(r, ranks[k], rc, out, err, echo ? keep : NULL, sizeof keep)) return;
  }
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

/* --plan's runs: one per (layout, rank), up to `jobs` children at once; each layout's result as
 * estimate() would give it (its ranks absorbed in order; after a refusal the rest are ignored). */
typedef struct {
  int layout, rank, rc;
  char *out, *err;
} job_t;

static int estimate_all(char** base, int nbase, char (*lay)[200], int nl, int np,
                        result_t* res, int jobs) {
  job_t* jv = calloc((size_t)nl * 4 + 1, sizeof *jv);
  child_t* kids = calloc((size_t)jobs, sizeof *kids);
  int* kid_job = calloc((size_t)jobs, sizeof *kid_job);
  int nj = 0, rc = 0;
  if (jv == NULL || kids == NULL || kid_job == NULL) {
    fprintf(stderr, "dtensor-estimate: no memory for %d layouts' runs\n", nl);
    rc = 1;
    goto done;
  }
  for (int i = 0; i < nl; i++) {
    int inner = 1, t = 0, r = 0, sh = 0, ranks[4];
    if (sscanf(lay[i], "--dp %*d --tp %d", &t) == 1) inner = t;
    else if (sscanf(lay[i], "--parallel hsdp --mesh %dx%d", &r, &sh) == 2) inner = sh;
    const int nr = distinct_ranks(np, inner, ranks);
    for (int k = 0; k < nr; k++) jv[nj++] = (job_t){.layout = i, .rank = ranks[k], .rc = -1};
  }
  static char out[1 << 20], err[1 << 16];
  int next = 0, running = 0;
  while (next < nj || running > 0) {
    while (running < jobs && next < nj) { /* start the next run in a free slot */
      int slot = 0;
      while (kids[slot].pid > 0) slot++;
      char* argv[MAX_ARGS + 8];
      char lay_copy[512], rank_s[16];
      int argc = layout_argv(argv, base, nbase, lay[jv[next].layout], lay_copy, sizeof lay_copy,
                             rank_s, sizeof rank_s, jv[next].rank);
      if (child_start(&kids[slot], argv, argc, err, sizeof err) != 0) {
        jv[next].err = strdup(err);
        jv[next].out = strdup("");
        next++;
        continue;
      }
      kid_job[slot] = next++;
      running++;
    }
    if (running == 0) break;
    int status = 0;
    pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "dtensor-estimate: waiting for the estimates: %s\n", strerror(errno));
      rc = 1;
      goto done;
    }
    for (int slot = 0; slot < jobs; slot++)
      if (kids[slot].pid == pid) {
        job_t* j = &jv[kid_job[slot]];
        j->rc = child_finish(&kids[slot], status, out, sizeof out, err, sizeof err);
        j->out = strdup(out);
        j->err = strdup(err);
        running--;
        break;
      }
  }
  for (int a = 0, b = 0; a < nj; a = b) { /* each layout's runs, its ranks in order */
    result_init(&res[jv[a].layout], lay[jv[a].layout]);
    for (b = a; b < nj && jv[b].layout == jv[a].layout; b++) {
    }
    for (int k = a; k < b; k++) {
      const job_t* j = &jv[k];
      if (j->out == NULL || j->err == NULL) {
        snprintf(res[j->layout].why, sizeof res[j->layout].why, "no memory for its output");
        res[j->layout].ok = 0;
        break;
      }
      if (!absorb(&res[j->layout], j->rank, j->rc, j->out, j->err, NULL, 0)) break;
    }
  }
done:
  if (jv)
    for (int k = 0; k < nj; k++) {
      free(jv[k].out);
      free(jv[k].err);
    }
  free(jv);
  free(kids);
  free(kid_job);
  return rc;
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
          "                        [--plan [--top K] [--jobs J]] [TRAINER FLAGS: --config FILE.json, --dim, "
          "--layers, --batch, --seq, --dp/--tp/--ep/--cp/--sp, --parallel, --checkpoint, --device ...]\n"
          "  Estimates the trainer's step on a simulated world of N ranks (no MPI, no tensor "
          "memory):\n"
          "  the worst rank's peak memory per category, the traffic per mesh dim, the step time.\n"
          "  --plan ranks the layouts of N ranks that fit --budget by estimated tokens/s,\n"
          "  J estimates at once (default: the online CPUs).\n"
          "  --machine prices the step time (default: the loaded cost model, dtensor-calibrate -o).\n"
          "  Exit 0 fits (or no --budget), 1 nothing fits or an estimate failed, 2 bad flags.\n");
}

int main(int argc, char** argv) {
  char* base[MAX_ARGS];
  int nbase = 0, np = 0, plan = 0, top = 20;
  const char* plan_only = NULL; /* --top or --jobs: they go with --plan */
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int jobs = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu;
  double budget = -1;
  base[nbase++] = "train";
  base[nbase++] = "--estimate-only";
  train_opts_t o; /* the model flags, read here only to know the mesh for the worst rank */
  train_opts_defaults(&o, "");
  o.np = 0; /* 0: no --np yet (neither a flag nor the config's key) */
  char err[1200];
  /* the trainer reads --config first and lets the flags override it, wherever they stand */
  for (int i = 1; i < argc; i++) {
    const char* path = !strncmp(argv[i], "--config=", 9) ? argv[i] + 9
                       : !strcmp(argv[i], "--config") && i + 1 < argc ? argv[i + 1] : NULL;
    if (path != NULL && !train_opts_load_file(&o, path, err, sizeof err)) {
      fprintf(stderr, "dtensor-estimate: cannot use config %s: %s\n", path, err);
      return 2;
    }
  }
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    /* --flag=value, as the trainer takes it: the name in `a`, the value in `inl` */
    char name[64];
    const char* inl = NULL;
    if (!strncmp(a, "--", 2) && strchr(a, '=') != NULL) {
      inl = strchr(a, '=') + 1;
      snprintf(name, sizeof name, "%.*s", (int)(inl - 1 - a), a);
      a = name;
    }
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--plan") && inl != NULL) {
      fprintf(stderr, "dtensor-estimate: --plan takes no value, got '%s'\n", argv[i]);
      return 2;
    } else if (!strcmp(a, "--plan")) {
      plan = 1;
    } else if ((!strcmp(a, "--budget") || !strcmp(a, "--top") || !strcmp(a, "--jobs")) &&
               i + 1 == argc && inl == NULL) {
      fprintf(stderr, "dtensor-estimate: %s needs a value\n", a);
      return 2;
    } else if (!strcmp(a, "--budget")) {
      const char* v = inl != NULL ? inl : argv[++i];
      budget = parse_bytes(v);
      if (budget <= 0) {
        fprintf(stderr, "dtensor-estimate: --budget %s: a size from 1 byte to 8 EiB, such as "
                "80GiB, 80GB or 85899345920\n", v);
        return 2;
      }
    } else if (!strcmp(a, "--top") || !strcmp(a, "--jobs")) {
      const int most = !strcmp(a, "--top") ? 10000 : 1024;
      char* end;
      long v = strtol(inl != NULL ? inl : argv[++i], &end, 10);
      if (*end || v < 1 || v > most) {
        fprintf(stderr, "dtensor-estimate: %s needs a count in [1, %d]\n", a, most);
        return 2;
      }
      *(!strcmp(a, "--top") ? &top : &jobs) = (int)v;
      plan_only = !strcmp(a, "--top") ? "--top" : "--jobs"; /* (a may be the loop's buffer) */
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
                  "--help)\n", argv[i]);
          return 2;
        }
        if (inl != NULL) { /* the trainer reads it as it stands; the config was read above */
          if (strcmp(key, "config") && !train_opts_set(&o, key, inl, err, sizeof err)) {
            fprintf(stderr, "dtensor-estimate: %s: %s\n", argv[i], err);
            return 2;
          }
          continue;
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
  if (plan_only != NULL && !plan) {
    fprintf(stderr, "dtensor-estimate: %s goes with --plan (one layout has no table and runs "
            "its ranks one after the other)\n", plan_only);
    return 2;
  }
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
  if (estimate_all(base, nbase, lay, nl, np, res, jobs) != 0) return 1;
  for (int i = 0; i < nl; i++) {
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
