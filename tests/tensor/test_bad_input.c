/* test_bad_input.c - every invalid argument of the public mesh, tensor and redistribute API
 * (np 2 and 4).
 *
 * Each bad call must return the documented status (DT_ERR_INVALID_ARG, DT_ERR_INVALID_USAGE,
 * DT_ERR_UNSUPPORTED, DT_ERR_NOT_INITIALIZED, DT_ERR_IO), leave a message in dt_last_error() that
 * names the problem, clear its out-pointers, and leave the library usable: at the end, real
 * redistributions on the same meshes must still give the right full tensors. Collective calls get
 * the same bad argument on every rank, so every rank must fail the same way (no hang).
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "dt_test.h"

static int g_rank, g_world, g_checks;

/* Zero-filled and 0xA5-filled memory cast to handles: garbage that is safe to read. */
static _Alignas(64) unsigned char g_zero_blob[1 << 16];
static _Alignas(64) unsigned char g_junk_blob[1 << 16];

/* Case-insensitive search for any of the '|'-separated alternatives in `needles`. */
static int mentions(const char* text, const char* needles) {
  char alt[128];
  const char* p = needles;
  while (*p) {
    size_t n = strcspn(p, "|");
    if (n >= sizeof alt) n = sizeof alt - 1;
    memcpy(alt, p, n);
    alt[n] = '\0';
    for (const char* t = text; *t; t++) {
      size_t k = 0;
      while (k < n && t[k] && tolower((unsigned char)t[k]) == tolower((unsigned char)alt[k])) k++;
      if (k == n) return 1;
    }
    p += n;
    if (*p == '|') p++;
  }
  return 0;
}

static void check_err(dt_status_t got, dt_status_t want, const char* needles, const char* expr,
                      int line) {
  g_checks++;
  if (got != want) {
    fprintf(stderr, "[rank %d] line %d: %s returned %s, expected %s (%s)\n", g_rank, line, expr,
            dt_status_name(got), dt_status_name(want), dt_last_error());
    dt_test_die();
  }
  if (want == DT_SUCCESS) return;
  const char* e = dt_last_error();
  if (e == NULL || e[0] == '\0') {
    fprintf(stderr, "[rank %d] line %d: %s failed with no message\n", g_rank, line, expr);
    dt_test_die();
  }
  if (needles != NULL && !mentions(e, needles)) {
    fprintf(stderr, "[rank %d] line %d: %s: message '%s' does not mention '%s'\n", g_rank, line,
            expr, e, needles);
    dt_test_die();
  }
}

/* EXPECT(call, status, "word|other word"): the call fails with status and a message naming it. */
#define EXPECT(call, want, needles)                          \
  do {                                                       \
    dt_clear_error();                                        \
    dt_status_t ex_st_ = (call);                             \
    check_err(ex_st_, (want), (needles), #call, __LINE__);   \
  } while (0)

#define BAD_PTR ((void*)(uintptr_t)0x10)

static dt_mesh_t garbage_mesh(int zero) {
  return (dt_mesh_t)(void*)(zero ? g_zero_blob : g_junk_blob);
}
static dt_tensor_t garbage_tensor(int zero) {
  return (dt_tensor_t)(void*)(zero ? g_zero_blob : g_junk_blob);
}
static dt_plan_t garbage_plan(void) { return (dt_plan_t)(void*)g_zero_blob; }

/* full tensor of t as floats; checks it equals want[0..n) exactly */
static void expect_full_f32(dt_tensor_t t, const float* want, int64_t n, int line) {
  float* got = malloc(sizeof(float) * (size_t)(n + 1));
  DT_ASSERT_OK(dt_tensor_gather_full(t, got, sizeof(float) * (size_t)n));
  for (int64_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "[rank %d] line %d: full[%lld] = %g, expected %g\n", g_rank, line,
              (long long)i, got[i], want[i]);
      dt_test_die();
    }
  free(got);
  g_checks++;
}

/* ---------------------------------------------------------------------------------------------
 * before dt_init */

static void test_before_init(void) {
  int v = 12345;
  EXPECT(dt_world_rank(&v), DT_ERR_NOT_INITIALIZED, "dt_init");
  DT_ASSERT_TRUE(v == -1 || v == 0, "dt_world_rank left %d", v);
  v = 12345;
  EXPECT(dt_world_size(&v), DT_ERR_NOT_INITIALIZED, "dt_init");
  DT_ASSERT_EQ(v, 0);
  int shape[1] = {1};
  dt_mesh_t m = BAD_PTR;
  EXPECT(dt_mesh_create(1, shape, NULL, NULL, &m), DT_ERR_NOT_INITIALIZED, "dt_init");
  DT_ASSERT_TRUE(m == NULL, "mesh not cleared");
  /* argc and argv must both be set or both be NULL */
  int argc = 0;
  char** argv = NULL;
  EXPECT(dt_init(&argc, NULL), DT_ERR_INVALID_ARG, "argc|argv");
  EXPECT(dt_init(NULL, &argv), DT_ERR_INVALID_ARG, "argc|argv");
  /* Abstract meshes, plans and the cost model need no dt_init; tensors need a real mesh. */
  int ashape[2] = {2, 2};
  dt_mesh_t am = NULL;
  DT_ASSERT_OK(dt_mesh_create_abstract(2, ashape, NULL, &am));
  int64_t tshape[2] = {4, 4};
  dt_placement_t pl[2] = {dt_shard(0), dt_replicate()}, pr[2] = {dt_replicate(), dt_replicate()};
  dt_tensor_t t = BAD_PTR;
  EXPECT(dt_tensor_zeros(am, DT_F32, 2, tshape, pl, &t), DT_ERR_INVALID_USAGE, "abstract");
  DT_ASSERT_TRUE(t == NULL, "tensor not cleared");
  dt_plan_t p = NULL;
  DT_ASSERT_OK(dt_plan_create(am, DT_F32, 2, tshape, pl, pr, &p));
  int n = 0;
  DT_ASSERT_OK(dt_plan_num_steps(p, &n));
  DT_ASSERT_TRUE(n >= 1, "S(0)R -> RR needs a step");
  DT_ASSERT_OK(dt_plan_destroy(p));
  DT_ASSERT_OK(dt_mesh_destroy(am));
  /* finalize before init is a no-op */
  DT_ASSERT_OK(dt_finalize());
}

/* ---------------------------------------------------------------------------------------------
 * mesh creation */

