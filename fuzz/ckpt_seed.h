/* The checkpoint fuzz_ckpt reads and gen_corpus takes its seeds from: a
 * two-block model of 8 dims, its weights from a fixed seed. */
#ifndef LOCO_FUZZ_CKPT_SEED_H
#define LOCO_FUZZ_CKPT_SEED_H

#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"

/* Writes the checkpoint to dir (a fresh directory name). 0 or an error. */
static int fuzz_ckpt_write(const char *dir) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 8;
    cfg.model.seq_len = 4, cfg.model.vocab_size = 16;
    const loco_gpt_config mc = loco_gpt_config_from(&cfg);
    loco_gpt *m;
    loco_adamw opt;
    LOCO_CHECK(loco_gpt_create(&m, &mc, 1, 4));
    int rc = loco_adamw_init(&opt, loco_gpt_num_params(m), &cfg);
    if (rc < 0) {
        loco_gpt_destroy(m);
        return rc;
    }
    loco_rng rng;
    loco_rng_seed(&rng, 3);
    loco_gpt_init_weights(m, &rng);
    static const char *const sec[] = {"model", NULL};
    const loco_ckpt_state st = {
        .step = 5, .data = {1, 64, 0}, .rng = rng, .model_hash = loco_config_hash(&cfg, sec)};
    rc = loco_ckpt_save(dir, &cfg, m, &opt, &st);
    loco_adamw_fini(&opt);
    loco_gpt_destroy(m);
    return rc;
}

#endif
