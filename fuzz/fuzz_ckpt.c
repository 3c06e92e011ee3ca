/* libFuzzer target: a checkpoint's state.json (its fields, layout, stage
 * list and shard manifest) on arbitrary bytes, beside the real
 * config.ini and safetensors files of a small checkpoint (ckpt_seed.h).
 * Whatever the bytes: loco_ckpt_verify gives 0 or LOCO_EPROTO, nothing read
 * out of bounds (ASan), nothing leaked; loco_ckpt_load refuses
 * what verify refuses and, refusing, leaves the model and optimizer untouched; the state.json the
 * checkpoint was written with verifies and loads. Seeds: fuzz/corpus/ckpt
 * (gen_corpus: that state.json, and sharded and pipelined variants). */
#include <stdlib.h>
#include <string.h>

#include "fuzz/ckpt_seed.h"
#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char ck[128];
static void *orig; /* the state.json written with the checkpoint */
static size_t orig_len;
static loco_config cfg;
static loco_gpt *m;
static size_t n; /* parameters */
static loco_adamw opt;
static float *before; /* params, then m and v of the optimizer */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[160];
    if (!orig) {
        snprintf(ck, sizeof ck, "%s/ckpt", fuzz_dir());
        snprintf(path, sizeof path, "%s/state.json", ck);
        if (fuzz_ckpt_write(ck) || loco_file_read(path, &orig, &orig_len))
            abort();
        snprintf(path, sizeof path, "%s/config.ini", ck);
        loco_config_defaults(&cfg);
        if (loco_config_load(&cfg, path))
            abort();
        const loco_gpt_config mc = loco_gpt_config_from(&cfg);
        if (loco_gpt_create(&m, &mc, 1, 4))
            abort();
        n = loco_gpt_num_params(m);
        if (loco_adamw_init(&opt, n, &cfg))
            abort();
        before = malloc(3 * n * sizeof *before);
        if (!before)
            abort();
        for (size_t i = 0; i < 3 * n; i++)
            before[i] = (float)i;
    }
    const size_t bytes = n * sizeof *before;
    memcpy(loco_gpt_params(m), before, bytes);
    memcpy(opt.m, before + n, bytes);
    memcpy(opt.v, before + 2 * n, bytes);
    fuzz_write(ck, "state.json", data, size, path, sizeof path);
    char why[256];
    const int rc = loco_ckpt_verify(ck, why, sizeof why);
    if (rc != 0 && rc != LOCO_EPROTO)
        abort();
    const bool same = size == orig_len && !memcmp(data, orig, size);
    if (same && rc != 0) {
        fprintf(stderr, "fuzz_ckpt: the checkpoint's own state.json: %s\n", why);
        abort();
    }
    loco_ckpt_state st;
    const int lrc = loco_ckpt_load(ck, &cfg, m, &opt, &st);
    /* verify checks the optimizer only when state.json lists it; load
     * with an optimizer needs it: load may refuse what verify passed. */
    if ((lrc == 0 && rc != 0) || (same && lrc != 0)) {
        fprintf(stderr, "fuzz_ckpt: verify %d (%s), load %d (%s)\n", rc, why, lrc, loco_errmsg());
        abort(); /* load took what verify refused */
    }
    if (lrc != 0 && (memcmp(loco_gpt_params(m), before, bytes) || memcmp(opt.m, before + n, bytes) ||
                     memcmp(opt.v, before + 2 * n, bytes)))
        abort(); /* a refused checkpoint touched the model or the optimizer */
    loco_err_clear();
    return 0;
}
