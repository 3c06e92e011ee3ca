/* Mesh coordinates and per-dimension sub-communicators. */
#include "inner/mesh/mesh.h"

#include <string.h>

static const char *const dim_names[LOCO_DIM_COUNT] = {"tp", "cp", "ep", "dp", "pp"};

const char *loco_mesh_dim_name(loco_mesh_dim d) {
    return d < LOCO_DIM_COUNT ? dim_names[d] : "?";
}

int loco_mesh_init(loco_mesh *mesh, const loco_config *cfg, loco_comm *world) {
    memset(mesh, 0, sizeof *mesh);
    const int64_t sizes[LOCO_DIM_COUNT] = {cfg->parallel.tp, cfg->parallel.cp, cfg->parallel.ep,
                                           cfg->parallel.dp, cfg->parallel.pp};
    int64_t product = 1;
    for (int d = 0; d < LOCO_DIM_COUNT; d++) {
        mesh->size[d] = (int)sizes[d];
        product *= sizes[d];
    }
    const int n = loco_comm_size(world);
    if (product != n)
        return LOCO_ERR(LOCO_EINVAL,
                        "mesh dp=%d x tp=%d x pp=%d x cp=%d x ep=%d = %lld ranks, but the world "
                        "has %d (set parallel.* so that the product equals the rank count)",
                        mesh->size[LOCO_DIM_DP], mesh->size[LOCO_DIM_TP],
                        mesh->size[LOCO_DIM_PP], mesh->size[LOCO_DIM_CP],
                        mesh->size[LOCO_DIM_EP], (long long)product, n);
    static const char *const unbuilt[LOCO_DIM_COUNT] = {[LOCO_DIM_EP] = "expert parallelism"};
    for (int d = 0; d < LOCO_DIM_COUNT; d++)
        if (unbuilt[d] && mesh->size[d] > 1)
            return LOCO_ERR(LOCO_ENOTSUP,
                            "parallel.%s = %d: %s is not built yet; this version trains with "
                            "parallel.dp, parallel.tp, parallel.pp and parallel.cp",
                            dim_names[d], mesh->size[d], unbuilt[d]);
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
    const int s_cp = mesh->size[LOCO_DIM_TP];
    const int s_dp = s_cp * mesh->size[LOCO_DIM_CP] * mesh->size[LOCO_DIM_EP];
    const int cp = mesh->coord[LOCO_DIM_CP], dp = mesh->coord[LOCO_DIM_DP];
    int rc = loco_comm_split(world, me - cp * s_cp - dp * s_dp, dp * mesh->size[LOCO_DIM_CP] + cp,
                             &mesh->dp_cp);
    if (rc < 0)
        loco_mesh_fini(mesh);
    return rc;
}

void loco_mesh_fini(loco_mesh *mesh) {
    for (int d = 0; d < LOCO_DIM_COUNT; d++)
        loco_comm_destroy(mesh->group[d]);
    loco_comm_destroy(mesh->dp_cp);
    memset(mesh, 0, sizeof *mesh);
}
