/* Streaming DiLoCo's fragment map over real tables (dense, MoE, a pipeline
 * stage, ZeRO shards): a partition of the owned range with the strided
 * assignment, and gather/merge against plain loops. */
#include "inner/model/model.h"
#include "inner/parallel/parallel.h"
#include "inner/train/train.h"
#include "outer/outer.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { L = 4 };

static loco_gpt_config small_model(int n_experts) {
    return (loco_gpt_config){.n_layer = L,
                             .n_head = 2,
                             .n_embd = 8,
                             .seq_len = 8,
                             .vocab_size = 16,
                             .n_experts = n_experts,
                             .top_k = 1,
                             .moe_every = 2,
                             .capacity_factor = 1.25f};
}

/* The expected fragment of tensor t, written out from the rule. */
static int expected(const loco_tensor *t, int F) {
    int l;
    if (sscanf(t->name, "transformer.h.%d.", &l) == 1)
        return l % F;
    if (strstr(t->name, "ln_f"))
        return (L - 1) % F;
    cr_assert(strstr(t->name, ".wte.") || strstr(t->name, ".wpe."), "unexpected %s", t->name);
    return 0;
}

/* The fragment of every element of [lo, hi), from the table alone. */
static int *expected_map(const loco_ttable *tt, int F, size_t lo, size_t hi) {
    int *m = malloc((hi - lo + 1) * sizeof *m);
    for (int i = 0; i < tt->n; i++)
        for (size_t e = tt->t[i].offset; e < tt->t[i].offset + tt->t[i].numel; e++)
            if (e >= lo && e < hi)
                m[e - lo] = expected(&tt->t[i], F);
    return m;
}

/* The plan of [lo, hi) partitions it as the rule says: every element in
 * exactly one interval of its fragment, ascending and coalesced, packed
 * offsets in buffer order per fragment. */
static void check_plan(const loco_ttable *tt, int F, size_t lo, size_t hi) {
    loco_fragments fr;
    cr_assert_eq(loco_fragments_plan(&fr, F, L, tt, lo, hi), 0, "%s", loco_errmsg());
    cr_assert_eq(fr.F, F);
    cr_assert_eq(fr.n, hi - lo);
    int *want = expected_map(tt, F, lo, hi);
    int *seen = calloc(hi - lo + 1, sizeof *seen);
    size_t next_packed[LOCO_MAX_FRAGMENTS] = {0}, sum = 0;
    for (int i = 0; i < fr.n_iv; i++) {
        const loco_frag_interval *v = &fr.iv[i];
        cr_assert(v->len > 0 && v->lo + v->len <= fr.n);
        cr_assert(v->frag >= 0 && v->frag < F);
        if (i) {
            const loco_frag_interval *p = &fr.iv[i - 1];
            cr_assert(p->lo + p->len <= v->lo, "intervals %d, %d out of order", i - 1, i);
            cr_assert(p->frag != v->frag || p->lo + p->len != v->lo, "not coalesced at %d", i);
        }
        cr_assert_eq(v->packed, next_packed[v->frag]);
        next_packed[v->frag] += v->len;
        for (size_t e = v->lo; e < v->lo + v->len; e++) {
            seen[e]++;
            cr_assert_eq(v->frag, want[e], "element %zu: fragment %d, expected %d", lo + e, v->frag,
                         want[e]);
        }
    }
    for (size_t e = 0; e < hi - lo; e++)
        cr_assert_eq(seen[e], 1, "element %zu covered %d times", lo + e, seen[e]);
    for (int f = 0; f < F; f++) {
        cr_assert_eq(fr.n_f[f], next_packed[f]);
        sum += fr.n_f[f];
    }
    for (int f = F; f < LOCO_MAX_FRAGMENTS; f++)
        cr_assert_eq(fr.n_f[f], 0);
    cr_assert_eq(sum, hi - lo);
    free(want);
    free(seen);
    loco_fragments_fini(&fr);
}

