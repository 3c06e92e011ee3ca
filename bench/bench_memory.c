/* `loco bench memory CONFIG`: the bytes each rank actually allocates for
 * parameters, gradients, optimizer state, unit buffers and activations,
 * beside the ZeRO formula for the configured stage. Run it under mpirun
 * with parallel.dp = N to see the sharding. Then the activations one
 * block keeps per recompute mode (tp alone and tp + sp) beside their
 * formula, and the bytes the tp collectives of one micro-batch move beside
 * the analytic volume. With parallel.cp > 1: what a block keeps at cp = 1,
 * 2, 4 (ring and Ulysses) beside 1/cp of cp = 1, and the bytes the cp
 * attention of one micro-batch moves per layer beside the analytic
 * volume. With model.n_experts > 0 and parallel.ep > 1: the token rows the
 * MoE layers of one micro-batch send to other ep ranks beside the volume
 * of uniform routing. */
#include "bench/bench.h"
#include "core/core.h"
#include "inner/mesh/mesh.h"
#include "inner/model/model.h"
#include "inner/parallel/parallel.h"

#include <string.h>

#define MB(x) ((double)(x) / (1024.0 * 1024.0))

static const char *const mode_names[3] = {"none", "selective", "full"};

/* Per rank: what one block keeps for its backward under each recompute
 * mode, tp alone and tp + sp, measured from the model's carve beside the
 * formula of docs/PERFORMANCE.md. Collective over world. */
static int activation_table(const loco_config *cfg, loco_mesh *mesh, loco_comm *world) {
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    mc.tp = (int)cfg->parallel.tp;
    const int n_sp = mc.tp > 1 ? 2 : 1, n = loco_comm_size(world);
    enum { COLS = 12 }; /* 2 sp x 3 modes x (measured, formula) */
    double mine[COLS] = {0};
    for (int sp = 0; sp < n_sp; sp++)
        for (int mode = 0; mode < 3; mode++) {
            loco_gpt *m = NULL;
            loco_gpt_parallel par = {.tp = mc.tp > 1 ? mesh->group[LOCO_DIM_TP] : NULL,
                                     .sp = sp, .recompute = (loco_recompute)mode};
            LOCO_CHECK(loco_gpt_create_par(&m, &mc, (int)cfg->train.batch_size, mc.seq_len,
                                         LOCO_GPT_NO_PARAMS | LOCO_GPT_NO_GRADS |
                                             LOCO_GPT_NO_ACTS,
                                         &par));
            mine[(sp * 3 + mode) * 2] = (double)loco_gpt_block_act_bytes(m);
            mine[(sp * 3 + mode) * 2 + 1] = loco_gpt_block_act_formula(m, (loco_recompute)mode);
            loco_gpt_destroy(m);
        }
    double *all = loco_alloc((size_t)n * COLS * sizeof(double));
    size_t *counts = loco_alloc((size_t)n * sizeof(size_t));
    int rc = 0;
    if (!all || !counts)
        rc = LOCO_ERR(LOCO_ENOMEM, "activation table");
    for (int i = 0; rc == 0 && i < n; i++)
        counts[i] = COLS;
    if (rc == 0)
        rc = loco_comm_allgather(world, mine, all, counts, LOCO_DT_F64);
    if (rc == 0 && loco_comm_rank(world) == 0) {
        printf("\nactivation bytes one block keeps for its backward (fp32), B x T = %lld x %d, "
               "tp = %d: measured (the model's buffers) beside the formula\n\n",
               (long long)cfg->train.batch_size, mc.seq_len, mc.tp);
        printf("| rank | sp | recompute | measured MB | formula MB | diff |\n|---|---|---|---|---|---|\n");
        for (int i = 0; i < n; i++)
            for (int sp = 0; sp < n_sp; sp++)
                for (int mode = 0; mode < 3; mode++) {
                    const double *x = all + (size_t)COLS * i + (sp * 3 + mode) * 2;
                    printf("| %d | %s | %s | %.3f | %.3f | %+.2f%% |\n", i, sp ? "on" : "off",
                           mode_names[mode], MB(x[0]), MB(x[1]), 100.0 * (x[0] - x[1]) / x[1]);
                }
    }
    loco_free(all);
    loco_free(counts);
    return rc;
}

/* One forward and backward of B x T random tokens (drawn with
 * token_seed) through m after GPT-2's initialisation (seed 1: the same
 * weights on every rank); *dt: its seconds. */
