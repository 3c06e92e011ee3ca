/* Plain DiLoCo in one process, the reference the multi-site tests hold
 * the islands to: K trainers, the outer step code of outer/, the encoded
 * bytes handed over in memory. Included by one test file each. */
#ifndef LOCO_TESTS_DILOCO_REFERENCE_H
#define LOCO_TESTS_DILOCO_REFERENCE_H

#include "inner/train/train.h"
#include "outer/outer.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define DILOCO_MAX_ISLANDS 8

/* Every outer.H steps of cfg's train.steps; returns θ_global (every
 * parameter: one rank per island owns it all) and, when sent is not NULL,
 * the encoded bytes island k sent at outer step s in sent[k][s]. With
 * batch not NULL, island k trains at batch[k] sequences per micro-batch
 * and, under outer.weighting = tokens, counts in the average in
 * proportion to its tokens (H x batch x seq_len x grad_accum). */
/* The same with accum not NULL: island k accumulates accum[k]
 * micro-batches per step. */
static float *diloco_reference_sites(loco_config *cfg, int K, const int64_t *batch,
                                     const int64_t *accum, size_t *n_params,
                                     size_t (*sent)[DILOCO_MAX_ISLANDS]) {
    char dir[] = "/tmp/loco-ref-XXXXXX";
    cr_assert(mkdtemp(dir));
    snprintf(cfg->run.dir, sizeof cfg->run.dir, "%s", dir);
    loco_log_set_level(LOCO_LOG_WARN);
    loco_outer_params p;
    loco_codec_params cp;
    cr_assert_eq(loco_outer_params_from_config(&p, cfg), 0);
    cr_assert_eq(loco_codec_params_from_config(&cp, cfg), 0);
    loco_trainer *t[DILOCO_MAX_ISLANDS];
    loco_outer *o[DILOCO_MAX_ISLANDS];
    size_t lo, hi;
    double tokens[DILOCO_MAX_ISLANDS];
    for (int k = 0; k < K; k++) {
        loco_config island = *cfg;
        if (batch)
            island.train.batch_size = batch[k];
        if (accum)
            island.train.grad_accum = accum[k];
        tokens[k] = (double)island.outer.H * (double)island.train.batch_size *
                    (double)island.model.seq_len * (double)island.train.grad_accum;
        cr_assert_eq(loco_trainer_create_island(&t[k], &island, NULL, k, K), 0, "%s",
                     loco_errmsg());
        float *own = loco_trainer_owned_params(t[k], &lo, &hi);
        cr_assert_eq(loco_outer_create(&o[k], &p, &cp, hi - lo, own), 0);
    }
    unsigned char *msg[DILOCO_MAX_ISLANDS] = {0};
    size_t len[DILOCO_MAX_ISLANDS];
    const int H = (int)cfg->outer.H;
    for (int outer = 1; outer <= cfg->train.steps / H; outer++) {
        for (int k = 0; k < K; k++) {
            for (int s = 0; s < H; s++)
                cr_assert_eq(loco_trainer_step(t[k], NULL), 0, "%s", loco_errmsg());
            const void *b;
            float *own = loco_trainer_owned_params(t[k], &lo, &hi);
            cr_assert_eq(loco_outer_encode(o[k], own, outer, &b, &len[k], NULL), 0);
            msg[k] = realloc(msg[k], len[k]);
            memcpy(msg[k], b, len[k]);
            if (sent)
                sent[k][outer] = len[k] * (size_t)(K - 1);
        }
        for (int k = 0; k < K; k++) {
            loco_outer_begin_average(o[k], K);
            if (!strcmp(cfg->outer.weighting, "tokens"))
                cr_assert_eq(loco_outer_set_weights(o[k], tokens), 0, "%s", loco_errmsg());
            for (int j = 0; j < K; j++)
                cr_assert_eq(loco_outer_add(o[k], msg[j], len[j]), 0);
            cr_assert_eq(loco_outer_apply(o[k], loco_trainer_owned_params(t[k], &lo, &hi)), 0);
        }
    }
    for (int k = 0; k < K; k++)
        free(msg[k]);
    *n_params = hi - lo;
    float *theta = malloc(*n_params * sizeof(float));
    memcpy(theta, loco_outer_theta(o[0]), *n_params * sizeof(float));
    const uint64_t h0 = loco_outer_hash(o[0]);
    for (int k = 0; k < K; k++) {
        cr_expect_eq(loco_outer_hash(o[k]), h0);
        loco_outer_destroy(o[k]);
        loco_trainer_destroy(t[k]);
    }
    loco_rmtree(dir);
    return theta;
}

static inline float *diloco_reference_batches(loco_config *cfg, int K, const int64_t *batch,
                                              size_t *n_params,
                                              size_t (*sent)[DILOCO_MAX_ISLANDS]) {
    return diloco_reference_sites(cfg, K, batch, NULL, n_params, sent);
}

static inline float *diloco_reference(loco_config *cfg, int K, size_t *n_params,
                               size_t (*sent)[DILOCO_MAX_ISLANDS]) {
    return diloco_reference_batches(cfg, K, NULL, n_params, sent);
}

#endif