static void test_mesh_create(void) {
  int W = g_world;
  int shape1[1] = {W}, shape2[2] = {2, W / 2};
  dt_mesh_t m;
#define EXPECT_MESH_FAIL(call, want, needles)                      \
  do {                                                             \
    m = BAD_PTR;                                                   \
    EXPECT(call, want, needles);                                   \
    DT_ASSERT_TRUE(m == NULL, "out mesh not NULL after failure");  \
  } while (0)
  EXPECT(dt_mesh_create(1, shape1, NULL, NULL, NULL), DT_ERR_INVALID_ARG, "out|NULL");
  EXPECT_MESH_FAIL(dt_mesh_create(0, shape1, NULL, NULL, &m), DT_ERR_INVALID_ARG, "ndim");
  EXPECT_MESH_FAIL(dt_mesh_create(-1, shape1, NULL, NULL, &m), DT_ERR_INVALID_ARG, "ndim");
  int shape5[5] = {W, 1, 1, 1, 1};
  EXPECT_MESH_FAIL(dt_mesh_create(5, shape5, NULL, NULL, &m), DT_ERR_INVALID_ARG, "ndim");
  EXPECT_MESH_FAIL(dt_mesh_create(1, NULL, NULL, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  int zero1[1] = {0}, neg1[1] = {-1}, zero2[2] = {W, 0}, neg2[2] = {-2, -W / 2};
  EXPECT_MESH_FAIL(dt_mesh_create(1, zero1, NULL, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  EXPECT_MESH_FAIL(dt_mesh_create(1, neg1, NULL, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  EXPECT_MESH_FAIL(dt_mesh_create(2, zero2, NULL, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  EXPECT_MESH_FAIL(dt_mesh_create(2, neg2, NULL, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  /* mesh size != world size without explicit ranks */
  int big[1] = {W + 1}, dbl[2] = {2, W}, half[1] = {W / 2};
  EXPECT_MESH_FAIL(dt_mesh_create(1, big, NULL, NULL, &m), DT_ERR_INVALID_ARG, "world|rank");
  EXPECT_MESH_FAIL(dt_mesh_create(2, dbl, NULL, NULL, &m), DT_ERR_INVALID_ARG, "world|rank");
  EXPECT_MESH_FAIL(dt_mesh_create(1, half, NULL, NULL, &m), DT_ERR_INVALID_ARG, "world|rank");
  /* explicit ranks: duplicates and out of range */
  int two[1] = {2}, dup[2] = {0, 0}, dup1[2] = {1, 1}, oor[2] = {0, W}, negr[2] = {-1, 0};
  EXPECT_MESH_FAIL(dt_mesh_create(1, two, NULL, dup, &m), DT_ERR_INVALID_ARG, "twice|duplicate");
  EXPECT_MESH_FAIL(dt_mesh_create(1, two, NULL, dup1, &m), DT_ERR_INVALID_ARG, "twice|duplicate");
  EXPECT_MESH_FAIL(dt_mesh_create(1, two, NULL, oor, &m), DT_ERR_INVALID_ARG, "range|rank");
  EXPECT_MESH_FAIL(dt_mesh_create(1, two, NULL, negr, &m), DT_ERR_INVALID_ARG, "range|rank");
  int* many = malloc(sizeof(int) * (size_t)(W + 1));
  for (int i = 0; i < W; i++) many[i] = i;
  many[W] = W - 1; /* more positions than world ranks: one repeats */
  EXPECT_MESH_FAIL(dt_mesh_create(1, big, NULL, many, &m), DT_ERR_INVALID_ARG, "twice|duplicate");
  free(many);
  /* names */
  const char* dupn[2] = {"alpha", "alpha"};
  EXPECT_MESH_FAIL(dt_mesh_create(2, shape2, dupn, NULL, &m), DT_ERR_INVALID_ARG, "alpha");
  const char* longn[1] = {"a_dimension_name_of_32_chars_xyz"}; /* 32 > 31 */
  DT_ASSERT_EQ(strlen(longn[0]), 32);
  EXPECT_MESH_FAIL(dt_mesh_create(1, shape1, longn, NULL, &m), DT_ERR_INVALID_ARG,
                   "long|characters|31");
  const char* emptyn[1] = {""};
  EXPECT_MESH_FAIL(dt_mesh_create(1, shape1, emptyn, NULL, &m), DT_ERR_INVALID_ARG, "name");
  const char* nulln[2] = {"dp", NULL};
  EXPECT_MESH_FAIL(dt_mesh_create(2, shape2, nulln, NULL, &m), DT_ERR_INVALID_ARG, "name");
  /* a 31-character name is allowed */
  const char* okn[1] = {"a_dimension_name_of_31_chars_xy"};
  DT_ASSERT_EQ(strlen(okn[0]), 31);
  DT_ASSERT_OK(dt_mesh_create(1, shape1, okn, NULL, &m));
  const char* got = NULL;
  DT_ASSERT_OK(dt_mesh_dim_name(m, 0, &got));
  DT_ASSERT_TRUE(strcmp(got, okn[0]) == 0, "name %s", got);
  DT_ASSERT_OK(dt_mesh_destroy(m));

  /* abstract meshes: same shape/name rules, any size */
  EXPECT(dt_mesh_create_abstract(1, shape1, NULL, NULL), DT_ERR_INVALID_ARG, "out|NULL");
  EXPECT_MESH_FAIL(dt_mesh_create_abstract(0, shape1, NULL, &m), DT_ERR_INVALID_ARG, "ndim");
  EXPECT_MESH_FAIL(dt_mesh_create_abstract(5, shape5, NULL, &m), DT_ERR_INVALID_ARG, "ndim");
  EXPECT_MESH_FAIL(dt_mesh_create_abstract(1, NULL, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  EXPECT_MESH_FAIL(dt_mesh_create_abstract(1, zero1, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  EXPECT_MESH_FAIL(dt_mesh_create_abstract(2, neg2, NULL, &m), DT_ERR_INVALID_ARG, "shape");
  EXPECT_MESH_FAIL(dt_mesh_create_abstract(2, shape2, dupn, &m), DT_ERR_INVALID_ARG, "alpha");
  EXPECT_MESH_FAIL(dt_mesh_create_abstract(1, shape1, longn, &m), DT_ERR_INVALID_ARG,
                   "long|characters|31");
  int odd[2] = {3, 5};
  DT_ASSERT_OK(dt_mesh_create_abstract(2, odd, NULL, &m));
  DT_ASSERT_OK(dt_mesh_destroy(m));
#undef EXPECT_MESH_FAIL
}

/* ---------------------------------------------------------------------------------------------
 * mesh accessors, slice, flatten */

static void test_mesh_accessors(dt_mesh_t m2, dt_mesh_t am) {
  int W = g_world;
  int v;
  const char* name;
  int buf[4];
  for (int z = 0; z < 3; z++) {
    dt_mesh_t bad = z == 0 ? NULL : garbage_mesh(z == 1);
    v = 777;
    EXPECT(dt_mesh_ndim(bad, &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_EQ(v, 0);
    v = 777;
    EXPECT(dt_mesh_size(bad, 0, &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_EQ(v, 0);
    EXPECT(dt_mesh_shape(bad, buf), DT_ERR_INVALID_ARG, "mesh");
    v = 777;
    EXPECT(dt_mesh_numel(bad, &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_EQ(v, 0);
    EXPECT(dt_mesh_coordinate(bad, buf), DT_ERR_INVALID_ARG, "mesh");
    v = 777;
    EXPECT(dt_mesh_local_rank(bad, 0, &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_TRUE(v == -1 || v == 0, "local rank left %d", v);
    v = 777;
    EXPECT(dt_mesh_is_member(bad, &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_EQ(v, 0);
    v = 777;
    EXPECT(dt_mesh_is_abstract(bad, &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_EQ(v, 0);
    name = BAD_PTR;
    EXPECT(dt_mesh_dim_name(bad, 0, &name), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_TRUE(name == NULL, "name not cleared");
    v = 777;
    EXPECT(dt_mesh_dim_index(bad, "dp", &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_TRUE(v == -1 || v == 0, "dim index left %d", v);
    int c0[2] = {0, 0};
    v = 777;
    EXPECT(dt_mesh_rank_at(bad, c0, &v), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_TRUE(v == -1 || v == 0, "rank left %d", v);
    EXPECT(dt_mesh_destroy(z == 0 ? garbage_mesh(1) : bad), DT_ERR_INVALID_ARG, "mesh");
    const char* nm[1] = {"dp"};
    dt_mesh_t out = BAD_PTR;
    EXPECT(dt_mesh_slice(bad, 1, nm, &out), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_TRUE(out == NULL, "slice out not cleared");
    int dims[2] = {0, 1};
    out = BAD_PTR;
    EXPECT(dt_mesh_flatten(bad, 2, dims, NULL, &out), DT_ERR_INVALID_ARG, "mesh");
    DT_ASSERT_TRUE(out == NULL, "flatten out not cleared");
    dt_counters_t cnt;
    EXPECT(dt_counters_get(z == 0 ? garbage_mesh(0) : bad, &cnt), DT_ERR_INVALID_ARG, "mesh");
    EXPECT(dt_counters_reset(z == 0 ? garbage_mesh(1) : bad), DT_ERR_INVALID_ARG, "mesh");
  }
  DT_ASSERT_OK(dt_mesh_destroy(NULL));
  /* NULL out pointers on a valid mesh */
  EXPECT(dt_mesh_ndim(m2, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_size(m2, 0, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_shape(m2, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_numel(m2, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_coordinate(m2, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_local_rank(m2, 0, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_is_member(m2, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_is_abstract(m2, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_dim_name(m2, 0, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_dim_index(m2, "dp", NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_mesh_rank_at(m2, buf, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_counters_get(m2, NULL), DT_ERR_INVALID_ARG, "NULL");
  /* dims out of range (negative counts from the end: -1, -2 are valid on a 2-D mesh) */
  const int bad_dims[] = {2, 3, -3, 100, -100};
  for (size_t k = 0; k < sizeof bad_dims / sizeof bad_dims[0]; k++) {
    v = 777;
    EXPECT(dt_mesh_size(m2, bad_dims[k], &v), DT_ERR_INVALID_ARG, "dim|range");
    DT_ASSERT_EQ(v, 0);
    v = 777;
    EXPECT(dt_mesh_local_rank(m2, bad_dims[k], &v), DT_ERR_INVALID_ARG, "dim|range");
    DT_ASSERT_TRUE(v == -1 || v == 0, "local rank left %d", v);
    name = BAD_PTR;
    EXPECT(dt_mesh_dim_name(m2, bad_dims[k], &name), DT_ERR_INVALID_ARG, "dim|range");
    DT_ASSERT_TRUE(name == NULL, "name not cleared");
  }
  DT_ASSERT_OK(dt_mesh_size(m2, -1, &v));
  DT_ASSERT_EQ(v, W / 2);
  DT_ASSERT_OK(dt_mesh_size(m2, -2, &v));
  DT_ASSERT_EQ(v, 2);
  /* unknown dim names */
  v = 777;
  EXPECT(dt_mesh_dim_index(m2, "nosuchdim", &v), DT_ERR_INVALID_ARG, "nosuchdim");
  DT_ASSERT_TRUE(v == -1 || v == 0, "dim index left %d", v);
  EXPECT(dt_mesh_dim_index(m2, "", &v), DT_ERR_INVALID_ARG, NULL);
  EXPECT(dt_mesh_dim_index(m2, NULL, &v), DT_ERR_INVALID_ARG, "name|NULL");
  EXPECT(dt_mesh_dim_index(m2, "DP", &v), DT_ERR_INVALID_ARG, "DP"); /* names are exact */
  /* rank_at: coordinates out of range */
  int cbad[4][2] = {{2, 0}, {0, W / 2}, {-1, 0}, {0, -1}};
  for (int k = 0; k < 4; k++) {
    v = 777;
    EXPECT(dt_mesh_rank_at(m2, cbad[k], &v), DT_ERR_INVALID_ARG, "coord|range");
    DT_ASSERT_TRUE(v == -1 || v == 0, "rank left %d", v);
  }
  EXPECT(dt_mesh_rank_at(m2, NULL, &v), DT_ERR_INVALID_ARG, "coords|NULL");
  /* abstract mesh: no coordinates, no world ranks */
  EXPECT(dt_mesh_coordinate(am, buf), DT_ERR_INVALID_USAGE, "abstract");
  EXPECT(dt_mesh_local_rank(am, 0, &v), DT_ERR_INVALID_USAGE, "abstract");
  int c00[2] = {0, 0};
  EXPECT(dt_mesh_rank_at(am, c00, &v), DT_ERR_INVALID_USAGE, "abstract");
  DT_ASSERT_OK(dt_mesh_is_abstract(am, &v));
  DT_ASSERT_EQ(v, 1);
  DT_ASSERT_OK(dt_mesh_is_member(am, &v));
  DT_ASSERT_EQ(v, 0);
}

static void test_mesh_slice_flatten(dt_mesh_t m2, dt_mesh_t unnamed) {
  dt_mesh_t out;
#define EXPECT_OUT_NULL(call, want, needles)                  \
  do {                                                        \
    out = BAD_PTR;                                            \
    EXPECT(call, want, needles);                              \
    DT_ASSERT_TRUE(out == NULL, "out not NULL after failure"); \
  } while (0)
  const char* unknown[1] = {"nosuchdim"};
  const char* rev[2] = {"tp", "dp"};
  const char* rep[2] = {"dp", "dp"};
  const char* three[3] = {"dp", "tp", "dp"};
  const char* withnull[2] = {"dp", NULL};
  const char* one_null[1] = {NULL};
  const char* dp[1] = {"dp"};
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 1, unknown, &out), DT_ERR_INVALID_ARG, "nosuchdim");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 2, rev, &out), DT_ERR_INVALID_ARG, "order");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 2, rep, &out), DT_ERR_INVALID_ARG, "repeat|twice|order");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 3, three, &out), DT_ERR_INVALID_ARG, "nnames|range");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 0, dp, &out), DT_ERR_INVALID_ARG, "nnames|range");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, -1, dp, &out), DT_ERR_INVALID_ARG, "nnames|range");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 2, withnull, &out), DT_ERR_INVALID_ARG, "NULL");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 1, one_null, &out), DT_ERR_INVALID_ARG, "NULL");
  EXPECT_OUT_NULL(dt_mesh_slice(m2, 1, NULL, &out), DT_ERR_INVALID_ARG, "names|NULL");
  EXPECT(dt_mesh_slice(m2, 1, dp, NULL), DT_ERR_INVALID_ARG, "out|NULL");
  /* an unnamed mesh has no dim called "dp" (nor "") */
  EXPECT_OUT_NULL(dt_mesh_slice(unnamed, 1, dp, &out), DT_ERR_INVALID_ARG, "dp");
  const char* empty[1] = {""};
  EXPECT_OUT_NULL(dt_mesh_slice(unnamed, 1, empty, &out), DT_ERR_INVALID_ARG, NULL);

  int desc[2] = {1, 0}, same[2] = {0, 0}, oor[2] = {0, 2}, neg[1] = {-1}, ok[2] = {0, 1};
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 2, desc, "f", &out), DT_ERR_INVALID_ARG, "ascending");
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 2, same, "f", &out), DT_ERR_INVALID_ARG, "ascending");
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 2, oor, "f", &out), DT_ERR_INVALID_ARG, "range");
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 1, neg, "f", &out), DT_ERR_INVALID_ARG, "range");
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 0, ok, "f", &out), DT_ERR_INVALID_ARG, "ndims|range");
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 3, ok, "f", &out), DT_ERR_INVALID_ARG, "ndims|range");
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 2, NULL, "f", &out), DT_ERR_INVALID_ARG, "dims|NULL");
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 2, ok, "a_flattened_name_longer_than_31_chars", &out),
                  DT_ERR_INVALID_ARG, "long|characters|31");
  /* a new flattened dim may not take an existing dim name */
  EXPECT_OUT_NULL(dt_mesh_flatten(m2, 2, ok, "tp", &out), DT_ERR_INVALID_ARG, "tp");
#undef EXPECT_OUT_NULL
}

/* ---------------------------------------------------------------------------------------------
 * tensor construction */

enum { MK_EMPTY, MK_ZEROS, MK_ONES, MK_FULL, MK_ARANGE, MK_RAND, MK_RANDN, MK_FROM_FULL,
       MK_DISTRIBUTE, MK_FROM_LOCAL, MK_COUNT };
static const char* const mk_names[MK_COUNT] = {"empty", "zeros", "ones", "full_value", "arange",
                                               "rand", "randn", "from_full", "distribute",
                                               "from_local"};
static float g_big_buf[4096];

static dt_status_t make(int kind, dt_mesh_t mesh, dt_dtype_t dt, int nd, const int64_t* shape,
                        const dt_placement_t* pl, dt_tensor_t* out) {
  switch (kind) {
    case MK_EMPTY: return dt_tensor_empty(mesh, dt, nd, shape, pl, out);
    case MK_ZEROS: return dt_tensor_zeros(mesh, dt, nd, shape, pl, out);
    case MK_ONES: return dt_tensor_ones(mesh, dt, nd, shape, pl, out);
    case MK_FULL: return dt_tensor_full_value(mesh, dt, nd, shape, pl, 2.5, out);
    case MK_ARANGE: return dt_tensor_arange(mesh, dt, nd, shape, pl, 1.0, 0.5, out);
    case MK_RAND: return dt_tensor_rand(mesh, dt, nd, shape, pl, 7, out);
    case MK_RANDN: return dt_tensor_randn(mesh, dt, nd, shape, pl, 7, out);
    case MK_FROM_FULL: return dt_tensor_from_full(mesh, dt, nd, shape, pl, g_big_buf, out);
    case MK_DISTRIBUTE: return dt_tensor_distribute(mesh, dt, nd, shape, pl, g_big_buf, 0, out);
    default: { /* from_local with the global shape given and a plausible local shape */
      int64_t lshape[DT_MAX_DIMS + 1] = {0};
      int n = nd < 0 ? 0 : nd > DT_MAX_DIMS + 1 ? DT_MAX_DIMS + 1 : nd;
      for (int d = 0; d < n && shape; d++) lshape[d] = shape[d] > 0 ? 1 : 0;
      return dt_tensor_from_local(mesh, dt, nd, shape, pl, g_big_buf, lshape, out);
    }
  }
}

static void test_construct_bad(dt_mesh_t m1, dt_mesh_t am) {
  int64_t shape[2] = {7, 3};
  dt_placement_t s0[1] = {dt_shard(0)};
  dt_tensor_t t;
#define EXPECT_T_NULL(call, want, needles)                                     \
  do {                                                                         \
    t = BAD_PTR;                                                               \
    EXPECT(call, want, needles);                                               \
    DT_ASSERT_TRUE(t == NULL, "%s: out tensor not NULL after failure", mk_names[k]); \
  } while (0)
  for (int k = 0; k < MK_COUNT; k++) {
    EXPECT(make(k, m1, DT_F32, 2, shape, s0, NULL), DT_ERR_INVALID_ARG, "out|NULL");
    EXPECT_T_NULL(make(k, NULL, DT_F32, 2, shape, s0, &t), DT_ERR_INVALID_ARG, "mesh");
    EXPECT_T_NULL(make(k, garbage_mesh(1), DT_F32, 2, shape, s0, &t), DT_ERR_INVALID_ARG, "mesh");
    EXPECT_T_NULL(make(k, garbage_mesh(0), DT_F32, 2, shape, s0, &t), DT_ERR_INVALID_ARG, "mesh");
    EXPECT_T_NULL(make(k, am, DT_F32, 2, shape, s0, &t), DT_ERR_INVALID_USAGE, "abstract");
    /* tensor rank */
    int64_t shape9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    dt_placement_t r1[1] = {dt_replicate()};
    EXPECT_T_NULL(make(k, m1, DT_F32, 9, shape9, r1, &t), DT_ERR_INVALID_ARG, "ndim");
    EXPECT_T_NULL(make(k, m1, DT_F32, -1, shape, r1, &t), DT_ERR_INVALID_ARG, "ndim");
    if (k != MK_FROM_LOCAL) /* from_local infers a NULL global shape */
      EXPECT_T_NULL(make(k, m1, DT_F32, 2, NULL, s0, &t), DT_ERR_INVALID_ARG, "shape");
    /* negative sizes */
    int64_t neg[2] = {-1, 3}, neg2[2] = {7, -3}, huge[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, neg, s0, &t), DT_ERR_INVALID_ARG, "shape|negative");
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, neg2, r1, &t), DT_ERR_INVALID_ARG, "shape|negative");
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, huge, s0, &t), DT_ERR_INVALID_ARG, "large|elements");
    /* placements */
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, shape, NULL, &t), DT_ERR_INVALID_ARG, "placement");
    dt_placement_t s2[1] = {dt_shard(2)}, sm3[1] = {dt_shard(-3)}, s9[1] = {dt_shard(9)};
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, shape, s2, &t), DT_ERR_INVALID_ARG, "dim");
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, shape, sm3, &t), DT_ERR_INVALID_ARG, "dim");
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, shape, s9, &t), DT_ERR_INVALID_ARG, "dim");
    dt_placement_t badkind[1] = {{9, 0, 0}}, badop[1] = {{DT_PARTIAL, 0, 7}};
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, shape, badkind, &t), DT_ERR_INVALID_ARG, "kind");
    EXPECT_T_NULL(make(k, m1, DT_F32, 2, shape, badop, &t), DT_ERR_INVALID_ARG, "op");
    /* a 0-dim tensor cannot be sharded */
    EXPECT_T_NULL(make(k, m1, DT_F32, 0, NULL, s0, &t), DT_ERR_INVALID_ARG, "dim");
    /* dtype */
    EXPECT_T_NULL(make(k, m1, (dt_dtype_t)99, 2, shape, s0, &t), DT_ERR_INVALID_ARG, "dtype");
    EXPECT_T_NULL(make(k, m1, (dt_dtype_t)-1, 2, shape, s0, &t), DT_ERR_INVALID_ARG, "dtype");
    EXPECT_T_NULL(make(k, m1, (dt_dtype_t)DT_DTYPE_COUNT, 2, shape, s0, &t), DT_ERR_INVALID_ARG,
                  "dtype");
  }
  int k = MK_RAND;
  /* rand/randn need a float dtype */
  for (int dt = DT_I32; dt <= DT_I64; dt++) {
    k = MK_RAND;
    EXPECT_T_NULL(make(k, m1, (dt_dtype_t)dt, 2, shape, s0, &t), DT_ERR_INVALID_ARG, "float");
    k = MK_RANDN;
    EXPECT_T_NULL(make(k, m1, (dt_dtype_t)dt, 2, shape, s0, &t), DT_ERR_INVALID_ARG, "float");
  }
  /* non-finite fill values */
  const double nonfinite[3] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 3; i++) {
    k = MK_FULL;
    EXPECT_T_NULL(dt_tensor_full_value(m1, DT_F32, 2, shape, s0, nonfinite[i], &t),
                  DT_ERR_INVALID_ARG, "finite");
    k = MK_ARANGE;
    EXPECT_T_NULL(dt_tensor_arange(m1, DT_F32, 2, shape, s0, nonfinite[i], 1.0, &t),
                  DT_ERR_INVALID_ARG, "finite");
    EXPECT_T_NULL(dt_tensor_arange(m1, DT_F32, 2, shape, s0, 0.0, nonfinite[i], &t),
                  DT_ERR_INVALID_ARG, "finite");
  }
  /* from_full: NULL full */
  k = MK_FROM_FULL;
  EXPECT_T_NULL(dt_tensor_from_full(m1, DT_F32, 2, shape, s0, NULL, &t), DT_ERR_INVALID_ARG,
                "full|NULL");
  /* distribute: src_rank not in the mesh (every rank sees the same answer) */
  k = MK_DISTRIBUTE;
  const int bad_src[3] = {-1, g_world, g_world + 5};
  for (int i = 0; i < 3; i++)
    EXPECT_T_NULL(dt_tensor_distribute(m1, DT_F32, 2, shape, s0, g_big_buf, bad_src[i], &t),
                  DT_ERR_INVALID_ARG, "src_rank|member");
  /* zero-size tensors are legal */
  int64_t zshape[2] = {0, 3};
  DT_ASSERT_OK(dt_tensor_zeros(m1, DT_F32, 2, zshape, s0, &t));
  int64_t n = 7;
  DT_ASSERT_OK(dt_tensor_local_numel(t, &n));
  DT_ASSERT_EQ(n, 0);
  DT_ASSERT_OK(dt_tensor_destroy(t));