Test(fragments, strided_by_name) {
    cr_assert_eq(loco_fragment_of("transformer.h.3.attn.c_attn.weight", 2, L), 1);
    cr_assert_eq(loco_fragment_of("transformer.h.3.attn.c_attn.weight", 4, L), 3);
    cr_assert_eq(loco_fragment_of("transformer.h.2.mlp.experts.1.c_fc.weight", 2, L), 0);
    cr_assert_eq(loco_fragment_of("transformer.h.1.ln_1.bias", 4, L), 1);
    cr_assert_eq(loco_fragment_of("transformer.wte.weight", 4, L), 0);
    cr_assert_eq(loco_fragment_of("transformer.wpe.weight", 4, L), 0);
    cr_assert_eq(loco_fragment_of("transformer.ln_f.weight", 4, L), 3);
    cr_assert_eq(loco_fragment_of("transformer.ln_f.bias", 2, L), 1);
    cr_assert_eq(loco_fragment_of("transformer.ln_f.bias", 3, L), 0); /* block 3 -> 3 % 3 */
    cr_assert_eq(loco_fragment_of("lm_head.weight", 4, L), 3);
    cr_assert_eq(loco_fragment_of("something.else", 4, L), 0);
    cr_assert_eq(loco_fragment_of("transformer.h.4.ln_1.weight", 2, L), LOCO_EINVAL);
    cr_assert_eq(loco_fragment_of("transformer.h.0.ln_1.weight", 5, L), LOCO_EINVAL);
}

Test(fragments, whole_tables_partition_as_the_rule_says) {
    for (int moe = 0; moe < 2; moe++) {
        loco_gpt_config mc = small_model(moe ? 4 : 0);
        loco_ttable tt;
        cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0, "%s", loco_errmsg());
        cr_assert_eq(loco_ttable_find(&tt, "transformer.h.3.mlp.experts.2.c_fc.weight") >= 0, moe);
        for (int F = 1; F <= L; F *= 2)
            check_plan(&tt, F, 0, tt.numel);
        check_plan(&tt, 3, 0, tt.numel);
        loco_ttable_fini(&tt);
    }
}

/* ZeRO shards cut tensors anywhere; the pieces still follow their tensor. */
Test(fragments, zero_shards_cut_tensors) {
    loco_gpt_config mc = small_model(0);
    loco_ttable tt;
    cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0);
    const loco_tensor *a = &tt.t[loco_ttable_find(&tt, "transformer.h.1.attn.c_attn.weight")];
    const loco_tensor *b = &tt.t[loco_ttable_find(&tt, "transformer.h.2.mlp.c_fc.weight")];
    for (int F = 1; F <= L; F *= 2) {
        check_plan(&tt, F, a->offset + 5, b->offset + 7);
        for (int r = 0; r < 3; r++) {
            size_t lo, hi;
            loco_zero_owned(tt.numel, r, 3, &lo, &hi);
            check_plan(&tt, F, lo, hi);
        }
    }
    /* Inside one tensor: one fragment, contiguous; the others empty. */
    loco_fragments fr;
    cr_assert_eq(loco_fragments_plan(&fr, 4, L, &tt, a->offset + 3, a->offset + 9), 0);
    cr_assert_eq(fr.n_iv, 1);
    cr_assert_eq(fr.n_f[1], 6);
    size_t at = 99;
    cr_assert(loco_fragments_contiguous(&fr, 1, &at));
    cr_assert_eq(at, 0);
    cr_assert(loco_fragments_contiguous(&fr, 2, &at));
    cr_assert_eq(at, 0);
    loco_fragments_fini(&fr);
    cr_assert_eq(loco_fragments_plan(&fr, 2, L, &tt, 0, tt.numel), 0);
    cr_assert_not(loco_fragments_contiguous(&fr, 0, &at));
    cr_assert_not(loco_fragments_contiguous(&fr, 1, &at));
    loco_fragments_fini(&fr);
    loco_ttable_fini(&tt);
}

