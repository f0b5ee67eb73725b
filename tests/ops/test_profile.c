/* test_profile.c - the op profile (dt_profile_*, dtensor/ops.h), np 1 and 2.
 *
 * $DTENSOR_PROFILE=1 (set by the test before dt_init) turns it on at dt_init. Counts: k matrix
 * products record k "mm" calls; a recorded graph's backward pass records one "<op>.backward" per
 * node and the ops its rules run; a blocking redistribution records "redistribute" (and at np 2
 * an op whose inputs move records it nested: the op's self time excludes it); a composite
 * (cross_entropy) has a total above its self time, its pieces' time; local copies and fills
 * record "copy_local" and "fill_local". Every entry has self <=
 * total and the self times add up to no more than the wall time. Off: nothing is recorded; reset
 * empties; the report prints a line per entry. Bad arguments are refused with a message. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_test.h"
#include "dtensor/autograd.h"

#define CAP 256
static dt_profile_entry_t g_e[CAP];

/* The entry of name and kind (NULL: none). */
static const dt_profile_entry_t* find(int n, const char* name, dt_profile_kind_t kind) {
  for (int i = 0; i < n; i++)
    if (strcmp(g_e[i].name, name) == 0 && g_e[i].kind == kind) return &g_e[i];
  return NULL;
}

static int entries(void) {
  int n = -1;
  DT_ASSERT_OK(dt_profile_entries(g_e, CAP, &n));
  DT_ASSERT_TRUE(n >= 0 && n <= CAP, "%d entries", n);
  return n;
}