#undef EXPECT_T_NULL
}

/* Formats nothing: collects the integers appearing in s, in order. */
static int ints_in(const char* s, long long* v, int cap) {
  int n = 0;
  while (*s && n < cap) {
    if (isdigit((unsigned char)*s) || (*s == '-' && isdigit((unsigned char)s[1]))) {
      char* end;
      v[n++] = strtoll(s, &end, 10);
      s = end;
    } else {
      s++;
    }
  }
  return n;
}

/* 1 if the integers of want[0..nw) appear consecutively among the integers of the message. */
static int message_names_shape(const char* msg, const int64_t* want, int nw) {
  long long v[256];
  int n = ints_in(msg, v, 256);
  for (int i = 0; i + nw <= n; i++) {
    int ok = 1;
    for (int j = 0; j < nw && ok; j++) ok = v[i + j] == want[j];
    if (ok) return 1;
  }
  return 0;
}

static int64_t chunk_len(int64_t n, int parts, int r) {
  int64_t c = (n + parts - 1) / parts, s = c * r, e = c * (r + 1);
  if (e > n) e = n;
  return e > s ? e - s : 0;
}

static void test_from_local_bad(dt_mesh_t m1) {
  int W = g_world, me;
  DT_ASSERT_OK(dt_mesh_local_rank(m1, 0, &me));
  int64_t gshape[2] = {7, 3};
  dt_placement_t s0[1] = {dt_shard(0)};
  int64_t want[2] = {chunk_len(7, W, me), 3};
  float* buf = calloc(64, sizeof(float));
  dt_tensor_t t;
  /* wrong local shape in dim 0 and in dim 1: the message names the expected local shape */
  int64_t wrong[3][2] = {{want[0] + 1, 3}, {want[0], 2}, {want[0] + 2, 4}};
  for (int k = 0; k < 3; k++) {
    t = BAD_PTR;
    EXPECT(dt_tensor_from_local(m1, DT_F32, 2, gshape, s0, buf, wrong[k], &t), DT_ERR_INVALID_ARG,
           "local");
    DT_ASSERT_TRUE(t == NULL, "out not cleared");
    DT_ASSERT_TRUE(message_names_shape(dt_last_error(), want, 2),
                   "message '%s' does not name the expected local shape (%lld, %lld)",
                   dt_last_error(), (long long)want[0], (long long)want[1]);
  }
  /* Replicate: the local shape must be the global shape */
  dt_placement_t r1[1] = {dt_replicate()};
  int64_t small[2] = {6, 3};
  EXPECT(dt_tensor_from_local(m1, DT_F32, 2, gshape, r1, buf, small, &t), DT_ERR_INVALID_ARG,
         "local");
  DT_ASSERT_TRUE(message_names_shape(dt_last_error(), gshape, 2), "message '%s'",
                 dt_last_error());
  /* NULL arguments */
  t = BAD_PTR;
  EXPECT(dt_tensor_from_local(m1, DT_F32, 2, gshape, s0, buf, NULL, &t), DT_ERR_INVALID_ARG,
         "local_shape|NULL");
  DT_ASSERT_TRUE(t == NULL, "out not cleared");
  t = BAD_PTR;
  if (want[0] > 0) {
    EXPECT(dt_tensor_from_local(m1, DT_F32, 2, gshape, s0, NULL, want, &t), DT_ERR_INVALID_ARG,
           "local|NULL");
    DT_ASSERT_TRUE(t == NULL, "out not cleared");
  }
  /* NULL global shape with uneven shards: ranks infer different global shapes -> all fail */
  int64_t uneven = W + 1; /* W+1 rows over W ranks is never even */
  int64_t ul[2] = {chunk_len(uneven, W, me), 3};
  t = BAD_PTR;
  EXPECT(dt_tensor_from_local(m1, DT_F32, 2, NULL, s0, buf, ul, &t), DT_ERR_INVALID_ARG,
         "uneven|global|differ");
  DT_ASSERT_TRUE(t == NULL, "out not cleared");
  /* the library and the world are still in step: even shards infer the global shape */
  int64_t el[2] = {2, 3}, g[2];
  DT_ASSERT_OK(dt_tensor_from_local(m1, DT_F32, 2, NULL, s0, buf, el, &t));
  DT_ASSERT_OK(dt_tensor_shape(t, g));
  DT_ASSERT_EQ(g[0], 2 * W);
  DT_ASSERT_EQ(g[1], 3);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  free(buf);
}