static int random_micro_batch(loco_gpt *m, int B, int T, uint64_t token_seed, double *dt) {
    int32_t *tok = loco_alloc((size_t)B * T * sizeof(int32_t) * 2);
    if (!tok)
        return LOCO_ERR(LOCO_ENOMEM, "tokens");
    loco_rng rng;
    loco_rng_seed(&rng, 1);
    loco_gpt_init_weights(m, &rng);
    loco_rng_seed(&rng, token_seed);
    for (size_t i = 0; i < (size_t)B * T * 2; i++)
        tok[i] = (int32_t)(loco_rng_u64(&rng) % (uint64_t)loco_gpt_cfg(m)->vocab_size);
    float loss;
    const double t0 = loco_now();
    const int rc = loco_gpt_forward_backward(m, tok, tok + (size_t)B * T, B, T, 1.0f, &loss);
    *dt = loco_now() - t0;
    loco_free(tok);
    return rc;
}

/* The bytes per rank the tensor-parallel collectives of one micro-batch's
 * forward and backward move, counted as ring algorithms move them, from
 * the shapes alone: S = B*T*C*4 bytes of one activation. */
static void tp_comm_formula(const loco_config *cfg, double *ar, double *rs, double *ag) {
    const double t = (double)cfg->parallel.tp, L = (double)cfg->model.n_layer;
    const double N = (double)cfg->train.batch_size * (double)cfg->model.seq_len;
    const double C = (double)cfg->model.n_embd, S = N * C * 4, share = (t - 1) / t;
    const bool full = !strcmp(cfg->train.recompute, "full");
    const double Lr = full ? (cfg->train.recompute_layers ? (double)cfg->train.recompute_layers : L)
                           : 0; /* blocks whose forward runs twice */
    /* The vocabulary-parallel loss: row max (N) and sum of exp + target
     * logit (2N), all-reduced. */
    const double xent = 3 * N * 4;
    if (!cfg->parallel.sp) {
        /* embedding, 2 per block forward (+2 per recomputed block), head
         * input and 2 per block backward */
        *ar = 2 * share * (S * (1 + 2 * L + 2 * Lr + 1 + 2 * L) + xent);
        *rs = *ag = 0;
        return;
    }
    /* Forward: embedding RS; per block AG, RS, AG, RS; ln_f AG. Backward:
     * head RS; per block AG (dres), AG (ln_2 again), RS, AG (dres), AG
     * (ln_1 again), RS; embedding AG. Recomputed blocks repeat the forward. */
    *rs = share * S * (1 + 2 * L + 2 * Lr + 1 + 2 * L);
    *ag = share * S * (2 * L + 2 * Lr + 1 + 4 * L + 1);
    /* replicated gradients of this rank's rows: 6C per block, ln_f 2C, wpe T*C */
    *ar = 2 * share * (xent + 4 * (6 * C * L + 2 * C + (double)cfg->model.seq_len * C));
}

/* One micro-batch through the configured model: the bytes its tp
 * collectives moved beside tp_comm_formula. Collective over world. */
static int comm_table(const loco_config *cfg, loco_mesh *mesh, loco_comm *world) {
    if (cfg->parallel.tp < 2)
        return 0;
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    mc.tp = (int)cfg->parallel.tp;
    const int B = (int)cfg->train.batch_size, T = mc.seq_len;
    loco_gpt_parallel par = {.tp = mesh->group[LOCO_DIM_TP], .sp = cfg->parallel.sp,
                             .recompute_layers = (int)cfg->train.recompute_layers};
    par.recompute = !strcmp(cfg->train.recompute, "full")        ? LOCO_RECOMPUTE_FULL
                    : !strcmp(cfg->train.recompute, "selective") ? LOCO_RECOMPUTE_SELECTIVE
                                                                 : LOCO_RECOMPUTE_NONE;
    loco_gpt *m = NULL;
    LOCO_CHECK(loco_gpt_create_par(&m, &mc, B, T, 0, &par));
    int rc = 0;
    double dt;
    LOCO_CHECK_GOTO(random_micro_batch(m, B, T, 2, &dt), out);
    double ar, rs, ag;
    tp_comm_formula(cfg, &ar, &rs, &ag);
    const loco_gpt_comm_stats cs = loco_gpt_tp_comm_stats(m);
    if (loco_comm_rank(world) == 0) {
        printf("\ntensor-parallel collectives of one micro-batch (forward + backward), tp = %d%s, "
               "recompute %s, per rank, as ring algorithms move them (%lld calls, %.3f s):\n\n",
               mc.tp, cfg->parallel.sp ? " + sp" : "", cfg->train.recompute, (long long)cs.calls,
               dt);
        printf("| collective | measured MB | analytic MB |\n|---|---|---|\n");
        printf("| all-reduce | %.3f | %.3f |\n", MB(cs.allreduce), MB(ar));
        printf("| reduce-scatter | %.3f | %.3f |\n", MB(cs.reduce_scatter), MB(rs));
        printf("| all-gather | %.3f | %.3f |\n", MB(cs.allgather), MB(ag));
        printf("| total | %.3f | %.3f |\n", MB(cs.allreduce + cs.reduce_scatter + cs.allgather),
               MB(ar + rs + ag));
    }
out:
    loco_gpt_destroy(m);
    return rc;
}

