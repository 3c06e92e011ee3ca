/* `loco bench memory CONFIG --plan`: the per-rank bytes of a mesh too big
 * for this machine (configs/llama3-8b.ini, llama3-70b.ini), from the tables
 * and formulas the running model uses, allocating nothing and needing no
 * ranks: for each pipeline stage, the parameters of one tp rank's slice of
 * its blocks (the model's own table), the persistent state by the ZeRO
 * formula over the dp x cp group, and the activations one micro-batch's
 * block keeps (loco_gpt_block_act_formula_for, what bench memory checks
 * against the carve on models that fit) times the stage's blocks and the
 * micro-batches 1F1B keeps in flight on it. Beside them, Korthikanti et
 * al.'s activation formula (Megatron, "Reducing Activation Recomputation
 * in Large Transformer Models", 2022) for the same s, b, h, a, L, t:
 * sbh(34 + 5as/h) bytes per layer, /t with tp + sp, 34sbh/t with selective
 * recompute. It counts GPT's 16-bit activations with dropout masks and a
 * 4h MLP; loco's are fp32, without dropout, and its MLP and attention
 * widths are the description's, so the two differ by design: the table
 * shows by how much. */
#include "bench/bench.h"
#include "core/core.h"
#include "inner/model/model.h"
#include "inner/parallel/parallel.h"

#include <string.h>

#define GB(x) ((double)(x) / (1024.0 * 1024.0 * 1024.0))

/* Korthikanti's bytes per layer for one micro-batch. */
static double korthikanti(const loco_gpt_config *mc, double s, double b, int t, bool sp,
                          loco_recompute mode) {
    const double h = mc->n_embd, a = mc->n_head;
    if (mode == LOCO_RECOMPUTE_FULL)
        return 2 * s * b * h / (sp ? t : 1);
    const double attn = mode == LOCO_RECOMPUTE_SELECTIVE ? 0 : 5 * a * s / h;
    return sp ? s * b * h * (34 + attn) / t : s * b * h * (10 + (24 + attn) / t);
}

int loco_bench_memory_plan(const loco_config *cfg, const char *path) {
    const int t = (int)cfg->parallel.tp, pp = (int)cfg->parallel.pp;
    const int dp = (int)(cfg->parallel.dp * cfg->parallel.cp),
              stage_kind = (int)cfg->parallel.zero_stage;
    const int B = (int)cfg->train.batch_size, T = (int)cfg->model.seq_len;
    const int cpT = T / (int)cfg->parallel.cp, m = (int)cfg->train.grad_accum;
    const bool sp = cfg->parallel.sp;
    const loco_recompute mode = !strcmp(cfg->train.recompute, "full") ? LOCO_RECOMPUTE_FULL
                                : !strcmp(cfg->train.recompute, "selective")
                                    ? LOCO_RECOMPUTE_SELECTIVE
                                    : LOCO_RECOMPUTE_NONE;
    loco_gpt_config mc = loco_gpt_config_from(cfg);
    mc.tp = t;
    const int L = mc.n_layer;
    if (L % pp)
        return LOCO_ERR(LOCO_EINVAL,
                        "bench memory --plan: %d layers do not split into %d equal "
                        "pipeline stages",
                        L, pp);
    loco_gpt_config whole = mc;
    whole.tp = 1;
    loco_ttable tt;
    LOCO_CHECK(loco_gpt_build_table(&tt, &whole));
    const size_t P_all = tt.numel;
    loco_ttable_fini(&tt);
    const double block = loco_gpt_block_act_formula_for(&mc, B, cpT, sp, mode);
    const double kort = korthikanti(&mc, cpT, B, t, sp, mode);
    printf("loco bench memory --plan: %s, %.3fB parameters; mesh tp = %d%s x pp = %d (1F1B, %d "
           "micro-batches) x dp = %d (ZeRO-%d over dp x cp), cp = %lld; micro-batch %d x %d "
           "tokens (%d per cp rank); recompute %s; fp32 parameters, gradients and AdamW\n\n",
           path, P_all / 1e9, t, sp ? " + sp" : "", pp, m, (int)cfg->parallel.dp, stage_kind,
           (long long)cfg->parallel.cp, B, T, cpT, cfg->train.recompute);
    printf("| pp rank | blocks | params per rank | persistent GB (ZeRO formula) | activations GB "
           "per block, loco | Korthikanti GB per block | in flight | activations GB | total GB "
           "|\n|---|---|---|---|---|---|---|---|---|\n");
    for (int r = 0; r < pp; r++) {
        loco_gpt_stage st = {.n = 1, .slots = 1};
        st.first[0] = r * (L / pp);
        st.end[0] = (r + 1) * (L / pp);
        LOCO_CHECK(loco_gpt_build_stage_table(&tt, &mc, &st));
        const size_t P = tt.numel;
        loco_ttable_fini(&tt);
        const double persistent = loco_zero_formula_bytes(stage_kind, P, dp);
        const int in_flight = pp - r < m ? pp - r : m; /* 1F1B's warm-up depth */
        const double acts = block * (L / pp) * in_flight;
        printf("| %d | %d-%d | %.1fM | %.2f | %.3f | %.3f | %d | %.2f | %.2f |\n", r, st.first[0],
               st.end[0] - 1, P / 1e6, GB(persistent), GB(block), GB(kort), in_flight, GB(acts),
               GB(persistent + acts));
    }
    printf("\nNot counted: the head's logits (B x T x V/t floats on the last stage, %.2f GB), "
           "the pipeline's send/receive buffers, the allocator's tables, and everything a GPU "
           "run adds (bf16 copies, the cuBLASLt workspace).\n",
           GB(4.0 * B * cpT * ((double)loco_gpt_vocab_padded(&mc) / t)));
    return 0;
}
