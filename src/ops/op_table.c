/* op_table.c - the op table: every built-in op's descriptor, generated from DT_OP_LIST
 * (src/strategy/op_list.h) with designated initializers indexed by op id. */
#include "ops/ops.h"

const dt_op_info_t dt__op_table[DT_OP_COUNT] = {
#define DT__OP_ROW(id, nm, nin, nout, spec, rl, chk, bw, fl, hk, cmp)                    \
  [DT_OP_##id] = {.name = nm, .n_in = nin, .n_out = nout, .args = spec, .rules = rl,      \
                  .check = chk, .backward = bw, .flags = fl, .kernel = {[DT_DEVICE_HOST] = hk}, \
                  .composite = cmp},
    DT_OP_LIST(DT__OP_ROW)
#undef DT__OP_ROW
};
/* Adding an op: one row in op_list.h; then update this count, docs/design.md's op list and the
 * reference fixtures (tests/reference/make_fixtures.py). */
_Static_assert(DT_OP_COUNT == 107, "op table changed: update the count, the docs and the fixtures");