/* One block's kept activations with cp = c (world split into groups of c
 * ranks) and the given algorithm; *rest: the part outside attention. */
static int cp_kept(const loco_config *cfg, loco_comm *world, int c, loco_cp_algo algo,
                   double *kept, double *rest) {
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    loco_comm *group = NULL;
    LOCO_CHECK(loco_comm_split(world, loco_comm_rank(world) / c, loco_comm_rank(world), &group));
    loco_gpt_parallel par = {.cp = c > 1 ? group : NULL, .cp_algo = algo};
    loco_gpt *m = NULL;
    int rc = loco_gpt_create_par(&m, &mc, (int)cfg->train.batch_size, mc.seq_len,
                               LOCO_GPT_NO_PARAMS | LOCO_GPT_NO_GRADS | LOCO_GPT_NO_ACTS, &par);
    if (rc == 0) {
        *kept = (double)loco_gpt_block_act_bytes(m);
        *rest = loco_gpt_block_act_formula(m, LOCO_RECOMPUTE_SELECTIVE);
        loco_gpt_destroy(m);
    }
    loco_comm_destroy(group);
    return rc;
}

/* Bytes per rank and layer the cp attention of one micro-batch (forward +
 * backward, no recompute) moves, from the shapes: ring passes K|V c-1
 * times forward, and K|V c-1 and dK|dV c times backward; Ulysses sends
 * (c-1)/c of q, k, v and the output forward, and of their gradients
 * backward. S = B T/c C 4 bytes, this rank's rows of one activation. */
static double cp_comm_formula(const loco_config *cfg, loco_cp_algo algo) {
    const double c = (double)cfg->parallel.cp, C = (double)cfg->model.n_embd;
    const double S = (double)cfg->train.batch_size * (double)cfg->model.seq_len / c * C * 4;
    if (algo == LOCO_CP_RING)
        return (c - 1 + c - 1 + c) * 2 * S;
    return 8 * (c - 1) / c * S;
}

/* Under cp: the two tables of the file comment. Collective over world. */
static int cp_tables(const loco_config *cfg, loco_mesh *mesh, loco_comm *world) {
    const int n = loco_comm_size(world), cp = (int)cfg->parallel.cp;
    if (cp < 2)
        return 0;
    const bool root = loco_comm_rank(world) == 0;
    static const char *const algo_names[2] = {"ring", "ulysses"};
    if (root)
        printf("\ncontext parallelism: what one block keeps for its backward per rank (fp32), B x "
               "T = %lld x %lld: measured (the model's buffers); outside attention beside 1/cp of "
               "cp = 1\n\n| cp_algo | cp | kept MB | attention state MB | outside attention MB "
               "| cp = 1 / cp MB | ratio |\n|---|---|---|---|---|---|---|\n",
               (long long)cfg->train.batch_size, (long long)cfg->model.seq_len);
    double kept1 = 0, rest1 = 0;
    LOCO_CHECK(cp_kept(cfg, world, 1, LOCO_CP_RING, &kept1, &rest1));
    for (int a = 0; a < 2; a++)
        for (int c = 1; c <= n; c *= 2) {
            if (n % c || (c == 1 && a == 1))
                continue;
            double kept, rest;
            LOCO_CHECK(cp_kept(cfg, world, c, (loco_cp_algo)a, &kept, &rest));
            if (root)
                printf("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f |\n", c > 1 ? algo_names[a] : "-",
                       c, MB(kept), MB(kept - rest), MB(rest), MB(rest1 / c), rest / (rest1 / c));
        }
    /* One micro-batch through the configured mesh. */
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    mc.tp = (int)cfg->parallel.tp;
    const int B = (int)cfg->train.batch_size, T = mc.seq_len;
    const loco_cp_algo algo =
        !strcmp(cfg->parallel.cp_algo, "ulysses") ? LOCO_CP_ULYSSES : LOCO_CP_RING;
    loco_gpt_parallel par = {.tp = mc.tp > 1 ? mesh->group[LOCO_DIM_TP] : NULL,
                             .cp = mesh->group[LOCO_DIM_CP], .cp_algo = algo};
    loco_gpt *m = NULL;
    LOCO_CHECK(loco_gpt_create_par(&m, &mc, B, T, 0, &par));
    int rc = 0;
    double dt;
    LOCO_CHECK_GOTO(random_micro_batch(m, B, T, 2, &dt), out);
    if (root) {
        const double per_layer = loco_gpt_cp_bytes(m) / mc.n_layer;
        const double formula = cp_comm_formula(cfg, algo) / (mc.tp > 1 ? mc.tp : 1);
        printf("\ncontext-parallel attention of one micro-batch (forward + backward), cp = %d %s, "
               "B x T = %d x %d, per rank and layer (%.3f s):\n\n| measured MB | analytic MB | "
               "diff |\n|---|---|---|\n| %.3f | %.3f | %+.2f%% |\n",
               cp, cfg->parallel.cp_algo, B, T, dt, MB(per_layer), MB(formula),
               100.0 * (per_layer - formula) / formula);
    }
out:
    loco_gpt_destroy(m);
    return rc;
}