/* ---------------------------------------------------------------------------------------------
 * tensor accessors and whole-tensor calls */

static void test_tensor_accessors(dt_mesh_t m1) {
  for (int z = 0; z < 3; z++) {
    dt_tensor_t bad = z == 0 ? NULL : garbage_tensor(z == 1);
    dt_dtype_t dt;
    int nd = 7;
    int64_t shp[8], numel = 7;
    dt_placement_t pl[4];
    dt_mesh_t mm = BAD_PTR;
    void* data = BAD_PTR;
    EXPECT(dt_tensor_dtype(bad, &dt), DT_ERR_INVALID_ARG, "tensor");
    EXPECT(dt_tensor_ndim(bad, &nd), DT_ERR_INVALID_ARG, "tensor");
    DT_ASSERT_EQ(nd, 0);
    EXPECT(dt_tensor_shape(bad, shp), DT_ERR_INVALID_ARG, "tensor");
    EXPECT(dt_tensor_placements(bad, pl), DT_ERR_INVALID_ARG, "tensor");
    EXPECT(dt_tensor_mesh(bad, &mm), DT_ERR_INVALID_ARG, "tensor");
    DT_ASSERT_TRUE(mm == NULL, "mesh not cleared");
    EXPECT(dt_tensor_local_shape(bad, shp), DT_ERR_INVALID_ARG, "tensor");
    EXPECT(dt_tensor_local_offset(bad, shp), DT_ERR_INVALID_ARG, "tensor");
    EXPECT(dt_tensor_local_numel(bad, &numel), DT_ERR_INVALID_ARG, "tensor");
    DT_ASSERT_EQ(numel, 0);
    EXPECT(dt_tensor_to_local(bad, &data, shp), DT_ERR_INVALID_ARG, "tensor");
    DT_ASSERT_TRUE(data == NULL, "data not cleared");
    float out[4];
    EXPECT(dt_tensor_gather_full(bad, out, sizeof out), DT_ERR_INVALID_ARG, "tensor");
    dt_placement_t r[1] = {dt_replicate()};
    dt_tensor_t o = BAD_PTR;
    EXPECT(dt_tensor_redistribute(bad, r, &o), DT_ERR_INVALID_ARG, "tensor");
    DT_ASSERT_TRUE(o == NULL, "out not cleared");
    EXPECT(dt_tensor_visualize(bad, stdout), DT_ERR_INVALID_ARG, "tensor");
    if (z != 0) EXPECT(dt_tensor_destroy(bad), DT_ERR_INVALID_ARG, "tensor");
  }
  DT_ASSERT_OK(dt_tensor_destroy(NULL));
  int64_t shape[2] = {5, 3};
  dt_placement_t s0[1] = {dt_shard(0)};
  dt_tensor_t t;
  DT_ASSERT_OK(dt_tensor_arange(m1, DT_F32, 2, shape, s0, 0.0, 1.0, &t));
  EXPECT(dt_tensor_dtype(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_ndim(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_shape(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_placements(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_mesh(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_local_shape(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_local_offset(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_local_numel(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_to_local(t, NULL, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_tensor_visualize(t, NULL), DT_ERR_INVALID_ARG, "NULL");
  /* to_local with local_shape NULL is allowed */
  void* data;
  DT_ASSERT_OK(dt_tensor_to_local(t, &data, NULL));
  /* full: NULL out and too-small buffers (same on every rank), buffer untouched */
  float full[15], sentinel = -1234.5f;
  for (int i = 0; i < 15; i++) full[i] = sentinel;
  EXPECT(dt_tensor_gather_full(t, NULL, sizeof full), DT_ERR_INVALID_ARG, "out|NULL");
  EXPECT(dt_tensor_gather_full(t, full, sizeof full - 1), DT_ERR_INVALID_ARG, "bytes|small");
  EXPECT(dt_tensor_gather_full(t, full, 0), DT_ERR_INVALID_ARG, "bytes|small");
  EXPECT(dt_tensor_gather_full(t, full, sizeof(float)), DT_ERR_INVALID_ARG, "bytes|small");
  for (int i = 0; i < 15; i++) DT_ASSERT_TRUE(full[i] == sentinel, "full[%d] written", i);
  /* exactly the right size works */
  float want[15];
  for (int i = 0; i < 15; i++) want[i] = (float)i;
  expect_full_f32(t, want, 15, __LINE__);
  /* visualize / sharding_visualize */
  EXPECT(dt_sharding_visualize(NULL, 2, shape, s0, stdout), DT_ERR_INVALID_ARG, "mesh");
  EXPECT(dt_sharding_visualize(garbage_mesh(1), 2, shape, s0, stdout), DT_ERR_INVALID_ARG, "mesh");
  EXPECT(dt_sharding_visualize(m1, 2, shape, s0, NULL), DT_ERR_INVALID_ARG, "NULL");
  EXPECT(dt_sharding_visualize(m1, 2, shape, NULL, stdout), DT_ERR_INVALID_ARG, "placement");
  int64_t neg[2] = {-5, 3};
  EXPECT(dt_sharding_visualize(m1, 2, neg, s0, stdout), DT_ERR_INVALID_ARG, "shape|negative");
  dt_placement_t s5[1] = {dt_shard(5)};
  EXPECT(dt_sharding_visualize(m1, 2, shape, s5, stdout), DT_ERR_INVALID_ARG, "dim");
  EXPECT(dt_sharding_visualize(m1, 9, shape, s0, stdout), DT_ERR_INVALID_ARG, "ndim");
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

static void test_redistribute_bad(dt_mesh_t m1, dt_mesh_t m1b) {
  int W = g_world;
  int64_t shape[2] = {7, 3};
  dt_placement_t s0[1] = {dt_shard(0)}, s1[1] = {dt_shard(1)}, r[1] = {dt_replicate()};
  dt_tensor_t t, o;
  DT_ASSERT_OK(dt_tensor_arange(m1, DT_F32, 2, shape, s0, 0.0, 1.0, &t));
  EXPECT(dt_tensor_redistribute(t, r, NULL), DT_ERR_INVALID_ARG, "out|NULL");
  o = BAD_PTR;
  EXPECT(dt_tensor_redistribute(t, NULL, &o), DT_ERR_INVALID_ARG, "dst|NULL|placement");
  DT_ASSERT_TRUE(o == NULL, "out not cleared");
  /* a new Partial from a Shard */
  for (int op = 0; op < DT_REDUCE_COUNT; op++) {
    dt_placement_t p[1] = {dt_partial((dt_reduce_op_t)op)};
    o = BAD_PTR;
    EXPECT(dt_tensor_redistribute(t, p, &o), DT_ERR_UNSUPPORTED, "partial|shard|unsupported");
    DT_ASSERT_TRUE(o == NULL, "out not cleared");
  }
  /* invalid target placements */
  dt_placement_t bad_targets[4][1] = {{dt_shard(2)}, {dt_shard(-3)}, {{9, 0, 0}},
                                      {{DT_PARTIAL, 0, 11}}};
  for (int k = 0; k < 4; k++) {
    o = BAD_PTR;
    EXPECT(dt_tensor_redistribute(t, bad_targets[k], &o), DT_ERR_INVALID_ARG, NULL);
    DT_ASSERT_TRUE(o == NULL, "out not cleared");
  }
  /* P(x) -> P(y) for x != y */
  for (int x = 0; x < DT_REDUCE_COUNT; x++) {
    dt_placement_t px[1] = {dt_partial((dt_reduce_op_t)x)};
    dt_tensor_t tp;
    DT_ASSERT_OK(dt_tensor_ones(m1, DT_F32, 2, shape, px, &tp));
    for (int y = 0; y < DT_REDUCE_COUNT; y++) {
      if (x == y) continue;
      dt_placement_t py[1] = {dt_partial((dt_reduce_op_t)y)};
      o = BAD_PTR;
      EXPECT(dt_tensor_redistribute(tp, py, &o), DT_ERR_UNSUPPORTED, "partial|unsupported");
      DT_ASSERT_TRUE(o == NULL, "out not cleared");
    }
    DT_ASSERT_OK(dt_tensor_destroy(tp));
  }
  /* redistribute_into: mismatched shape, rank, dtype, mesh; shared storage */
  dt_tensor_t d_shape, d_rank, d_dtype, d_mesh, d_part;
  int64_t shape_b[2] = {7, 4}, shape_flat[1] = {21};
  DT_ASSERT_OK(dt_tensor_full_value(m1, DT_F32, 2, shape_b, r, 42.0, &d_shape));
  DT_ASSERT_OK(dt_tensor_full_value(m1, DT_F32, 1, shape_flat, r, 42.0, &d_rank));
  DT_ASSERT_OK(dt_tensor_full_value(m1, DT_I32, 2, shape, r, 42.0, &d_dtype));
  DT_ASSERT_OK(dt_tensor_full_value(m1b, DT_F32, 2, shape, r, 42.0, &d_mesh));
  dt_placement_t p[1] = {dt_partial(DT_REDUCE_SUM)};
  DT_ASSERT_OK(dt_tensor_full_value(m1, DT_F32, 2, shape, p, 42.0, &d_part));
  EXPECT(dt_tensor_redistribute_into(t, d_shape), DT_ERR_INVALID_ARG, "shape");
  EXPECT(dt_tensor_redistribute_into(t, d_rank), DT_ERR_INVALID_ARG, "shape|ndim");
  EXPECT(dt_tensor_redistribute_into(t, d_dtype), DT_ERR_INVALID_ARG, "dtype");
  EXPECT(dt_tensor_redistribute_into(t, d_mesh), DT_ERR_INVALID_ARG, "mesh");
  EXPECT(dt_tensor_redistribute_into(t, d_part), DT_ERR_UNSUPPORTED, "partial|unsupported");
  EXPECT(dt_tensor_redistribute_into(NULL, d_shape), DT_ERR_INVALID_ARG, "tensor|NULL");
  EXPECT(dt_tensor_redistribute_into(t, NULL), DT_ERR_INVALID_ARG, "tensor|NULL");
  EXPECT(dt_tensor_redistribute_into(garbage_tensor(0), t), DT_ERR_INVALID_ARG, "tensor");
  EXPECT(dt_tensor_redistribute_into(t, garbage_tensor(1)), DT_ERR_INVALID_ARG, "tensor");
  /* the failed targets are untouched */
  dt_tensor_t dsts[5] = {d_shape, d_rank, d_dtype, d_mesh, d_part};
  for (int k = 0; k < 5; k++) {
    void* data;
    int64_t n;
    dt_dtype_t dt;
    DT_ASSERT_OK(dt_tensor_to_local(dsts[k], &data, NULL));
    DT_ASSERT_OK(dt_tensor_local_numel(dsts[k], &n));
    DT_ASSERT_OK(dt_tensor_dtype(dsts[k], &dt));
    for (int64_t i = 0; i < n; i++) {
      double v = dt == DT_I32 ? ((int32_t*)data)[i] : ((float*)data)[i];
      double expect = k == 4 ? 42.0 / W : 42.0; /* P(sum) holds value / mesh size (floats) */
      DT_ASSERT_TRUE(v == (double)(float)expect, "target %d element %lld changed to %g", k,
                     (long long)i, v);
    }
    DT_ASSERT_OK(dt_tensor_destroy(dsts[k]));
  }
  /* src and dst sharing storage */
  float* buf = calloc(64, sizeof(float));
  int64_t lshape[2] = {7, 3};
  dt_tensor_t a, b;
  DT_ASSERT_OK(dt_tensor_from_local(m1, DT_F32, 2, shape, r, buf, lshape, &a));
  DT_ASSERT_OK(dt_tensor_from_local(m1, DT_F32, 2, shape, r, buf, lshape, &b));
  EXPECT(dt_tensor_redistribute_into(a, b), DT_ERR_INVALID_ARG, "storage|share");
  DT_ASSERT_OK(dt_tensor_destroy(a));
  DT_ASSERT_OK(dt_tensor_destroy(b));
  free(buf);
  /* after all that, t still redistributes correctly */
  DT_ASSERT_OK(dt_tensor_redistribute(t, s1, &o));
  float want[21];
  for (int i = 0; i < 21; i++) want[i] = (float)i;
  expect_full_f32(o, want, 21, __LINE__);
  DT_ASSERT_OK(dt_tensor_destroy(o));
  DT_ASSERT_OK(dt_tensor_destroy(t));
}

/* ---------------------------------------------------------------------------------------------
 * plans and the cost model */

static void test_plans_bad(dt_mesh_t am) {
  int64_t shape[2] = {8, 6};
  dt_placement_t src[2] = {dt_shard(0), dt_shard(1)}, dst[2] = {dt_replicate(), dt_replicate()};
  dt_plan_t p;
#define EXPECT_P_NULL(call, want, needles)                      \
  do {                                                          \
    p = BAD_PTR;                                                \
    EXPECT(call, want, needles);                                \
    DT_ASSERT_TRUE(p == NULL, "plan not NULL after failure");   \
  } while (0)
  for (int greedy = 0; greedy < 2; greedy++) {
    dt_status_t (*create)(dt_mesh_t, dt_dtype_t, int, const int64_t*, const dt_placement_t*,
                          const dt_placement_t*, dt_plan_t*) =
        greedy ? dt_plan_create_greedy : dt_plan_create;
    EXPECT(create(am, DT_F32, 2, shape, src, dst, NULL), DT_ERR_INVALID_ARG, "out|NULL");
    EXPECT_P_NULL(create(NULL, DT_F32, 2, shape, src, dst, &p), DT_ERR_INVALID_ARG, "mesh");
    EXPECT_P_NULL(create(garbage_mesh(1), DT_F32, 2, shape, src, dst, &p), DT_ERR_INVALID_ARG,
                  "mesh");
    EXPECT_P_NULL(create(am, (dt_dtype_t)99, 2, shape, src, dst, &p), DT_ERR_INVALID_ARG, "dtype");
    EXPECT_P_NULL(create(am, DT_F32, 9, shape, src, dst, &p), DT_ERR_INVALID_ARG, "ndim");
    EXPECT_P_NULL(create(am, DT_F32, 2, NULL, src, dst, &p), DT_ERR_INVALID_ARG, "shape");
    EXPECT_P_NULL(create(am, DT_F32, 2, shape, NULL, dst, &p), DT_ERR_INVALID_ARG, "src|NULL");
    EXPECT_P_NULL(create(am, DT_F32, 2, shape, src, NULL, &p), DT_ERR_INVALID_ARG, "dst|NULL");
    int64_t neg[2] = {8, -6};
    EXPECT_P_NULL(create(am, DT_F32, 2, neg, src, dst, &p), DT_ERR_INVALID_ARG, "shape|negative");
    dt_placement_t bsrc[2] = {dt_shard(2), dt_replicate()}, bdst[2] = {dt_replicate(), dt_shard(-3)};
    EXPECT_P_NULL(create(am, DT_F32, 2, shape, bsrc, dst, &p), DT_ERR_INVALID_ARG, "dim");
    EXPECT_P_NULL(create(am, DT_F32, 2, shape, src, bdst, &p), DT_ERR_INVALID_ARG, "dim");
    dt_placement_t pdst[2] = {dt_partial(DT_REDUCE_SUM), dt_shard(1)};
    EXPECT_P_NULL(create(am, DT_F32, 2, shape, src, pdst, &p), DT_ERR_UNSUPPORTED,
                  "partial|unsupported");
    dt_placement_t psum[2] = {dt_partial(DT_REDUCE_SUM), dt_replicate()},
                   pmax[2] = {dt_partial(DT_REDUCE_MAX), dt_replicate()};
    EXPECT_P_NULL(create(am, DT_F32, 2, shape, psum, pmax, &p), DT_ERR_UNSUPPORTED,
                  "partial|unsupported");
  }
#undef EXPECT_P_NULL
  DT_ASSERT_OK(dt_plan_create(am, DT_F32, 2, shape, src, dst, &p));
  int n = 0;
  DT_ASSERT_OK(dt_plan_num_steps(p, &n));
  DT_ASSERT_TRUE(n >= 1, "plan has %d steps", n);
  dt_plan_step_t step, zero;
  memset(&zero, 0, sizeof zero);
  const int bad_i[4] = {-1, n, n + 1, 1 << 30};
  for (int k = 0; k < 4; k++) {
    memset(&step, 0x5a, sizeof step);
    EXPECT(dt_plan_get_step(p, bad_i[k], &step), DT_ERR_INVALID_ARG, "step|range");
    DT_ASSERT_TRUE(memcmp(&step, &zero, sizeof step) == 0, "step %d not zeroed", bad_i[k]);
  }
  DT_ASSERT_OK(dt_plan_get_step(p, n - 1, &step));
  EXPECT(dt_plan_get_step(NULL, 0, &step), DT_ERR_INVALID_ARG, "plan|NULL");
  EXPECT(dt_plan_get_step(p, 0, NULL), DT_ERR_INVALID_ARG, "step|NULL");
  int v = 7;
  EXPECT(dt_plan_num_steps(NULL, &v), DT_ERR_INVALID_ARG, "plan|NULL");
  DT_ASSERT_EQ(v, 0);
  EXPECT(dt_plan_num_steps(p, NULL), DT_ERR_INVALID_ARG, "NULL");
  double c = 7.0;
  EXPECT(dt_plan_cost(NULL, &c), DT_ERR_INVALID_ARG, "plan|NULL");
  DT_ASSERT_TRUE(c == 0.0, "cost not cleared");
  EXPECT(dt_plan_cost(p, NULL), DT_ERR_INVALID_ARG, "NULL");
  v = 7;
  EXPECT(dt_plan_count(p, DT_COLL_COUNT, &v), DT_ERR_INVALID_ARG, "collective|range");
  DT_ASSERT_EQ(v, 0);
  EXPECT(dt_plan_count(p, (dt_collective_t)-1, &v), DT_ERR_INVALID_ARG, "collective|range");
  EXPECT(dt_plan_count(NULL, DT_COLL_ALL_GATHER, &v), DT_ERR_INVALID_ARG, "plan|NULL");
  EXPECT(dt_plan_count(p, DT_COLL_ALL_GATHER, NULL), DT_ERR_INVALID_ARG, "NULL");
  char buf[256];
  EXPECT(dt_plan_format(p, buf, 0), DT_ERR_INVALID_ARG, "cap|small");
  EXPECT(dt_plan_format(p, buf, 4), DT_ERR_INVALID_ARG, "small|buffer");
  EXPECT(dt_plan_format(p, NULL, sizeof buf), DT_ERR_INVALID_ARG, "buf|NULL");
  EXPECT(dt_plan_format(NULL, buf, sizeof buf), DT_ERR_INVALID_ARG, "plan|NULL");
  DT_ASSERT_OK(dt_plan_format(p, buf, sizeof buf));
  DT_ASSERT_OK(dt_plan_destroy(p));
  DT_ASSERT_OK(dt_plan_destroy(NULL));
  EXPECT(dt_plan_destroy(garbage_plan()), DT_ERR_INVALID_ARG, "plan");
  DT_ASSERT_TRUE(strcmp(dt_collective_name((dt_collective_t)-1), "invalid") == 0, "name");
  DT_ASSERT_TRUE(strcmp(dt_collective_name(DT_COLL_COUNT), "invalid") == 0, "name");
}

static void snapshot_costs(dt_cost_params_t* out) {
  for (int c = 0; c < DT_COLL_COUNT; c++) DT_ASSERT_OK(dt_cost_model_get((dt_collective_t)c, &out[c]));
}

static void expect_costs_equal(const dt_cost_params_t* a, const dt_cost_params_t* b, int line) {
  g_checks++;
  for (int c = 0; c < DT_COLL_COUNT; c++)
    if (a[c].base_us != b[c].base_us || a[c].hop_us != b[c].hop_us || a[c].bw_gbps != b[c].bw_gbps) {
      fprintf(stderr, "[rank %d] line %d: cost model of %s changed by a failed call\n", g_rank,
              line, dt_collective_name((dt_collective_t)c));
      dt_test_die();
    }
}

static void write_file(const char* path, const char* text) {
  FILE* f = fopen(path, "wb");
  DT_ASSERT_TRUE(f != NULL, "cannot write %s", path);
  fputs(text, f);
  fclose(f);
}

static void test_cost_model_bad(void) {
  dt_cost_params_t before[DT_COLL_COUNT], after[DT_COLL_COUNT];
  DT_ASSERT_OK(dt_cost_model_reset());
  snapshot_costs(before);
  dt_cost_params_t q;
  EXPECT(dt_cost_model_get(DT_COLL_COUNT, &q), DT_ERR_INVALID_ARG, "collective|range");
  EXPECT(dt_cost_model_get((dt_collective_t)-1, &q), DT_ERR_INVALID_ARG, "collective|range");
  EXPECT(dt_cost_model_get(DT_COLL_ALL_GATHER, NULL), DT_ERR_INVALID_ARG, "NULL");
  /* set: invalid parameters leave the model unchanged */
  const dt_cost_params_t bad[] = {{1.0, 1.0, -1.0}, {1.0, 1.0, 0.0},     {-1.0, 1.0, 10.0},
                                  {1.0, -1.0, 10.0}, {NAN, 1.0, 10.0},    {1.0, NAN, 10.0},
                                  {1.0, 1.0, NAN},   {INFINITY, 1.0, 10.0}, {1.0, 1.0, INFINITY}};
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    EXPECT(dt_cost_model_set(DT_COLL_ALL_REDUCE, &bad[k]), DT_ERR_INVALID_ARG,
           "bw_gbps|base_us|hop_us");
    snapshot_costs(after);
    expect_costs_equal(before, after, __LINE__);
  }
  const dt_cost_params_t good = {1.0, 2.0, 3.0};
  EXPECT(dt_cost_model_set(DT_COLL_COUNT, &good), DT_ERR_INVALID_ARG, "collective|range");
  EXPECT(dt_cost_model_set(DT_COLL_ALL_GATHER, NULL), DT_ERR_INVALID_ARG, "NULL");
  snapshot_costs(after);
  expect_costs_equal(before, after, __LINE__);
  /* estimate */
  double c = 7.0;
  EXPECT(dt_cost_estimate(DT_COLL_ALL_GATHER, 0, 100, &c), DT_ERR_INVALID_ARG, "n = |least");
  DT_ASSERT_TRUE(c == 0.0, "cost not cleared");
  EXPECT(dt_cost_estimate(DT_COLL_ALL_GATHER, -3, 100, &c), DT_ERR_INVALID_ARG, "n = |least");
  EXPECT(dt_cost_estimate(DT_COLL_COUNT, 2, 100, &c), DT_ERR_INVALID_ARG, "collective|range");
  EXPECT(dt_cost_estimate(DT_COLL_ALL_GATHER, 2, 100, NULL), DT_ERR_INVALID_ARG, "NULL");

  /* load: missing file, invalid JSON, bad values; each leaves the model unchanged */
  char dir[64];
  snprintf(dir, sizeof dir, "/tmp/dt_bad_input_%d_%d", (int)getpid(), g_rank);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
  DT_ASSERT_EQ(system(cmd), 0);
  char path[128], missing[128];
  snprintf(path, sizeof path, "%s/model.json", dir);
  snprintf(missing, sizeof missing, "%s/no_such_model_file.json", dir);
  EXPECT(dt_cost_model_load(missing), DT_ERR_IO, "no_such_model_file");
  snapshot_costs(after);
  expect_costs_equal(before, after, __LINE__);
  /* a directory cannot be read as a model file */
  dt_clear_error();
  dt_status_t dst = dt_cost_model_load(dir);
  check_err(dst, dst == DT_ERR_INVALID_ARG ? DT_ERR_INVALID_ARG : DT_ERR_IO, dir, "load(dir)",
            __LINE__);
  snapshot_costs(after);
  expect_costs_equal(before, after, __LINE__);
  EXPECT(dt_cost_model_load(NULL), DT_ERR_INVALID_ARG, "path|NULL");
  const struct {
    const char* text;
    const char* needles;
  } bad_json[] = {
      {"", "model.json|JSON"},
      {"{", "model.json|JSON"},
      {"not json at all", "model.json|JSON"},
      {"[1, 2, 3]", "model.json|object"},
      {"42", "model.json|object"},
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10},}", "model.json|JSON"},
      /* valid first entry, negative bandwidth later: nothing may be applied */
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 10},"
       " \"all_reduce\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": -5}}",
       "bw_gbps|bandwidth"},
      {"{\"all_reduce\": {\"base_us\": 1, \"hop_us\": 1, \"bw_gbps\": 0}}", "bw_gbps|bandwidth"},
      {"{\"all_gather\": {\"base_us\": -1, \"hop_us\": 1, \"bw_gbps\": 10}}", "base_us"},
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": -2, \"bw_gbps\": 10}}", "hop_us"},
      {"{\"all_gather\": {\"base_us\": \"fast\", \"hop_us\": 1, \"bw_gbps\": 10}}", "base_us|number"},
      {"{\"all_gather\": {\"base_us\": 1, \"hop_us\": 1}}", "bw_gbps|number"},
      {"{\"all_gather\": 5}", "all_gather|number"},
  };
  for (size_t k = 0; k < sizeof bad_json / sizeof bad_json[0]; k++) {
    write_file(path, bad_json[k].text);
    dt_clear_error();
    dt_status_t st = dt_cost_model_load(path);
    check_err(st, DT_ERR_INVALID_ARG, bad_json[k].needles, bad_json[k].text, __LINE__);
    snapshot_costs(after);
    expect_costs_equal(before, after, __LINE__);
  }
  /* the unchanged checks can fail: a valid file does change the model */
  write_file(path, "{\"all_gather\": {\"base_us\": 11.5, \"hop_us\": 0.25, \"bw_gbps\": 3.5}}");
  DT_ASSERT_OK(dt_cost_model_load(path));
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_GATHER, &q));
  DT_ASSERT_TRUE(q.base_us == 11.5 && q.hop_us == 0.25 && q.bw_gbps == 3.5, "load ignored");
  DT_ASSERT_OK(dt_cost_model_get(DT_COLL_ALL_REDUCE, &q));
  DT_ASSERT_TRUE(memcmp(&q, &before[DT_COLL_ALL_REDUCE], sizeof q) == 0, "all_reduce changed");
  /* save: unwritable path */
  char nodir[160];
  snprintf(nodir, sizeof nodir, "%s/no/such/dir/model.json", dir);
  EXPECT(dt_cost_model_save(nodir), DT_ERR_IO, "no/such/dir");
  EXPECT(dt_cost_model_save(NULL), DT_ERR_INVALID_ARG, "path|NULL");
  DT_ASSERT_OK(dt_cost_model_reset());
  snapshot_costs(after);
  expect_costs_equal(before, after, __LINE__);
  remove(path);
  rmdir(dir);
}

