/* The `loco` program as a user meets it: train, resume, eval, sample, prep
 * and config, and clear errors with exit status 1 or 2 on bad input. Runs
 * build/loco from the repository root (make test builds it first). */
#include "tests/support.h"
#include "core/core.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* The loco of the build under test (make asan sets LOCO_BIN). */
#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define SMALL                                                                                      \
    " --set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32"    \
    " --set train.batch_size=4 --set run.threads=1 --set run.eval_batches=2"

static char *dir;

static void setup(void) {
    dir = strdup("/tmp/loco-cli-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

static void write_file(const char *path, const char *text) {
    cr_assert_eq(loco_file_write_sync(path, text, strlen(text)), 0);
}

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 120);

Test(cli, train_resume_eval_sample) {
    static char out[1 << 16];
    int rc = test_run(out, sizeof out,
                 LOCO " train configs/tiny.ini" SMALL " --set train.steps=6 --set run.dir=%s"
                      " --set run.ckpt_every=3 --set run.log_every=2",
                 dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "step     2/6 | loss ") != NULL, "%s", out);
    cr_expect(strstr(out, "tok/s | ETA") != NULL);
    cr_expect(strstr(out, "val loss") != NULL);
    cr_expect(strstr(out, "unigram baseline") != NULL);

    rc = test_run(out, sizeof out,
             LOCO " train configs/tiny.ini" SMALL " --set train.steps=6 --set run.dir=%s/r2"
                  " --resume %s/ckpt_00000003",
             dir, dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "resumed from") != NULL, "%s", out);

    rc = test_run(out, sizeof out, LOCO " eval configs/tiny.ini" SMALL " --ckpt %s/ckpt_00000006 --batches 3",
             dir);
    cr_assert_eq(rc, 0, "%s", out);
    double loss = 0;
    long long tokens = 0;
    cr_expect_eq(sscanf(strstr(out, "{\"val_loss\""), "{\"val_loss\": %lf, \"tokens\": %lld}",
                        &loss, &tokens), 2, "%s", out);
    cr_expect(loss > 1 && loss < 6, "val loss %g", loss);
    cr_expect_eq(tokens, 3 * 4 * 32);

    rc = test_run(out, sizeof out, LOCO " sample --ckpt %s/ckpt_00000006 --prompt 'In the' --tokens 20",
             dir);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "In the") != NULL, "%s", out);
}

Test(cli, config_errors_name_file_line_key_and_expectation) {
    static char out[8192];
    char path[600];
    snprintf(path, sizeof path, "%s/bad.ini", dir);
    write_file(path, "[model]\nn_layer = 2\nn_head = many\n");
    cr_expect_eq(test_run(out, sizeof out, LOCO " train %s", path), 1);
    cr_expect(strstr(out, "bad.ini:3") && strstr(out, "model.n_head") &&
                  strstr(out, "expected an integer"),
              "%s", out);

    write_file(path, "[model]\nn_layers = 2\n");
    cr_expect_eq(test_run(out, sizeof out, LOCO " train %s", path), 1);
    cr_expect(strstr(out, "bad.ini:2") && strstr(out, "unknown key 'model.n_layers'"), "%s", out);

    write_file(path, "[modle]\nn_layer = 2\n");
    cr_expect_eq(test_run(out, sizeof out, LOCO " train %s", path), 1);
    cr_expect(strstr(out, "unknown section [modle]") != NULL, "%s", out);

    cr_expect_eq(test_run(out, sizeof out, LOCO " train configs/tiny.ini --set train.lr=-1"), 1);
    cr_expect(strstr(out, "--set train.lr=-1") && strstr(out, "expected a number in"), "%s", out);

    cr_expect_eq(test_run(out, sizeof out, LOCO " train %s/none.ini", dir), 1);
    cr_expect(strstr(out, "none.ini: cannot open config") != NULL, "%s", out);
}

Test(cli, bad_data_and_checkpoint_are_clear_errors) {
    static char out[8192];
    cr_expect_eq(test_run(out, sizeof out, LOCO " train configs/tiny.ini --set data.train=%s/x_*.bin",
                     dir),
                 1);
    cr_expect(strstr(out, "x_*.bin") != NULL, "%s", out);

    char path[600];
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    write_file(path, "this is not a token shard, its magic number is wrong......");
    cr_expect_eq(test_run(out, sizeof out, LOCO " train configs/tiny.ini --set data.train=%s", path), 1);
    cr_expect(strstr(out, "bad.bin") != NULL, "%s", out);

    cr_expect_eq(test_run(out, sizeof out, LOCO " eval configs/tiny.ini --ckpt %s/nothing", dir), 1);
    cr_expect(strstr(out, "not a complete checkpoint") != NULL, "%s", out);
}

Test(cli, usage_errors_exit_2) {
    static char out[8192];
    cr_expect_eq(test_run(out, sizeof out, LOCO " frobnicate"), 2);
    cr_expect_eq(test_run(out, sizeof out, LOCO " train"), 2);
    cr_expect_eq(test_run(out, sizeof out, LOCO " eval configs/tiny.ini --ckpt x --batches zero"), 2);
    cr_expect_eq(test_run(out, sizeof out, LOCO " sample --prompt hi"), 2);
}

Test(cli, config_help_lists_keys_and_docs_match) {
    static char out[1 << 16];
    cr_assert_eq(test_run(out, sizeof out, LOCO " config --help"), 0);
    cr_expect(strstr(out, "model.n_layer") && strstr(out, "run.ckpt_every"), "%s", out);
    cr_assert_eq(test_run(out, sizeof out, LOCO " config --markdown | cmp - docs/CONFIG.md"), 0,
                 "docs/CONFIG.md is stale: run `build/loco config --markdown > docs/CONFIG.md`");
}

Test(cli, prep_writes_shards_that_train) {
    static char out[1 << 16];
    char text[600];
    snprintf(text, sizeof text, "%s/t.txt", dir);
    char body[20000];
    for (int i = 0; i < 19999; i++)
        body[i] = "abcdefgh ij\n"[i % 12];
    body[19999] = '\0';
    write_file(text, body);
    cr_assert_eq(test_run(out, sizeof out, LOCO " prep %s %s/d/t --shard-tokens 4096", text, dir), 0,
                 "%s", out);
    cr_assert_eq(test_run(out, sizeof out,
                     LOCO " train configs/tiny.ini" SMALL " --set train.steps=2 --set run.dir=%s/r"
                          " --set data.train=%s/d/t_train_*.bin --set data.val=%s/d/t_val_*.bin",
                     dir, dir, dir),
                 0, "%s", out);
}
