/* inner/mesh/ — the device mesh of one island: each rank's coordinates in
 * (pp, dp, cp, tp) and a sub-communicator per dimension. */
#ifndef LOCO_MESH_H
#define LOCO_MESH_H

#include "core/core.h"
#include "inner/comm/comm.h"

typedef enum { LOCO_DIM_TP = 0, LOCO_DIM_CP, LOCO_DIM_EP, LOCO_DIM_DP, LOCO_DIM_PP, LOCO_DIM_COUNT } loco_mesh_dim;

typedef struct {
    int size[LOCO_DIM_COUNT];   /* parallel.tp, cp, ep, dp, pp */
    int coord[LOCO_DIM_COUNT];  /* this rank's position in each */
    loco_comm *world;           /* not owned */
    loco_comm *group[LOCO_DIM_COUNT]; /* ranks differing only in that dimension */
    /* Ranks differing only in dp and cp (rank dp x cp + cp): they hold the
     * same parameters and average their gradients; ZeRO shards over it. */
    loco_comm *dp_cp;
} loco_mesh;

/* Builds the mesh of the [parallel] section over `world`. Rank order puts
 * tp fastest, then cp, ep, dp and pp slowest (Megatron's order, with ep
 * between cp and dp):
 *   rank = tp + TP*(cp + CP*(ep + EP*(dp + DP*pp))).
 * The product of the sizes must equal the world size; a dimension whose
 * feature is not built yet (ep > 1 today) is LOCO_ENOTSUP with a message
 * that says so. Collective over world. */
int loco_mesh_init(loco_mesh *mesh, const loco_config *cfg, loco_comm *world);
void loco_mesh_fini(loco_mesh *mesh);
/* Name of a dimension ("tp", "cp", "ep", "dp", "pp"). */
const char *loco_mesh_dim_name(loco_mesh_dim d);

#endif /* LOCO_MESH_H */