/* ---------------------------------------------------------------------------------------------
 * meshes over part of the world, mesh destroyed before its tensors */

static void test_partial_mesh(void) {
  int shape[1] = {1}, ranks[1] = {0};
  dt_mesh_t pm;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, ranks, &pm));
  int member = -1, v, coords[1];
  DT_ASSERT_OK(dt_mesh_is_member(pm, &member));
  DT_ASSERT_EQ(member, g_rank == 0);
  if (!member) {
    EXPECT(dt_mesh_coordinate(pm, coords), DT_ERR_INVALID_USAGE, "member");
    EXPECT(dt_mesh_local_rank(pm, 0, &v), DT_ERR_INVALID_USAGE, "member");
  }
  /* src_rank outside the mesh fails on every rank, members and non-members alike */
  int64_t tshape[1] = {5};
  dt_placement_t r[1] = {dt_replicate()};
  dt_tensor_t t = BAD_PTR;
  EXPECT(dt_tensor_distribute(pm, DT_F32, 1, tshape, r, g_big_buf, 1, &t), DT_ERR_INVALID_ARG,
         "src_rank|member");
  DT_ASSERT_TRUE(t == NULL, "out not cleared");
  DT_ASSERT_OK(dt_mesh_destroy(pm));
}

static void test_mesh_destroyed_first(void) {
  int W = g_world, shape[1] = {W};
  dt_mesh_t m;
  DT_ASSERT_OK(dt_mesh_create(1, shape, NULL, NULL, &m));
  int64_t tshape[2] = {W + 3, 2};
  dt_placement_t s0[1] = {dt_shard(0)}, r[1] = {dt_replicate()};
  dt_tensor_t t, u;
  DT_ASSERT_OK(dt_tensor_arange(m, DT_F32, 2, tshape, s0, 0.0, 1.0, &t));
  DT_ASSERT_OK(dt_tensor_zeros(m, DT_F32, 2, tshape, r, &u));
  DT_ASSERT_OK(dt_mesh_destroy(m)); /* tensors keep the mesh alive */
  dt_mesh_t tm = NULL;
  DT_ASSERT_OK(dt_tensor_mesh(t, &tm));
  int nd = 0;
  DT_ASSERT_OK(dt_mesh_ndim(tm, &nd));
  DT_ASSERT_EQ(nd, 1);
  DT_ASSERT_OK(dt_tensor_redistribute_into(t, u));
  int64_t n = (W + 3) * 2;
  float* want = malloc(sizeof(float) * (size_t)n);
  for (int64_t i = 0; i < n; i++) want[i] = (float)i;
  expect_full_f32(u, want, n, __LINE__);
  dt_tensor_t v;
  DT_ASSERT_OK(dt_tensor_redistribute(u, s0, &v));
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_destroy(u));
  expect_full_f32(v, want, n, __LINE__); /* the last tensor still holds the mesh */
  DT_ASSERT_OK(dt_tensor_destroy(v));
  free(want);
}