/* The last stage's table: blocks 2-3, ln_f, then the tied head's wte copy,
 * which moves with the embeddings (fragment 0) and is no fragment's on the
 * other stage. */
Test(fragments, pipeline_stage_with_tied_copy) {
    loco_gpt_config mc = small_model(0);
    loco_gpt_stage st = {.n = 1, .first = {2}, .end = {L}, .slots = 1};
    loco_ttable tt;
    cr_assert_eq(loco_gpt_build_stage_table(&tt, &mc, &st), 0, "%s", loco_errmsg());
    cr_assert_str_eq(tt.t[tt.n - 1].name, "transformer.wte.weight");
    check_plan(&tt, 2, 0, tt.numel);
    loco_fragments fr;
    cr_assert_eq(loco_fragments_plan(&fr, 4, L, &tt, 0, tt.numel), 0);
    cr_assert_eq(fr.n_f[1], 0); /* blocks 0 and 1 are on the first stage */
    cr_assert_eq(fr.n_f[0], tt.t[tt.n - 1].numel);
    cr_assert_eq(fr.iv[fr.n_iv - 1].frag, 0);
    loco_fragments_fini(&fr);
    loco_ttable_fini(&tt);
}

Test(fragments, one_fragment_is_one_interval) {
    loco_ttable tt;
    loco_ttable_init(&tt);
    const char *names[] = {"lm_head.weight", "transformer.h.1.x", "odd", "transformer.ln_f.w"};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(loco_ttable_add(&tt, names[i], 1, (int64_t[]){3 + i}, -1, false), 0);
    for (size_t lo = 0; lo < 4; lo += 3) {
        loco_fragments fr;
        cr_assert_eq(loco_fragments_plan(&fr, 1, L, &tt, lo, tt.numel), 0, "%s", loco_errmsg());
        cr_assert_eq(fr.n_iv, 1);
        cr_assert_eq(fr.iv[0].lo, 0);
        cr_assert_eq(fr.iv[0].len, tt.numel - lo);
        cr_assert_eq(fr.iv[0].packed, 0);
        cr_assert_eq(fr.n_f[0], tt.numel - lo);
        size_t at = 99;
        cr_assert(loco_fragments_contiguous(&fr, 0, &at));
        cr_assert_eq(at, 0);
        loco_fragments_fini(&fr);
    }
    loco_ttable_fini(&tt);
}

Test(fragments, bad_counts_and_ranges_refused) {
    loco_gpt_config mc = small_model(0);
    loco_ttable tt;
    cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0);
    loco_fragments fr;
    const int bad[] = {0, -1, L + 1, LOCO_MAX_FRAGMENTS + 1};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(loco_fragments_plan(&fr, bad[i], L, &tt, 0, tt.numel), LOCO_EINVAL);
        cr_assert_null(fr.iv);
        loco_fragments_fini(&fr);
    }
    cr_assert_eq(loco_fragments_plan(&fr, 2, L, &tt, 0, tt.numel + 1), LOCO_EINVAL);
    cr_assert_eq(loco_fragments_plan(&fr, 2, L, &tt, 5, 4), LOCO_EINVAL);
    /* A table with a block the model does not have. */
    cr_assert_eq(loco_fragments_plan(&fr, 2, L - 1, &tt, 0, tt.numel), LOCO_EINVAL);
    cr_assert_null(fr.iv);
    loco_fragments_fini(&fr);
    loco_ttable_fini(&tt);
}

/* Gather packs fragment f in buffer order; merge puts it back (alpha = 0:
 * bit for bit, -0.0 included) or mixes it, and leaves other fragments be. */