/* Under ep: one micro-batch through the configured model (random tokens,
 * fresh weights): the bytes each rank sent to other ep ranks per MoE layer
 * beside uniform routing's 4 (e-1)/e N k C 4 (dispatch and combine, and
 * both again backward; N = B T tokens, k = top_k), and what was routed.
 * Collective over world. */
static int moe_table(const loco_config *cfg, loco_mesh *mesh, loco_comm *world) {
    const int e = mesh->size[LOCO_DIM_EP];
    if (cfg->model.n_experts <= 0 || e < 2)
        return 0;
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    mc.ep = e;
    mc.ep_rank = mesh->coord[LOCO_DIM_EP];
    const int B = (int)cfg->train.batch_size, T = mc.seq_len;
    loco_gpt_parallel par = {.ep = mesh->group[LOCO_DIM_EP]};
    loco_gpt *m = NULL;
    LOCO_CHECK(loco_gpt_create_par(&m, &mc, B, T, 0, &par));
    int rc = 0;
    double dt;
    double *all = loco_alloc((size_t)loco_comm_size(world) * 2 * sizeof(double));
    size_t *counts = loco_alloc((size_t)loco_comm_size(world) * sizeof(size_t));
    if (!all || !counts) {
        rc = LOCO_ERR(LOCO_ENOMEM, "MoE table");
        goto out;
    }
    /* every rank its own tokens, as data parallelism reads them */
    LOCO_CHECK_GOTO(random_micro_batch(m, B, T, 2 + (uint64_t)loco_comm_rank(world), &dt), out);
    const int layers = loco_gpt_moe_layers(m);
    int64_t dropped = 0, assignments = 0;
    for (int i = 0; i < layers; i++) {
        loco_gpt_moe_stats st;
        loco_gpt_moe_layer(m, i, &st);
        dropped += st.dropped, assignments += st.assignments;
    }
    double mine[2] = {loco_gpt_moe_bytes(m) / layers, (double)dropped / (double)assignments};
    for (int i = 0; i < loco_comm_size(world); i++)
        counts[i] = 2;
    LOCO_CHECK_GOTO(loco_comm_allgather(world, mine, all, counts, LOCO_DT_F64), out);
    if (loco_comm_rank(world) == 0) {
        const double formula = 4.0 * (e - 1) / e * (double)B * T * mc.top_k * mc.n_embd * 4;
        printf("\nexpert parallelism: token rows one micro-batch's MoE layers send to other ep "
               "ranks (dispatch + combine, forward + backward), per layer, ep = %d, E = %d, "
               "top_k = %d, capacity factor %g, B x T = %d x %d; analytic: uniform routing, "
               "nothing dropped\n\n| rank | measured MB | analytic MB | diff | dropped |\n"
               "|---|---|---|---|---|\n",
               e, mc.n_experts, mc.top_k, (double)mc.capacity_factor, B, T);
        for (int r = 0; r < loco_comm_size(world); r++)
            printf("| %d | %.3f | %.3f | %+.1f%% | %.1f%% |\n", r, MB(all[2 * r]), MB(formula),
                   100.0 * (all[2 * r] - formula) / formula, 100.0 * all[2 * r + 1]);
    }
out:
    loco_free(all);
    loco_free(counts);
    loco_gpt_destroy(m);
    return rc;
}