/* ---------------------------------------------------------------------------------------------
 * the library still works after all the errors */

static void test_state_intact(dt_mesh_t m1, dt_mesh_t m2) {
  int64_t shape[2] = {7, 5};
  float want[35];
  for (int i = 0; i < 35; i++) want[i] = (float)(3 * i - 20);
  dt_placement_t a1[1] = {dt_shard(0)}, b1[1] = {dt_shard(1)};
  dt_tensor_t t, o, o2;
  DT_ASSERT_OK(dt_tensor_from_full(m1, DT_F32, 2, shape, a1, want, &t));
  DT_ASSERT_OK(dt_tensor_redistribute(t, b1, &o));
  expect_full_f32(o, want, 35, __LINE__);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_destroy(o));
  dt_placement_t a2[2] = {dt_shard(0), dt_shard(1)}, b2[2] = {dt_replicate(), dt_shard(0)},
                 c2[2] = {dt_partial(DT_REDUCE_SUM), dt_replicate()};
  DT_ASSERT_OK(dt_tensor_distribute(m2, DT_F32, 2, shape, a2, want, g_world - 1, &t));
  DT_ASSERT_OK(dt_tensor_redistribute(t, b2, &o));
  expect_full_f32(o, want, 35, __LINE__);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  /* integer Partial round trip is exact */
  int32_t iw[35], ig[35];
  for (int i = 0; i < 35; i++) iw[i] = i * 7 - 11;
  DT_ASSERT_OK(dt_tensor_from_full(m2, DT_I32, 2, shape, c2, iw, &t));
  DT_ASSERT_OK(dt_tensor_redistribute(t, b2, &o2));
  DT_ASSERT_OK(dt_tensor_gather_full(o2, ig, sizeof ig));
  for (int i = 0; i < 35; i++) DT_ASSERT_EQ(ig[i], iw[i]);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_destroy(o));
  DT_ASSERT_OK(dt_tensor_destroy(o2));
}