Test(fragments, gather_merge_round_trip) {
    loco_gpt_config mc = small_model(4);
    loco_ttable tt;
    cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0);
    const size_t lo = tt.numel / 7, hi = tt.numel - tt.numel / 5, n = hi - lo;
    float *own = malloc(n * sizeof *own), *copy = malloc(n * sizeof *own);
    float *packed = malloc(n * sizeof *own), *ref = malloc(n * sizeof *own);
    loco_rng r;
    loco_rng_seed(&r, 7);
    for (int F = 1; F <= L; F *= 2) {
        loco_fragments fr;
        cr_assert_eq(loco_fragments_plan(&fr, F, L, &tt, lo, hi), 0);
        int *want = expected_map(&tt, F, lo, hi);
        for (int f = 0; f < F; f++) {
            for (size_t i = 0; i < n; i++)
                own[i] = i % 11 == 0 ? 0.0f : loco_rng_normal(&r);
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (want[i] == f)
                    ref[k++] = own[i];
            cr_assert_eq(k, fr.n_f[f]);
            loco_fragments_gather(&fr, f, own, packed);
            cr_assert_arr_eq(packed, ref, k * sizeof(float));
            /* A received fragment with -0.0 where own holds +0.0. */
            for (size_t j = 0; j < k; j++)
                packed[j] = j % 3 == 0 ? -0.0f : loco_rng_normal(&r);
            memcpy(copy, own, n * sizeof *own);
            loco_fragments_merge(&fr, f, packed, own, 0.5f);
            for (size_t i = 0, j = 0; i < n; i++) {
                const float x = want[i] == f ? 0.5f * copy[i] + 0.5f * packed[j++] : copy[i];
                cr_assert_eq(memcmp(&own[i], &x, sizeof x), 0, "F=%d f=%d element %zu", F, f, i);
            }
            memcpy(own, copy, n * sizeof *own);
            loco_fragments_merge(&fr, f, packed, own, 0.0f);
            for (size_t i = 0, j = 0; i < n; i++) {
                const float *x = want[i] == f ? &packed[j++] : &copy[i];
                cr_assert_eq(memcmp(&own[i], x, sizeof *x), 0, "F=%d f=%d element %zu", F, f, i);
            }
            loco_fragments_gather(&fr, f, own, ref);
            cr_assert_arr_eq(ref, packed, k * sizeof(float));
        }
        free(want);
        loco_fragments_fini(&fr);
    }
    free(own);
    free(copy);
    free(packed);
    free(ref);
    loco_ttable_fini(&tt);
}

/* The trainer's table describes its flat buffer: with one rank the owned
 * range is all of it. */
Test(fragments, trainer_param_table_covers_the_owned_range, .timeout = 60) {
    char *dir = test_tmpdir("loco-frag");
    loco_config cfg;
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 32, cfg.model.seq_len = 32;
    cfg.train.batch_size = 4;
    cfg.run.threads = 1;
    snprintf(cfg.run.dir, sizeof cfg.run.dir, "%s", dir);
    loco_log_set_level(LOCO_LOG_WARN);
    loco_trainer *t;
    cr_assert_eq(loco_trainer_create(&t, &cfg, NULL), 0, "%s", loco_errmsg());
    size_t lo, hi;
    cr_assert_not_null(loco_trainer_owned_params(t, &lo, &hi));
    const loco_ttable *tt = loco_trainer_param_table(t);
    cr_assert_eq(lo, 0);
    cr_assert_eq(tt->numel, hi - lo);
    cr_assert_eq(tt->numel, loco_gpt_num_params(loco_trainer_model(t)));
    loco_fragments fr;
    cr_assert_eq(loco_fragments_plan(&fr, 2, 2, tt, lo, hi), 0, "%s", loco_errmsg());
    cr_assert_eq(fr.n_f[0] + fr.n_f[1], hi - lo);
    loco_fragments_fini(&fr);
    loco_trainer_destroy(t);
    loco_rmtree(dir);
    free(dir);
}
