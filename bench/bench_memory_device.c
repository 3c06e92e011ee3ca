/* `loco bench memory`'s device table: the activations one block of the
 * device model (train.device = cuda) keeps for its backward, per
 * recompute mode, fp32 and bf16, tp alone and tp + sp: measured from the
 * device model's carve beside its formula and the CPU model's (fp32).
 * Skipped, with the reason, without a CUDA build or a device (the kernel
 * emulator's loco, tests/gpu/emu/run.sh, has emulated devices). */
#include "bench/bench.h"
#include "core/core.h"
#include "inner/mesh/mesh.h"
#include "inner/model/model.h"

#include <stdio.h>
#include <string.h>

#define MB(x) ((double)(x) / (1024.0 * 1024.0))

#if !defined(LOCO_HAVE_CUDA)

int loco_bench_memory_device(const loco_config *cfg, loco_mesh *mesh, loco_comm *world) {
    (void)cfg, (void)mesh;
    if (loco_comm_rank(world) == 0)
        printf("\ndevice activations: skipped (built without CUDA)\n");
    return 0;
}

#else

#include "kernels/device.h"

static const char *const mode_names[3] = {"none", "selective", "full"};

/* The blocks' activation bytes of a device model with `rerun` blocks
 * recomputed (0 or all). */
static int device_act_bytes(const loco_gpt_config *mc, loco_mesh *mesh, int B, int T, bool sp,
                            bool bf16, int rerun, double *bytes) {
    loco_gpt_cuda_opts o = {.bf16 = bf16, .lo = 0, .hi = SIZE_MAX, .rerun = rerun};
    if (mc->tp > 1) {
        o.tp = mesh->group[LOCO_DIM_TP];
        o.tp_staged = true;
        o.sp = sp;
    }
    loco_gpt_cuda *g;
    LOCO_CHECK(loco_gpt_cuda_create_with(&g, mc, B, T, &o));
    *bytes = (double)loco_gpt_cuda_act_bytes(g);
    loco_gpt_cuda_destroy(g);
    return 0;
}

int loco_bench_memory_device(const loco_config *cfg, loco_mesh *mesh, loco_comm *world) {
    int n_dev = 0;
    if (loco_cuda_device_count(&n_dev) < 0 || n_dev < 1) {
        if (loco_comm_rank(world) == 0)
            printf("\ndevice activations: skipped (no CUDA device: %s)\n", loco_errmsg());
        return 0;
    }
    int device;
    LOCO_CHECK(loco_cuda_select_local_device(loco_comm_rank(world), &device));
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    mc.tp = (int)cfg->parallel.tp;
    const int B = (int)cfg->train.batch_size, T = mc.seq_len, L = mc.n_layer;
    const bool me0 = loco_comm_rank(world) == 0;
    if (me0)
        printf("\nactivation bytes one block of the device model keeps for its backward, "
               "B x T = %d x %d, tp = %d (rank 0's slice): measured (the device model's carve, "
               "per block) beside its formula and the CPU model's (fp32)\n\n"
               "| dtype | sp | recompute | measured MB | device formula MB | diff | "
               "CPU model MB |\n|---|---|---|---|---|---|---|\n",
               B, T, mc.tp);
    for (int bf16 = 0; bf16 < 2; bf16++)
        for (int sp = 0; sp < (mc.tp > 1 ? 2 : 1); sp++) {
            double none, full; /* all blocks' bytes: none; full (one shared set + L outputs) */
            LOCO_CHECK(device_act_bytes(&mc, mesh, B, T, sp, bf16, 0, &none));
            LOCO_CHECK(device_act_bytes(&mc, mesh, B, T, sp, bf16, L, &full));
            const double per[3] = {none / L, none / L, (full - none / L) / L};
            for (int mode = 0; me0 && mode < 3; mode++) {
                const double f = loco_gpt_device_block_act_formula(&mc, B, T, sp, bf16,
                                                                   (loco_recompute)mode);
                const double cpu =
                    loco_gpt_block_act_formula_for(&mc, B, T, sp, (loco_recompute)mode);
                printf("| %s | %s | %s | %.3f | %.3f | %+.2f%% | %.3f |\n",
                       bf16 ? "bf16" : "fp32", sp ? "on" : "off", mode_names[mode], MB(per[mode]),
                       MB(f), 100.0 * (per[mode] - f) / f, MB(cpu));
            }
        }
    if (me0)
        printf("\nfull: what a recomputed block keeps (its output), beside one shared set of a "
               "block's activations the recompute reruns into. selective = none on the device: "
               "its attention keeps the log-sum-exp, never the probabilities.\n");
    return 0;
}

#endif /* LOCO_HAVE_CUDA */
