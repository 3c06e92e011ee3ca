/* Mesh coordinates and per-dimension sub-communicators. */
#include "inner/mesh/mesh.h"

#include <string.h>

static const char *const dim_names[LOCO_DIM_COUNT] = {"tp", "cp", "ep", "dp", "pp"};

const char *loco_mesh_dim_name(loco_mesh_dim d) {
    return d < LOCO_DIM_COUNT ? dim_names[d] : "?";
}

int loco_mesh_init(loco_mesh *mesh, const loco_config *cfg, loco_comm *world) {
    memset(mesh, 0, sizeof *mesh);
    const int64_t tp = cfg->parallel.tp, cp = cfg->parallel.cp, ep = cfg->parallel.ep;
    const int64_t dp = cfg->parallel.dp, pp = cfg->parallel.pp;
    const int64_t product = tp * cp * dp * pp;
    const int n = loco_comm_size(world);
    if (product != n)
        return LOCO_ERR(LOCO_EINVAL,
                        "mesh dp=%lld x tp=%lld x pp=%lld x cp=%lld = %lld ranks, but the world "
                        "has %d (set parallel.* so that the product equals the rank count; "
                        "parallel.ep is folded out of dp)",
                        (long long)dp, (long long)tp, (long long)pp, (long long)cp,
                        (long long)product, n);
    if (dp % ep)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.ep = %lld must divide parallel.dp = %lld: expert parallelism is "
                        "folded out of the data-parallel ranks",
                        (long long)ep, (long long)dp);
    const int64_t sizes[LOCO_DIM_COUNT] = {tp, cp, ep, dp / ep, pp};
    for (int d = 0; d < LOCO_DIM_COUNT; d++)
        mesh->size[d] = (int)sizes[d];
    mesh->world = world;
    int r = loco_comm_rank(world);
    for (int d = 0; d < LOCO_DIM_COUNT; d++) {
        mesh->coord[d] = r % mesh->size[d];
        r /= mesh->size[d];
    }
    /* Ranks that share every other coordinate form the group of d: color =
     * the rank with coordinate d zeroed, key = the coordinate. */
    const int me = loco_comm_rank(world);
    for (int d = 0; d < LOCO_DIM_COUNT; d++) {
        int stride = 1;
        for (int e = 0; e < d; e++)
            stride *= mesh->size[e];
        int color = me - mesh->coord[d] * stride;
        int rc = loco_comm_split(world, color, mesh->coord[d], &mesh->group[d]);
        if (rc < 0) {
            loco_mesh_fini(mesh);
            return rc;
        }
    }
    /* data: ep and expert-dp vary; dp_cp: cp too (ep = 1), or cp and
     * expert-dp (ep > 1: zero.c averages the dense gradients over ep
     * first). */
    const int s_cp = mesh->size[LOCO_DIM_TP], s_ep = s_cp * mesh->size[LOCO_DIM_CP];
    const int s_dp = s_ep * mesh->size[LOCO_DIM_EP];
    const int c = mesh->coord[LOCO_DIM_CP], e = mesh->coord[LOCO_DIM_EP];
    const int d = mesh->coord[LOCO_DIM_DP];
    mesh->data_rank = e + mesh->size[LOCO_DIM_EP] * d;
    int rc = loco_comm_split(world, me - e * s_ep - d * s_dp, mesh->data_rank, &mesh->data);
    if (rc == 0 && mesh->size[LOCO_DIM_EP] > 1)
        rc = loco_comm_split(world, me - c * s_cp - d * s_dp, d * mesh->size[LOCO_DIM_CP] + c,
                             &mesh->dp_cp);
    else if (rc == 0)
        rc = loco_comm_split(world, me - c * s_cp - e * s_ep - d * s_dp,
                             mesh->data_rank * mesh->size[LOCO_DIM_CP] + c, &mesh->dp_cp);
    if (rc < 0)
        loco_mesh_fini(mesh);
    return rc;
}

void loco_mesh_fini(loco_mesh *mesh) {
    for (int d = 0; d < LOCO_DIM_COUNT; d++)
        loco_comm_destroy(mesh->group[d]);
    loco_comm_destroy(mesh->dp_cp);
    loco_comm_destroy(mesh->data);
    memset(mesh, 0, sizeof *mesh);
}
