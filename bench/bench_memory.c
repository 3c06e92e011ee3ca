/* `loco bench memory CONFIG`: the bytes each rank actually allocates for
 * parameters, gradients, optimizer state, unit buffers and activations,
 * beside the ZeRO formula for the configured stage. Run it under mpirun
 * with parallel.dp = N to see the sharding. */
#include "bench/bench.h"
#include "core/core.h"
#include "inner/inner.h"
#include "inner/mesh/mesh.h"
#include "inner/parallel/parallel.h"

#include <string.h>

#define MB(x) ((double)(x) / (1024.0 * 1024.0))

int loco_bench_memory(int argc, char **argv) {
    const char *path = NULL;
    loco_config cfg;
    loco_config_defaults(&cfg);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (!path)
                return LOCO_ERR(LOCO_EINVAL, "bench memory: CONFIG comes before --set");
            LOCO_CHECK(loco_config_set(&cfg, argv[++i]));
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
            LOCO_CHECK(loco_config_load(&cfg, path));
        } else {
            return LOCO_ERR(LOCO_EINVAL, "bench memory: unexpected argument '%s' (CONFIG [--set k=v]...)",
                            argv[i]);
        }
    }
    if (!path)
        return LOCO_ERR(LOCO_EINVAL, "bench memory: missing CONFIG");
    LOCO_CHECK(loco_config_validate(&cfg));
    loco_comm *world = NULL;
    loco_mesh mesh = {0};
    loco_gpt m = {0};
    loco_zero *z = NULL;
    int rc;
    LOCO_CHECK_GOTO(loco_comm_world(&world, cfg.parallel.backend), out);
    LOCO_CHECK_GOTO(loco_mesh_init(&mesh, &cfg, world), out);
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    const int stage = (int)cfg.parallel.zero_stage;
    LOCO_CHECK_GOTO(loco_gpt_init_ex(&m, &mc, (int)cfg.train.batch_size, (int)mc.seq_len,
                                     loco_zero_model_flags(stage)),
                    out);
    LOCO_CHECK_GOTO(loco_zero_create(&z, &m, mesh.group[LOCO_DIM_DP], &cfg), out);
    loco_mem_report r;
    loco_zero_memory(z, &r);
    /* Everything this process holds through loco_alloc, as a cross-check of
     * the per-kind figures. */
    double live = (double)loco_alloc_live_bytes();
    const int n = loco_comm_size(world), me = loco_comm_rank(world);
    const int dp = loco_comm_size(mesh.group[LOCO_DIM_DP]);
    double mine[6] = {(double)r.params, (double)r.grads, (double)r.optim, (double)r.gathered,
                      (double)r.activations, live};
    double *all = loco_alloc((size_t)n * 6 * sizeof(double));
    size_t *counts = loco_alloc((size_t)n * sizeof(size_t));
    if (!all || !counts) {
        loco_free(all);
        loco_free(counts);
        rc = LOCO_ERR(LOCO_ENOMEM, "memory table");
        goto out;
    }
    for (int i = 0; i < n; i++)
        counts[i] = 6;
    rc = loco_comm_allgather(world, mine, all, counts, LOCO_DT_F64);
    if (rc == 0 && me == 0) {
        const double P = (double)m.n_params;
        const double formula = loco_zero_formula_bytes(stage, m.n_params, dp);
        static const char *const f[] = {"16P", "8P + 8P/N", "4P + 12P/N", "16P/N"};
        printf("loco bench memory: %s, %.1fM parameters (P), fp32 + AdamW, ZeRO-%d, dp = %d, "
               "B x T = %lld x %d\n",
               path, P / 1e6, stage, dp, (long long)cfg.train.batch_size, mc.seq_len);
        printf("formula for the persistent state: %s = %.1f MB per rank\n\n", f[stage],
               MB(formula));
        printf("| rank | params MB | grads MB | optimizer MB | persistent MB | formula MB | "
               "diff | unit buffers MB | activations MB | total MB | allocator MB |\n");
        printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < n; i++) {
            const double *x = all + 6 * i;
            double persistent = x[0] + x[1] + x[2];
            printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %+.2f%% | %.1f | %.1f | %.1f | %.1f "
                   "|\n",
                   i, MB(x[0]), MB(x[1]), MB(x[2]), MB(persistent), MB(formula),
                   100.0 * (persistent - formula) / formula, MB(x[3]), MB(x[4]),
                   MB(persistent + x[3] + x[4]), MB(x[5]));
        }
        printf("\nunit buffers: ZeRO-2/3 gradient, staging and (ZeRO-3) gathered-parameter "
               "buffers of the embeddings, ln_f and two blocks. allocator: every byte the process "
               "holds through loco_alloc (the kinds plus small tables).\n");
    }
    loco_free(all);
    loco_free(counts);
out:
    loco_zero_destroy(z);
    loco_gpt_fini(&m);
    loco_mesh_fini(&mesh);
    loco_comm_destroy(world);
    return rc;
}
