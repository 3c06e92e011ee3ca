/* The tokenizer as a user meets it: `loco tokenizer train|encode|decode`,
 * `loco prep --tokenizer`, a few training steps of configs/tiny-bpe.ini on
 * those shards, the tokenizer in the checkpoint, sample and eval with it,
 * and clear errors. Runs ${LOCO_BIN:-build/loco} from the repository root. */
#include "core/core.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define SMALL                                                                                      \
    " --set model.n_layer=1 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32"     \
    " --set train.batch_size=4 --set run.threads=1 --set run.eval_batches=2"

static char *dir;

static void setup(void) {
    dir = strdup("/tmp/loco-tokcli-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(tokenizer_cli, .init = setup, .fini = teardown, .timeout = 120);

Test(tokenizer_cli, train_prep_steps_sample_eval) {
    static char out[1 << 16];
    /* 200 kB of the default data: a 300-id vocabulary */
    int rc = test_run(out, sizeof out,
                      "head -c 200000 data/kjv.txt > %s/kjv.txt && " LOCO
                      " tokenizer train %s/kjv.txt --vocab 300 --out %s/tok.json",
                      dir, dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "300 ids (43 merges)"), "%s", out);
    /* encode | decode gives the bytes back */
    rc = test_run(out, sizeof out,
                  "printf 'In the beginning\\377 <|endoftext|> ok' > %s/s.txt && " LOCO
                  " tokenizer encode --tokenizer %s/tok.json %s/s.txt > %s/s.ids && " LOCO
                  " tokenizer decode --tokenizer %s/tok.json %s/s.ids | cmp - %s/s.txt && "
                  "grep -c ' 299 ' %s/s.ids",
                  dir, dir, dir, dir, dir, dir, dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    /* prep: uint16 shards, <|endoftext|> first, the tokenizer beside them */
    rc = test_run(out, sizeof out,
                  LOCO " prep %s/kjv.txt %s/bpe --tokenizer %s/tok.json --shard-tokens 65536", dir,
                  dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "vocab 300, uint16") && strstr(out, "prep: encoded"), "%s", out);
    char path[600];
    snprintf(path, sizeof path, "%s/bpe_train_000000.bin", dir);
    void *shard;
    size_t len;
    cr_assert_eq(loco_file_read(path, &shard, &len), 0);
    const uint8_t *b = shard;
    cr_expect_eq(b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, LOCO_SHARD_MAGIC_U16);
    cr_expect_eq(b[1024] | b[1025] << 8, 299, "first id is <|endoftext|>");
    loco_free(shard);
    /* a few steps of tiny-bpe on them; the checkpoint keeps the tokenizer */
    const char *sets = " --set data.train=%s/bpe_train_*.bin --set data.val=%s/bpe_val_*.bin"
                       " --set data.tokenizer=%s/bpe_tokenizer.json --set model.vocab_size=300";
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             LOCO " train configs/tiny-bpe.ini" SMALL "%s"
                  " --set train.steps=3 --set run.dir=%s/run --set run.ckpt_every=3",
             sets, dir);
    rc = test_run(out, sizeof out, cmd, dir, dir, dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    snprintf(cmd, sizeof cmd, "cmp %s/bpe_tokenizer.json %s/run/ckpt_00000003/tokenizer.json", dir,
             dir);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    rc = test_run(out, sizeof out,
                  LOCO " sample --ckpt %s/run/ckpt_00000003 --prompt 'And God said' --tokens 8",
                  dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "And God said"), "%s", out);
    snprintf(cmd, sizeof cmd,
             LOCO " eval configs/tiny-bpe.ini" SMALL "%s"
                  " --ckpt %s/run/ckpt_00000003 --batches 2",
             sets, dir);
    rc = test_run(out, sizeof out, cmd, dir, dir, dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    double loss = 0, npb = 0;
    long long tokens = 0, bytes = 0;
    const char *j = strstr(out, "{\"val_loss\"");
    cr_assert(j, "%s", out);
    cr_assert_eq(sscanf(j,
                        "{\"val_loss\": %lf, \"tokens\": %lld, \"bytes\": %lld, "
                        "\"nats_per_byte\": %lf}",
                        &loss, &tokens, &bytes, &npb),
                 4, "%s", out);
    cr_expect_eq(tokens, 2 * 4 * 32);
    cr_expect(bytes > tokens * 3 / 2, "%lld bytes for %lld BPE tokens", bytes, tokens);
    cr_expect(fabs(npb - loss * (double)tokens / (double)bytes) < 1e-4, "%s", out);
    /* shards whose ids exceed model.vocab_size are refused clearly */
    snprintf(cmd, sizeof cmd,
             LOCO " train configs/tiny-bpe.ini" SMALL
                  " --set data.train=%s/bpe_train_*.bin --set data.val=%s/bpe_val_*.bin"
                  " --set data.tokenizer=%s/bpe_tokenizer.json"
                  " --set model.vocab_size=256 --set train.steps=1 --set run.dir=%s/run2",
             dir, dir, dir, dir);
    rc = test_run(out, sizeof out, cmd, dir, dir, dir, dir);
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "bpe_train_000000.bin") && strstr(out, ">= vocab_size 256"), "%s", out);
}

Test(tokenizer_cli, bad_tokenizer_file) {
    static char out[8192];
    int rc = test_run(out, sizeof out,
                      "printf '{\"model\": {\"type\": \"Unigram\"}}' > %s/bad.json && " LOCO
                      " prep configs/tiny.ini %s/x --tokenizer %s/bad.json",
                      dir, dir, dir);
    cr_expect_eq(rc, 1, "%s", out);
    cr_expect(strstr(out, "bad.json: model.type is \"Unigram\"; expected \"BPE\""), "%s", out);
    rc = test_run(out, sizeof out, LOCO " tokenizer train configs/tiny.ini --vocab 10 --out x");
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(strstr(out, "--vocab expects an integer in 258.."), "%s", out);
}

/* A tokenizer path that cannot be read stops the run before its first
 * step, not at its first checkpoint (which would lose the training). */
Test(tokenizer_cli, unreadable_tokenizer_fails_before_training) {
    static char out[1 << 14];
    int rc = test_run(out, sizeof out,
                      LOCO " train configs/tiny.ini" SMALL " --set train.steps=2 --set run.dir=%s/run"
                           " --set data.tokenizer=%s/absent.json",
                      dir, dir);
    cr_expect_neq(rc, 0, "%s", out);
    cr_expect(strstr(out, "data.tokenizer = ") && strstr(out, "absent.json: cannot read it"), "%s",
              out);
    cr_expect(!strstr(out, "step     1/"), "a step ran before the error:\n%s", out);
}
