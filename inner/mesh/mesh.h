/* inner/mesh/ — the device mesh of one island: each rank's coordinates in
 * (pp, dp, cp, tp) and a sub-communicator per dimension. */
#ifndef LOCO_MESH_H
#define LOCO_MESH_H

#include "core/core.h"
#include "inner/comm/comm.h"

typedef enum { LOCO_DIM_TP = 0, LOCO_DIM_CP, LOCO_DIM_EP, LOCO_DIM_DP, LOCO_DIM_PP, LOCO_DIM_COUNT } loco_mesh_dim;

typedef struct {
    /* parallel.tp, cp, ep, dp / ep (expert-dp: ep is folded out of the
     * data-parallel ranks, Megatron-Core's parallel folding), pp */
    int size[LOCO_DIM_COUNT];
    int coord[LOCO_DIM_COUNT];  /* this rank's position in each */
    loco_comm *world;           /* not owned */
    loco_comm *group[LOCO_DIM_COUNT]; /* ranks differing only in that dimension */
    /* Every data-parallel rank (parallel.dp of them: ep x expert-dp),
     * rank ep + EP x dp: they read different batches. */
    loco_comm *data;
    int data_rank;
    /* The ranks ZeRO averages and shards over: data x cp (rank data x cp +
     * cp) when ep = 1, which hold the same parameters; with ep > 1 the
     * expert-dp group (same ep rank: the same experts), the dense
     * gradients being averaged over ep first. */
    loco_comm *dp_cp;
} loco_mesh;

/* Builds the mesh of the [parallel] section over `world`. Rank order puts
 * tp fastest, then cp, ep, expert-dp and pp slowest (Megatron's order):
 *   rank = tp + TP*(cp + CP*(ep + EP*(edp + EDP*pp))), EP x EDP = parallel.dp.
 * tp x cp x dp x pp must equal the world size, and ep divide dp (ep > 1
 * needs cp = 1). Collective over world. */
int loco_mesh_init(loco_mesh *mesh, const loco_config *cfg, loco_comm *world);
void loco_mesh_fini(loco_mesh *mesh);
/* Name of a dimension ("tp", "cp", "ep", "dp", "pp"). */
const char *loco_mesh_dim_name(loco_mesh_dim d);

#endif /* LOCO_MESH_H */
