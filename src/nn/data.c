/* data.c - training corpora: a synthetic order-k Markov chain with an exactly computed entropy
 * floor, and a byte-level loader for any file; deterministic batches of windows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dtensor/dtensor.h"
#include "dtensor/nn.h"
#include "dtensor/check.h"
#include "dtensor/handle.h"

struct dt_corpus {
  int vocab;
  int64_t length;
  uint8_t* tok;
  double floor;
};

static uint64_t dt__mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static double dt__unif(uint64_t* s) {
  *s = dt__mix(*s);
  return (double)(*s >> 11) * 0x1.0p-53;
}

static const dt_handle_kind_t dt__corpus_kind = {"corpus"};

static dt_status_t dt__corpus_check(dt_corpus_t c) {
  return dt_handle_check(c, &dt__corpus_kind, "corpus");
}

/* Registers c as the caller's handle (frees it and its tokens on failure). */
static dt_status_t dt__corpus_give(dt_corpus_t c, dt_corpus_t* out) {
  dt_status_t st = dt_handle_register(c, &dt__corpus_kind);
  if (st != DT_SUCCESS) {
    free(c->tok);
    free(c);
    return st;
  }
  *out = c;
  return DT_SUCCESS;
}

static dt_status_t dt__corpus_markov(int vocab, int order, int64_t length, uint64_t seed,
                                     dt_corpus_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  if (vocab < 2 || vocab > 256 || order < 1 || order > 4 || length < order + 2)
    return DT_FAIL(DT_ERR_INVALID_ARG, "vocab=%d, order=%d, length=%lld (valid: vocab 2 to 256, "
                   "order 1 to 4, length %d or more)", vocab, order, (long long)length,
                   order + 2);
  int64_t nctx = 1;
  for (int k = 0; k < order; k++) nctx *= vocab;
  if (nctx > (1 << 20))
    return DT_FAIL(DT_ERR_INVALID_ARG, "vocab=%d, order=%d: vocab^order = %lld contexts (valid: at "
                   "most %d)", vocab, order, (long long)nctx, 1 << 20);
  double* P = malloc(sizeof(double) * (size_t)(nctx * vocab));
  double* pi = malloc(sizeof(double) * (size_t)nctx);
  double* nx = malloc(sizeof(double) * (size_t)nctx);
  dt_corpus_t c = calloc(1, sizeof *c);
  uint8_t* tok = malloc((size_t)length);
  if (!P || !pi || !nx || !c || !tok) {
    free(P), free(pi), free(nx), free(c), free(tok);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "markov corpus");
  }
  /* Each context: three favoured successors with random weights, a small floor elsewhere. */
  uint64_t s = seed ^ 0x5eedull;
  for (int64_t x = 0; x < nctx; x++) {
    double* row = P + x * vocab, sum = 0.0;
    for (int v = 0; v < vocab; v++) row[v] = 0.02 * dt__unif(&s);
    for (int j = 0; j < 3; j++) row[(int)(dt__unif(&s) * vocab) % vocab] += 0.2 + dt__unif(&s);
    for (int v = 0; v < vocab; v++) sum += row[v];
    for (int v = 0; v < vocab; v++) row[v] /= sum;
  }
  /* stationary distribution of the context chain (context x -> (x * vocab + v) mod nctx) */
  for (int64_t x = 0; x < nctx; x++) pi[x] = 1.0 / (double)nctx;
  for (int it = 0; it < 2000; it++) {
    memset(nx, 0, sizeof(double) * (size_t)nctx);
    for (int64_t x = 0; x < nctx; x++)
      for (int v = 0; v < vocab; v++) nx[(x * vocab + v) % nctx] += pi[x] * P[x * vocab + v];
    double diff = 0.0;
    for (int64_t x = 0; x < nctx; x++) diff += fabs(nx[x] - pi[x]);
    memcpy(pi, nx, sizeof(double) * (size_t)nctx);
    if (diff < 1e-13) break;
  }
  double H = 0.0;
  for (int64_t x = 0; x < nctx; x++)
    for (int v = 0; v < vocab; v++) {
      double p = P[x * vocab + v];
      if (p > 0) H -= pi[x] * p * log(p);
    }
  /* sample */
  int64_t ctx = 0;
  for (int k = 0; k < order; k++) {
    tok[k] = (uint8_t)((int)(dt__unif(&s) * vocab) % vocab);
    ctx = ctx * vocab + tok[k];
  }
  for (int64_t i = order; i < length; i++) {
    double u = dt__unif(&s), acc = 0.0;
    const double* row = P + ctx * vocab;
    int v = vocab - 1;
    for (int j = 0; j < vocab; j++) {
      acc += row[j];
      if (u < acc) {
        v = j;
        break;
      }
    }
    tok[i] = (uint8_t)v;
    ctx = (ctx * vocab + v) % nctx;
  }
  free(P);
  free(pi);
  free(nx);
  c->vocab = vocab;
  c->length = length;
  c->tok = tok;
  c->floor = H;
  return dt__corpus_give(c, out);
}

