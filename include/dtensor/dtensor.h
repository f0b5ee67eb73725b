/* dtensor/dtensor.h - umbrella header of the dtensor C library.
 *
 * dtensor shards tensors over a device mesh: every tensor carries one placement per mesh dim
 * (Shard, Replicate, Partial) and the library moves data between placements with collectives
 * chosen by a minimum-cost planner. See README.md and docs/.
 */
#ifndef DTENSOR_DTENSOR_H
#define DTENSOR_DTENSOR_H

#include "dtensor/status.h"
#include "dtensor/handle.h"
#include "dtensor/placement.h"
#include "dtensor/backend.h"
#include "dtensor/mesh.h"
#include "dtensor/redistribute.h"
#include "dtensor/tensor.h"
#include "dtensor/strategy.h"
#include "dtensor/ops.h"
#include "dtensor/autograd.h"
#include "dtensor/module.h"
#include "dtensor/nn.h"
#include "dtensor/parallel.h"
#include "dtensor/checkpoint.h"

#endif /* DTENSOR_DTENSOR_H */