int main(int argc, char** argv) {
  setenv("DTENSOR_PROFILE", "1", 1);
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_TRUE(dt_profile_enabled(), "DTENSOR_PROFILE=1 did not turn the profile on");
  int world;
  DT_ASSERT_OK(dt_world_size(&world));
  dt_mesh_t mesh;
  DT_ASSERT_OK(dt_mesh_create(1, &world, NULL, NULL, &mesh));
  dt_placement_t r = dt_replicate(), s0 = dt_shard(0), s1 = dt_shard(1);
  const int64_t sa[2] = {8 * (int64_t)world, 16}, sb[2] = {16, 12};
  dt_tensor_t a, b, c;
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, 2, sa, &s0, 1, &a));
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, 2, sb, &r, 2, &b));
  DT_ASSERT_OK(dt_profile_reset());

  /* k products: k "mm" calls, nothing moved (Shard(0) x Replicate) */
  const int k = 5;
  for (int i = 0; i < k; i++) {
    DT_ASSERT_OK(dt_mm(a, b, &c));
    DT_ASSERT_OK(dt_tensor_destroy(c));
  }
  int n = entries();
  const dt_profile_entry_t* e = find(n, "mm", DT_PROFILE_OP);
  DT_ASSERT_TRUE(e != NULL && e->calls == k, "mm: %lld calls, want %d",
                 e ? (long long)e->calls : -1LL, k);
  DT_ASSERT_TRUE(e->total_s > 0.0 && e->self_s > 0.0 && e->self_s <= e->total_s,
                 "mm: self %g total %g", e->self_s, e->total_s);

  /* a redistribution the program asks for, and one an op runs for its input (at np 2 a
   * Shard(1) x Replicate product moves its first input: nested in "mm") */
  DT_ASSERT_OK(dt_profile_reset());
  DT_ASSERT_TRUE(entries() == 0, "reset left %d entries", entries());
  dt_tensor_t a1;
  DT_ASSERT_OK(dt_tensor_redistribute(a, &s1, &a1));
  DT_ASSERT_OK(dt_mm(a1, b, &c));
  DT_ASSERT_OK(dt_tensor_destroy(c));
  n = entries();
  e = find(n, "redistribute", DT_PROFILE_COMM);
  DT_ASSERT_TRUE(e != NULL && e->calls >= (world > 1 ? 2 : 1), "redistribute: %lld calls",
                 e ? (long long)e->calls : -1LL);
  e = find(n, "mm", DT_PROFILE_OP);
  DT_ASSERT_TRUE(e != NULL && e->calls == 1, "mm after the reset: %lld calls",
                 e ? (long long)e->calls : -1LL);
  if (world > 1)
    DT_ASSERT_TRUE(e->self_s < e->total_s, "mm moved its input, yet its self time %g equals its "
                   "total %g", e->self_s, e->total_s);

  /* a recorded graph: backward rules, the ops they run, a composite */
  DT_ASSERT_OK(dt_profile_reset());
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_tensor_t av, bv, tg;
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, 2, sa, &s0, 3, &av));
  DT_ASSERT_OK(dt_tensor_randn(mesh, DT_F32, 2, sb, &r, 4, &bv));
  const int64_t nt = sa[0];
  int64_t tgt[64];
  for (int64_t i = 0; i < nt; i++) tgt[i] = (i * 5) % 12;
  DT_ASSERT_OK(dt_tensor_from_full(mesh, DT_I64, 1, &nt, &s0, tgt, &tg));
  dt_var_t x, w, t, h, loss;
  DT_ASSERT_OK(dt_var_leaf(av, 0, &x));
  DT_ASSERT_OK(dt_var_leaf(bv, 1, &w));
  DT_ASSERT_OK(dt_var_leaf(tg, 0, &t));
  DT_ASSERT_OK(dt_ag_op(tape, "mm", 2, (dt_var_t[]){x, w}, 0, NULL, 0, NULL, 1, &h));
  DT_ASSERT_OK(dt_ag_op(tape, "relu", 1, &h, 0, NULL, 0, NULL, 1, &h));
  DT_ASSERT_OK(dt_ag_op(tape, "cross_entropy", 2, (dt_var_t[]){h, t}, 0, NULL, 0, NULL, 1, &loss));
  DT_ASSERT_OK(dt_tape_backward(tape, loss));
  n = entries();
  const char* nodes[3] = {"mm", "relu", "cross_entropy"};
  for (int i = 0; i < 3; i++) {
    e = find(n, nodes[i], DT_PROFILE_BACKWARD);
    DT_ASSERT_TRUE(e != NULL && e->calls == 1, "%s.backward: %lld calls", nodes[i],
                   e ? (long long)e->calls : -1LL);
  }
  e = find(n, "cross_entropy", DT_PROFILE_OP);
  DT_ASSERT_TRUE(e != NULL && e->calls == 1 && e->self_s < e->total_s,
                 "cross_entropy: a composite's total (%g) must exceed its self time (%g)",
                 e ? e->total_s : -1.0, e ? e->self_s : -1.0);
  DT_ASSERT_TRUE(find(n, "amax", DT_PROFILE_OP) != NULL && find(n, "exp", DT_PROFILE_OP) != NULL,
                 "cross_entropy's pieces were not recorded");
  e = find(n, "mm", DT_PROFILE_OP); /* the forward product (and any the backward rule runs) */
  DT_ASSERT_TRUE(e != NULL && e->calls >= 1, "mm: %lld calls", e ? (long long)e->calls : -1LL);
  DT_ASSERT_TRUE(find(n, "mm.backward", DT_PROFILE_BACKWARD) == NULL, "a name with the suffix");
  double self = 0.0;
  for (int i = 0; i < n; i++) {
    DT_ASSERT_TRUE(g_e[i].calls > 0 && g_e[i].self_s >= 0.0 && g_e[i].self_s <= g_e[i].total_s,
                   "%s: %lld calls, self %g, total %g", g_e[i].name, (long long)g_e[i].calls,
                   g_e[i].self_s, g_e[i].total_s);
    if (i > 0)
      DT_ASSERT_TRUE(g_e[i].self_s <= g_e[i - 1].self_s, "entries not sorted by self time");
    self += g_e[i].self_s;
  }
  /* the report: one line per entry (top 0: all), the header naming the library's time */
  FILE* f = tmpfile();
  DT_ASSERT_TRUE(f != NULL, "tmpfile");
  DT_ASSERT_OK(dt_profile_report(f, 0));
  rewind(f);
  char line[512];
  int lines = 0, has_bw = 0;
  while (fgets(line, sizeof line, f)) {
    lines++;
    has_bw |= strstr(line, "cross_entropy.backward") != NULL;
  }
  fclose(f);
  DT_ASSERT_TRUE(lines == n + 2 && has_bw, "report: %d lines for %d entries (backward line %d)",
                 lines, n, has_bw);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));
  DT_ASSERT_OK(dt_var_destroy(w));
  DT_ASSERT_OK(dt_var_destroy(t));

  /* a local transfer (FSDP's packing uses them) */
  DT_ASSERT_OK(dt_profile_reset());
  {
    const int64_t zero = 0, cnt = 8;
    DT_ASSERT_OK(dt_tensor_copy_local(b, b, 1, &cnt, &zero, &cnt));
    DT_ASSERT_OK(dt_tensor_fill_local(b, 1, &zero, &cnt, 0.5));
    n = entries();
    e = find(n, "copy_local", DT_PROFILE_LOCAL);
    DT_ASSERT_TRUE(e != NULL && e->calls == 1, "copy_local: %lld calls",
                   e ? (long long)e->calls : -1LL);
    e = find(n, "fill_local", DT_PROFILE_LOCAL);
    DT_ASSERT_TRUE(e != NULL && e->calls == 1, "fill_local: %lld calls",
                   e ? (long long)e->calls : -1LL);
  }

  /* off: nothing more recorded, what was there kept */
  DT_ASSERT_OK(dt_profile_set(0));
  DT_ASSERT_TRUE(!dt_profile_enabled(), "still on");
  const int before = entries();
  DT_ASSERT_OK(dt_mm(a, b, &c));
  DT_ASSERT_OK(dt_tensor_destroy(c));
  DT_ASSERT_TRUE(entries() == before && find(before, "mm", DT_PROFILE_OP) == NULL,
                 "recorded while off");
  DT_ASSERT_OK(dt_profile_set(1)); /* on again: cleared */
  DT_ASSERT_TRUE(entries() == 0, "turned on again with %d old entries", entries());

  /* bad arguments */
  DT_ASSERT_STATUS(dt_profile_entries(NULL, 1, &n), DT_ERR_INVALID_ARG);
  DT_ASSERT_TRUE(strstr(dt_last_error(), "dt_profile_entries") != NULL, "message '%s'",
                 dt_last_error());
  DT_ASSERT_STATUS(dt_profile_entries(g_e, -1, &n), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_profile_entries(g_e, 1, NULL), DT_ERR_INVALID_ARG);
  DT_ASSERT_STATUS(dt_profile_report(NULL, 10), DT_ERR_INVALID_ARG);
  DT_ASSERT_OK(dt_profile_entries(NULL, 0, &n)); /* the count alone */

  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(a1));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  DT_ASSERT_OK(dt_mesh_destroy(mesh));
  const int rank0 = dt_test_rank() == 0;
  DT_ASSERT_OK(dt_finalize());
  if (rank0) printf("test_profile np=%d: ok (self times %.3f ms)\n", world, 1e3 * self);
  return 0;
}