int loco_bench_memory(int argc, char **argv) {
    const char *path = NULL;
    loco_config cfg;
    loco_config_defaults(&cfg);
    bool plan = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--plan")) {
            plan = true;
        } else if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            if (!path)
                return LOCO_ERR(LOCO_EINVAL, "bench memory: CONFIG comes before --set");
            LOCO_CHECK(loco_config_set(&cfg, argv[++i]));
        } else if (argv[i][0] != '-' && !path) {
            path = argv[i];
            LOCO_CHECK(loco_config_load(&cfg, path));
        } else {
            return LOCO_ERR(LOCO_EINVAL,
                            "bench memory: unexpected argument '%s' (CONFIG [--plan] [--set "
                            "k=v]...)",
                            argv[i]);
        }
    }
    if (!path)
        return LOCO_ERR(LOCO_EINVAL, "bench memory: missing CONFIG");
    LOCO_CHECK(loco_config_validate(&cfg));
    if (plan) /* the mesh's figures without its ranks (bench_memory_plan.c) */
        return loco_bench_memory_plan(&cfg, path);
    loco_comm *world = NULL;
    loco_mesh mesh = {0};
    loco_gpt *m = NULL;
    loco_zero *z = NULL;
    int rc;
    LOCO_CHECK_GOTO(loco_comm_world(&world, cfg.parallel.backend), out);
    LOCO_CHECK_GOTO(loco_mesh_init(&mesh, &cfg, world), out);
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    mc.tp = (int)cfg.parallel.tp;
    mc.ep = mesh.size[LOCO_DIM_EP];
    mc.ep_rank = mesh.coord[LOCO_DIM_EP];
    const int stage = (int)cfg.parallel.zero_stage;
    loco_gpt_parallel par = {
        .tp = mc.tp > 1 ? mesh.group[LOCO_DIM_TP] : NULL,
        .sp = cfg.parallel.sp,
        .cp = cfg.parallel.cp > 1 ? mesh.group[LOCO_DIM_CP] : NULL,
        .cp_algo = !strcmp(cfg.parallel.cp_algo, "ulysses") ? LOCO_CP_ULYSSES : LOCO_CP_RING,
        .ep = mc.ep > 1 ? mesh.group[LOCO_DIM_EP] : NULL};
    LOCO_CHECK_GOTO(loco_gpt_create_par(&m, &mc, (int)cfg.train.batch_size, (int)mc.seq_len,
                                      loco_zero_model_flags(stage), &par),
                    out);
    LOCO_CHECK_GOTO(loco_zero_create(&z, m, mesh.dp_cp, &cfg), out);
    loco_mem_report r;
    loco_zero_memory(z, &r);
    /* Everything this process holds through loco_alloc, as a cross-check of
     * the per-kind figures. */
    double live = (double)loco_alloc_live_bytes();
    const int n = loco_comm_size(world), me = loco_comm_rank(world);
    const int dp = loco_comm_size(mesh.dp_cp); /* ZeRO's group: dp x cp */
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
        const double P = (double)loco_gpt_num_params(m);
        const double formula = loco_zero_formula_bytes(stage, loco_gpt_num_params(m), dp);
        static const char *const f[] = {"16P", "8P + 8P/N", "4P + 12P/N", "16P/N"};
        printf("loco bench memory: %s, %.1fM parameters (P) in this rank's tp slice, fp32 + "
               "AdamW, ZeRO-%d, dp = %d, tp = %d, B x T = %lld x %d\n",
               path, P / 1e6, stage, dp, mc.tp, (long long)cfg.train.batch_size, mc.seq_len);
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
    if (rc == 0)
        rc = activation_table(&cfg, &mesh, world);
    if (rc == 0)
        rc = loco_bench_memory_device(&cfg, &mesh, world);
    if (rc == 0)
        rc = comm_table(&cfg, &mesh, world);
    if (rc == 0)
        rc = cp_tables(&cfg, &mesh, world);
    if (rc == 0)
        rc = moe_table(&cfg, &mesh, world);
out:
    loco_zero_destroy(z);
    loco_gpt_destroy(m);
    loco_mesh_fini(&mesh);
    loco_comm_destroy(world);
    return rc;
}