/* Arguments past int64 and fields past their encodings (found by an adversarial review): an
 * empty tensor whose other dims multiply past 2^48, a slice step and a split size near INT64_MAX,
 * a cast to a dtype that only its low 32 bits make valid, placements out of range through
 * autograd, a loss whose value was dropped, and the learning-rate schedule's extremes. */
static void test_extremes(dt_mesh_t m1) {
  dt_placement_t rep[1] = {dt_replicate()};
  dt_tensor_t t = NULL, o = NULL;
  const int64_t empty_big[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  EXPECT(dt_tensor_zeros(m1, DT_F32, 3, empty_big, rep, &t), DT_ERR_INVALID_ARG, "2^48");
  DT_ASSERT_TRUE(t == NULL, "a refused tensor was returned");
  const int64_t empty_ok[3] = {0, 1 << 20, 1 << 20}; /* 2^40 <= 2^48: allowed */
  DT_ASSERT_OK(dt_tensor_zeros(m1, DT_F32, 3, empty_ok, rep, &t));
  const int64_t huge_view[3] = {0, (int64_t)1 << 20, (int64_t)1 << 60};
  EXPECT(dt_reshape(t, 3, huge_view, &o), DT_ERR_INVALID_ARG, NULL);
  DT_ASSERT_TRUE(o == NULL, "a refused reshape returned a tensor");
  DT_ASSERT_OK(dt_tensor_destroy(t));

  const int64_t s34[2] = {3, 4};
  DT_ASSERT_OK(dt_tensor_arange(m1, DT_F32, 2, s34, rep, 0.0, 1.0, &t));
  const int64_t sl[4] = {1, 0, 4, INT64_MAX}; /* dim 1, [0, 4), step INT64_MAX: one column */
  DT_ASSERT_OK(dt_op_run("slice", 1, &t, 4, sl, 0, NULL, &o));
  int64_t sh[2];
  DT_ASSERT_OK(dt_tensor_shape(o, sh));
  DT_ASSERT_TRUE(sh[0] == 3 && sh[1] == 1, "slice with a huge step: shape (%lld, %lld), "
                 "expected (3, 1)", (long long)sh[0], (long long)sh[1]);
  DT_ASSERT_OK(dt_tensor_destroy(o));
  dt_tensor_t pieces[4];
  int np = 0;
  DT_ASSERT_OK(dt_split(t, INT64_MAX, 1, pieces, 4, &np)); /* one piece: the whole dim */
  DT_ASSERT_TRUE(np == 1, "split with a huge size: %d pieces, expected 1", np);
  DT_ASSERT_OK(dt_tensor_destroy(pieces[0]));
  const int64_t to[1] = {((int64_t)1 << 32) | DT_BF16}; /* low bits a valid dtype */
  o = BAD_PTR;
  EXPECT(dt_op_run("cast", 1, &t, 1, to, 0, NULL, &o), DT_ERR_INVALID_ARG, "dtype");
  DT_ASSERT_TRUE(o == NULL, "a refused cast returned a tensor");

  /* autograd: placements checked before they are encoded into the op's arguments */
  dt_tape_t tape;
  DT_ASSERT_OK(dt_tape_create(&tape));
  dt_var_t x, y = NULL, l;
  DT_ASSERT_OK(dt_var_leaf(t, 1, &x));
  t = NULL;
  const dt_placement_t bad_dim[1] = {{DT_SHARD, 256, 0}}, bad_op[1] = {{DT_PARTIAL, 0, 16}};
  EXPECT(dt_ag_redistribute(tape, x, bad_dim, &y), DT_ERR_INVALID_ARG, "Shard dim 256");
  EXPECT(dt_ag_redistribute(tape, x, bad_op, &y), DT_ERR_INVALID_ARG, "reduce op 16");
  EXPECT(dt_ag_to_local(tape, x, bad_dim, &y), DT_ERR_INVALID_ARG, "Shard dim 256");
  DT_ASSERT_TRUE(y == NULL, "a refused autograd call returned a variable");
  /* a dropped loss is recomputed, as a dropped input is */
  DT_ASSERT_OK(dt_ag_op(tape, "exp", 1, &x, 0, NULL, 0, NULL, 1, &y));
  DT_ASSERT_OK(dt_ag_op(tape, "sum", 1, &y, 0, NULL, 0, NULL, 1, &l));
  DT_ASSERT_OK(dt_tape_drop(tape, l));
  DT_ASSERT_OK(dt_tape_backward(tape, l));
  float g[12];
  DT_ASSERT_OK(dt_tensor_gather_full(dt_var_grad(x), g, sizeof g));
  for (int i = 0; i < 12; i++) /* d sum(exp(x)) / dx = exp(x), x = arange */
    DT_ASSERT_TRUE(fabsf(g[i] - expf((float)i)) <= 1e-5f * expf((float)i), "grad %d: %g", i,
                   (double)g[i]);
  DT_ASSERT_OK(dt_tape_destroy(tape));
  DT_ASSERT_OK(dt_var_destroy(x));

  /* the schedule: negative step or warmup count as 0, no overflow near INT64_MAX */
  const double lr0 = dt_lr_schedule(0, -1, INT64_MAX, 1.0, 0.0);
  DT_ASSERT_TRUE(lr0 == 1.0, "lr_schedule(0, -1, INT64_MAX): %g, expected 1", lr0);
  const double lrn = dt_lr_schedule(-5, 10, 100, 1.0, 0.0);
  DT_ASSERT_TRUE(lrn == 0.1, "lr_schedule(-5, 10, 100): %g, expected 0.1 (step 0)", lrn);
  const double lrend = dt_lr_schedule(INT64_MAX, INT64_MAX - 1, INT64_MAX, 1.0, 0.25);
  DT_ASSERT_TRUE(lrend >= 0.25 && lrend <= 1.0, "lr_schedule near INT64_MAX: %g", lrend);
  g_checks += 8;
}

/* cast refuses what PyTorch converts to a platform-dependent value (the deliberate difference
 * dtensor/ops.h documents): NaN, inf and floats outside the integer type, on every rank (the bad
 * element sits on the last rank's shard); in-range values of the same tensors convert. */
static void test_cast_refused(dt_mesh_t m1) {
  const float bad[4] = {NAN, -INFINITY, 3e9f, 1e19f};
  const int64_t shape[1] = {4}, to_i32[1] = {DT_I32}, to_i64[1] = {DT_I64};
  const dt_placement_t s0[1] = {dt_shard(0)};
  for (int k = 0; k < 4; k++) {
    const float v[4] = {1.5f, -2.5f, -0.0f, bad[k]};
    dt_tensor_t t, o = BAD_PTR;
    DT_ASSERT_OK(dt_tensor_from_full(m1, DT_F32, 1, shape, s0, v, &t));
    EXPECT(dt_op_run("cast", 1, &t, 1, to_i32, 0, NULL, &o), DT_ERR_INVALID_ARG, "cast|range");
    DT_ASSERT_TRUE(o == NULL, "a refused cast returned a tensor");
    if (k == 2) { /* 3e9 fits i64 */
      int64_t got[4];
      DT_ASSERT_OK(dt_op_run("cast", 1, &t, 1, to_i64, 0, NULL, &o));
      DT_ASSERT_OK(dt_tensor_gather_full(o, got, sizeof got));
      DT_ASSERT_TRUE(got[0] == 1 && got[1] == -2 && got[2] == 0 && got[3] == 3000000000ll,
                     "cast to i64: %lld %lld %lld %lld", (long long)got[0], (long long)got[1],
                     (long long)got[2], (long long)got[3]);
      DT_ASSERT_OK(dt_tensor_destroy(o));
    } else {
      o = BAD_PTR;
      EXPECT(dt_op_run("cast", 1, &t, 1, to_i64, 0, NULL, &o), DT_ERR_INVALID_ARG, "cast|range");
      DT_ASSERT_TRUE(o == NULL, "a refused cast returned a tensor");
    }
    DT_ASSERT_OK(dt_tensor_destroy(t));
  }
}

/* Values stored into integer tensors must fit them (C leaves the conversion of anything else
 * undefined: x86 stored INT_MIN; torch.full refuses it): the factories (arange: its last value
 * too) and dt_tensor_fill_local refuse them on every rank; in-range values truncate toward zero
 * as PyTorch's do, and float tensors take them. */
static void test_int_fill_range(dt_mesh_t m1) {
  const dt_placement_t rep[1] = {dt_replicate()}, s0[1] = {dt_shard(0)};
  const int64_t n4[1] = {4};
  dt_tensor_t t = BAD_PTR;
  EXPECT(dt_tensor_full_value(m1, DT_I32, 1, n4, s0, 3e9, &t), DT_ERR_INVALID_ARG, "value|i32");
  DT_ASSERT_TRUE(t == NULL, "a refused factory returned a tensor");
  EXPECT(dt_tensor_full_value(m1, DT_I32, 1, n4, rep, -2147483649.0, &t), DT_ERR_INVALID_ARG,
         "i32");
  EXPECT(dt_tensor_full_value(m1, DT_I64, 1, n4, rep, 1e19, &t), DT_ERR_INVALID_ARG, "i64");
  EXPECT(dt_tensor_full_value(m1, DT_I64, 1, n4, rep, 0x1p63, &t), DT_ERR_INVALID_ARG, "i64");
  EXPECT(dt_tensor_arange(m1, DT_I32, 1, n4, s0, 0.0, 1e9, &t), DT_ERR_INVALID_ARG,
         "numel|i32"); /* 0, 1e9, 2e9 fit; 3e9 does not */
  EXPECT(dt_tensor_arange(m1, DT_I32, 1, n4, s0, 3e9, -1e9, &t), DT_ERR_INVALID_ARG,
         "start|i32");
  DT_ASSERT_TRUE(t == NULL, "a refused factory returned a tensor");
  int32_t i32[4];
  DT_ASSERT_OK(dt_tensor_arange(m1, DT_I32, 1, n4, s0, 2147483647.5, -1.0, &t));
  DT_ASSERT_OK(dt_tensor_gather_full(t, i32, sizeof i32));
  DT_ASSERT_TRUE(i32[0] == 2147483647 && i32[3] == 2147483644, "arange i32: %d .. %d", i32[0],
                 i32[3]);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  DT_ASSERT_OK(dt_tensor_full_value(m1, DT_I32, 1, n4, rep, -2147483648.9, &t));
  DT_ASSERT_OK(dt_tensor_gather_full(t, i32, sizeof i32));
  DT_ASSERT_TRUE(i32[0] == INT32_MIN, "full i32 of -2147483648.9: %d (truncates to "
                 "-2147483648)", i32[0]);
  const int64_t off[1] = {0}, one[1] = {1};
  const double bad[4] = {NAN, INFINITY, 2147483648.0, -1e300};
  for (int k = 0; k < 4; k++)
    EXPECT(dt_tensor_fill_local(t, 1, off, one, bad[k]), DT_ERR_INVALID_ARG, "value|i32");
  DT_ASSERT_OK(dt_tensor_gather_full(t, i32, sizeof i32));
  DT_ASSERT_TRUE(i32[0] == INT32_MIN, "a refused fill changed the tensor: %d", i32[0]);
  DT_ASSERT_OK(dt_tensor_fill_local(t, 1, off, one, -7.9));
  DT_ASSERT_OK(dt_tensor_gather_full(t, i32, sizeof i32));
  DT_ASSERT_TRUE(i32[0] == -7 && i32[1] == INT32_MIN, "fill_local -7.9: %d %d", i32[0], i32[1]);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  float f[4];
  DT_ASSERT_OK(dt_tensor_full_value(m1, DT_F32, 1, n4, rep, 3e9, &t));
  DT_ASSERT_OK(dt_tensor_fill_local(t, 1, off, one, 1e10));
  DT_ASSERT_OK(dt_tensor_gather_full(t, f, sizeof f));
  DT_ASSERT_TRUE(f[0] == 1e10f && f[3] == 3e9f, "f32 %g %g", (double)f[0], (double)f[3]);
  /* a float dtype: a finite value past its largest finite one is refused (torch.full and fill_
   * alike: f16 65519 too, though it would round to 65504); NaN and infinities fill it */
  EXPECT(dt_tensor_fill_local(t, 1, off, one, 3.5e38), DT_ERR_INVALID_ARG, "overflows dtype f32");
  DT_ASSERT_OK(dt_tensor_fill_local(t, 1, off, one, -INFINITY));
  const int64_t off3[1] = {3};
  DT_ASSERT_OK(dt_tensor_fill_local(t, 1, off3, one, NAN));
  DT_ASSERT_OK(dt_tensor_gather_full(t, f, sizeof f));
  DT_ASSERT_TRUE(isinf(f[0]) && f[0] < 0 && isnan(f[3]), "f32 fills: %g %g", (double)f[0],
                 (double)f[3]);
  DT_ASSERT_OK(dt_tensor_destroy(t));
  static const struct {
    dt_dtype_t dtype;
    double ok, bad;
  } edge[] = {{DT_F16, 65504.0, 65519.0}, {DT_BF16, 3.38e38, 3.4e38}, {DT_F32, 3.4e38, 3.5e38}};
  for (int k = 0; k < 3; k++) {
    EXPECT(dt_tensor_full_value(m1, edge[k].dtype, 1, n4, rep, -edge[k].bad, &t),
           DT_ERR_INVALID_ARG, "overflows dtype");
    DT_ASSERT_TRUE(t == NULL, "a refused factory returned a tensor");
    EXPECT(dt_tensor_arange(m1, edge[k].dtype, 1, n4, rep, 0.0, edge[k].bad / 3.0, &t),
           DT_ERR_INVALID_ARG, "start + step * (numel - 1)");
    DT_ASSERT_OK(dt_tensor_full_value(m1, edge[k].dtype, 1, n4, rep, edge[k].ok, &t));
    DT_ASSERT_OK(dt_tensor_fill_local(t, 1, off, one, -edge[k].ok));
    EXPECT(dt_tensor_fill_local(t, 1, off, one, edge[k].bad), DT_ERR_INVALID_ARG,
           "overflows dtype");
    DT_ASSERT_OK(dt_tensor_destroy(t));
  }
  g_checks += 16;
}

int main(int argc, char** argv) {
  memset(g_junk_blob, 0xa5, sizeof g_junk_blob);
  test_before_init();
  DT_ASSERT_OK(dt_init(&argc, &argv));
  DT_ASSERT_OK(dt_world_rank(&g_rank));
  DT_ASSERT_OK(dt_world_size(&g_world));
  EXPECT(dt_init(&argc, &argv), DT_ERR_INVALID_USAGE, "twice|dt_init");
  EXPECT(dt_init(NULL, NULL), DT_ERR_INVALID_USAGE, "twice|dt_init");
  DT_ASSERT_TRUE(g_world % 2 == 0, "run with an even number of ranks (got %d)", g_world);
  for (int i = 0; i < 4096; i++) g_big_buf[i] = (float)i;

  test_mesh_create();
  int shape1[1] = {g_world}, shape2[2] = {2, g_world / 2};
  const char* n1[1] = {"x"};
  const char* n2[2] = {"dp", "tp"};
  dt_mesh_t m1, m1b, m2, unnamed, am;
  DT_ASSERT_OK(dt_mesh_create(1, shape1, n1, NULL, &m1));
  DT_ASSERT_OK(dt_mesh_create(1, shape1, n1, NULL, &m1b));
  DT_ASSERT_OK(dt_mesh_create(2, shape2, n2, NULL, &m2));
  DT_ASSERT_OK(dt_mesh_create(2, shape2, NULL, NULL, &unnamed));
  DT_ASSERT_OK(dt_mesh_create_abstract(2, shape2, n2, &am));

  test_mesh_accessors(m2, am);
  test_mesh_slice_flatten(m2, unnamed);
  test_construct_bad(m1, am);
  test_from_local_bad(m1);
  test_tensor_accessors(m1);
  test_redistribute_bad(m1, m1b);
  test_plans_bad(am);
  test_cost_model_bad();
  test_partial_mesh();
  test_mesh_destroyed_first();
  test_extremes(m1);
  test_cast_refused(m1);
  test_int_fill_range(m1);
  test_state_intact(m1, m2);

  DT_ASSERT_OK(dt_mesh_destroy(m1));
  DT_ASSERT_OK(dt_mesh_destroy(m1b));
  DT_ASSERT_OK(dt_mesh_destroy(m2));
  DT_ASSERT_OK(dt_mesh_destroy(unnamed));
  DT_ASSERT_OK(dt_mesh_destroy(am));
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) printf("test_bad_input: %d checks passed on %d ranks\n", g_checks, g_world);
  DT_ASSERT_OK(dt_finalize());
  return 0;
}