dt_status_t dt_corpus_markov(int vocab, int order, int64_t length, uint64_t seed,
                             dt_corpus_t* out) {
  DT_ENTRY_RETURN(dt__corpus_markov(vocab, order, length, seed, out));
}

static dt_status_t dt__corpus_file(const char* path, dt_corpus_t* out) {
  DT_ARG_NOT_NULL(out);
  *out = NULL;
  DT_ARG_NOT_NULL(path);
  struct stat sb; /* a directory has no length to read, a FIFO would block the open */
  if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s is not a regular file", path);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return DT_FAIL(DT_ERR_IO, "cannot open %s", path);
  long len = -1;
  if (fseek(f, 0, SEEK_END) == 0) len = ftell(f);
  if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
    fclose(f);
    return DT_FAIL(DT_ERR_IO, "cannot read %s", path);
  }
  if (len < 2) {
    fclose(f);
    return DT_FAIL(DT_ERR_INVALID_ARG, "%s holds %ld bytes: too short to train on", path, len);
  }
  dt_corpus_t c = calloc(1, sizeof *c);
  uint8_t* tok = malloc((size_t)len);
  if (!c || !tok) {
    fclose(f);
    free(c);
    free(tok);
    return DT_FAIL(DT_ERR_OUT_OF_MEMORY, "reading %s", path);
  }
  size_t got = fread(tok, 1, (size_t)len, f);
  fclose(f);
  if ((long)got != len) {
    free(c);
    free(tok);
    return DT_FAIL(DT_ERR_IO, "short read from %s", path);
  }
  c->vocab = 256;
  c->length = len;
  c->tok = tok;
  c->floor = NAN;
  return dt__corpus_give(c, out);
}

dt_status_t dt_corpus_file(const char* path, dt_corpus_t* out) {
  DT_ENTRY_RETURN(dt__corpus_file(path, out));
}

double dt_corpus_entropy_floor(dt_corpus_t c) {
  return dt__corpus_check(c) == DT_SUCCESS ? c->floor : NAN;
}
int dt_corpus_vocab(dt_corpus_t c) { return dt__corpus_check(c) == DT_SUCCESS ? c->vocab : 0; }

static dt_status_t dt__corpus_batch(dt_corpus_t c, uint64_t seed, int64_t step, int B, int S,
                                    int64_t* tokens, int64_t* targets) {
  DT_CHECK(dt__corpus_check(c));
  DT_ARG_NOT_NULL(tokens);
  DT_ARG_NOT_NULL(targets);
  if (B < 1 || S < 1 || (int64_t)S + 1 > c->length)
    return DT_FAIL(DT_ERR_INVALID_ARG, "B=%d, S=%d: a batch does not fit a corpus of %lld tokens "
                   "(valid: B >= 1, 1 <= S <= %lld)", B, S, (long long)c->length,
                   (long long)c->length - 1);
  for (int b = 0; b < B; b++) {
    uint64_t h = dt__mix(seed ^ dt__mix((uint64_t)step * 1315423911u + (uint64_t)b));
    int64_t start = (int64_t)(h % (uint64_t)(c->length - S));
    for (int s = 0; s < S; s++) {
      tokens[(int64_t)b * S + s] = c->tok[start + s];
      targets[(int64_t)b * S + s] = c->tok[start + s + 1];
    }
  }
  return DT_SUCCESS;
}

dt_status_t dt_corpus_batch(dt_corpus_t c, uint64_t seed, int64_t step, int B, int S,
                            int64_t* tokens, int64_t* targets) {
  DT_ENTRY_RETURN(dt__corpus_batch(c, seed, step, B, S, tokens, targets));
}

static dt_status_t dt__corpus_destroy(dt_corpus_t c) {
  if (c == NULL) return DT_SUCCESS;
  DT_CHECK(dt_handle_unregister(c, &dt__corpus_kind, "corpus"));
  free(c->tok);
  dt_handle_free(c);
  return DT_SUCCESS;
}

dt_status_t dt_corpus_destroy(dt_corpus_t c) { DT_ENTRY_RETURN(dt__corpus_destroy(c)); }
