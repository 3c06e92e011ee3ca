/* The Llama family through the meshes under mpirun, against one rank on
 * the same global batch: pipeline stages with an untied head, data
 * parallelism with ZeRO 3, recompute, context parallelism (RoPE at the
 * zig-zag rows' global positions; ring with grouped-query blocks, Ulysses
 * with key/value heads split over cp or, fewer than cp, replicated): the
 * losses of 6 steps within 1e-5 relative and the final parameters (both
 * checkpoints loaded whole through loco_ckpt_load_view) as
 * tests/support.h's test_expect_like_reference asks of GPT-2; tensor
 * parallelism with key/value heads split and replicated. The export to
 * Hugging Face's Llama layout against PyTorch and back through init_from.
 * Runs build/loco. */
#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "tests/support.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define LOCO "\"${LOCO_BIN:-build/loco}\""
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 -np "
#define STEPS 6
/* A Llama of four blocks: 4 query heads of 4 sharing 2 key/value heads,
 * SwiGLU of 24, an untied head. */
#define LLAMA                                                                                      \
    " --set model.arch=llama --set model.n_layer=4 --set model.n_head=4 --set model.n_kv_head=2"  \
    " --set model.n_embd=16 --set model.ffn_hidden=24 --set model.seq_len=16"                     \
    " --set model.rope_theta=10000 --set model.vocab_size=256 --set train.steps=6"                 \
    " --set train.warmup_steps=2 --set train.batch_size=2 --set run.threads=1"                     \
    " --set run.eval_every=0 --set run.log_every=100 --set run.ckpt_every=6"

static char *dir;

static void setup(void) {
    dir = test_tmpdir("loco-llama-mesh");
    test_mpi_session_dir(dir);
}

static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

TestSuite(llama_mesh, .init = setup, .fini = teardown);

/* DIR/RUN/ckpt_STEPS as the whole model's parameters (caller frees). */
static float *load_whole(const char *run, size_t *n) {
    char ck[4200], ini[4300];
    snprintf(ck, sizeof ck, "%s/%s/ckpt_%08d", dir, run, STEPS);
    snprintf(ini, sizeof ini, "%s/config.ini", ck);
    loco_config cfg;
    loco_config_defaults(&cfg);
    cr_assert_eq(loco_config_load(&cfg, ini), 0, "%s", loco_errmsg());
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    mc.tp = 1;
    loco_ttable tt;
    cr_assert_eq(loco_gpt_build_table(&tt, &mc), 0, "%s", loco_errmsg());
    float *p = malloc(tt.numel * sizeof(float));
    cr_assert_not_null(p);
    loco_ckpt_view v = {.tt = &tt, .model = mc, .params = p, .p_lo = 0, .p_hi = tt.numel};
    cr_assert_eq(loco_ckpt_load_view(ck, &cfg, &v, NULL), 0, "%s: %s", run, loco_errmsg());
    *n = tt.numel;
    loco_ttable_fini(&tt);
    return p;
}

static void run_ok(const char *cmd_fmt, ...) {
    static char cmd[4096], out[1 << 16];
    va_list ap;
    va_start(ap, cmd_fmt);
    vsnprintf(cmd, sizeof cmd, cmd_fmt, ap);
    va_end(ap);
    cr_assert_eq(test_run(out, sizeof out, "%s", cmd), 0, "%s\n%s", cmd, out);
}

/* ranks = pp x dp; m micro-batches per rank; against one rank of m x dp. */
static void check(int pp, const char *schedule, int dp, int zero, int m, const char *extra) {
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    run_ok(LOCO " train configs/tiny.ini" LLAMA " --set train.grad_accum=%d --set run.dir=%s/ref",
           m * dp, dir);
    run_ok(MPIRUN "%d " LOCO " train configs/tiny.ini" LLAMA
                  " --set train.grad_accum=%d --set parallel.pp=%d --set parallel.pp_schedule=%s"
                  " --set parallel.dp=%d --set parallel.zero_stage=%d --set run.dir=%s/mesh %s",
           pp * dp, m, pp, schedule, dp, zero, dir, extra);
    char what[256], a[4200], b[4200];
    snprintf(what, sizeof what, "llama pp=%d %s dp=%d zero=%d m=%d %s", pp, schedule, dp, zero, m,
             extra);
    double got[STEPS + 1] = {0}, ref[STEPS + 1] = {0};
    snprintf(a, sizeof a, "%s/mesh", dir);
    snprintf(b, sizeof b, "%s/ref", dir);
    test_read_losses(a, got, STEPS);
    test_read_losses(b, ref, STEPS);
    test_expect_losses(got, ref, 1, STEPS, what);
    size_t n1, n2;
    float *p = load_whole("mesh", &n1), *q = load_whole("ref", &n2);
    cr_assert_eq(n1, n2);
    double dd = 0, qq = 0, maxd = 0, maxq = 0;
    for (size_t i = 0; i < n1; i++) {
        const double d = (double)p[i] - q[i];
        dd += d * d, qq += (double)q[i] * q[i];
        maxd = fmax(maxd, fabs(d)), maxq = fmax(maxq, fabs((double)q[i]));
    }
    cr_expect(sqrt(dd / qq) <= 1e-5 && maxd / maxq <= 1e-4,
              "%s: final parameters differ by %g (relative L2), %g (largest element)", what,
              sqrt(dd / qq), maxd / maxq);
    free(p), free(q);
}

Test(llama_mesh, pp2_1f1b_untied_head_on_the_last_stage, .timeout = 240) {
    check(2, "1f1b", 1, 1, 4, "");
}

Test(llama_mesh, pp2_interleaved_with_full_recompute, .timeout = 240) {
    check(2, "interleaved", 1, 1, 4,
          "--set parallel.virtual_stages=2 --set train.recompute=full");
}

Test(llama_mesh, dp2_zero3, .timeout = 240) {
    check(1, "1f1b", 2, 3, 2, "");
}

/* `np` ranks of a mesh given by `mesh` (cp, tp, sp, dp ... with one
 * micro-batch each) against one rank of the same global batch; `model`
 * changes the model of both runs. */
static void check_mesh(int np, int ref_accum, const char *mesh, const char *model) {
    char what[512];
    snprintf(what, sizeof what, "%s %s", mesh, model);
    if (!test_have_mpirun())
        cr_skip_test("mpirun not found (apt-get install openmpi-bin)");
    run_ok(LOCO " train configs/tiny.ini" LLAMA
                " --set train.grad_accum=%d --set run.dir=%s/ref %s",
           ref_accum, dir, model);
    run_ok(MPIRUN "%d " LOCO " train configs/tiny.ini" LLAMA " --set run.dir=%s/mesh %s %s", np,
           dir, mesh, model);
    double got[STEPS + 1] = {0}, ref[STEPS + 1] = {0};
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/mesh", dir);
    snprintf(b, sizeof b, "%s/ref", dir);
    test_read_losses(a, got, STEPS);
    test_read_losses(b, ref, STEPS);
    test_expect_losses(got, ref, 1, STEPS, what);
    size_t n1, n2;
    float *p = load_whole("mesh", &n1), *q = load_whole("ref", &n2);
    cr_assert_eq(n1, n2);
    double dd = 0, qq = 0;
    for (size_t i = 0; i < n1; i++)
        dd += ((double)p[i] - q[i]) * ((double)p[i] - q[i]), qq += (double)q[i] * q[i];
    cr_expect(sqrt(dd / qq) <= 1e-5, "%s: final parameters differ by %g (relative L2)", what,
              sqrt(dd / qq));
    free(p), free(q);
}

static void check_cp(const char *algo, const char *model) {
    char mesh[128];
    snprintf(mesh, sizeof mesh,
             "--set parallel.cp=2 --set parallel.cp_algo=%s --set train.grad_accum=2", algo);
    check_mesh(2, 2, mesh, model);
}

Test(llama_mesh, cp2_ring_gqa, .timeout = 240) {
    check_cp("ring", "");
}

Test(llama_mesh, cp2_ulysses_kv_heads_split, .timeout = 240) {
    check_cp("ulysses", ""); /* 2 kv heads over 2 ranks */
}

Test(llama_mesh, cp2_ulysses_one_kv_head_replicated, .timeout = 240) {
    check_cp("ulysses", "--set model.n_kv_head=1");
}

/* `loco ckpt export` writes LlamaForCausalLM's layout; an independent
 * PyTorch Llama (tests/fixtures/make_llama_fixtures.py --load-check)
 * evaluates it to `loco eval`'s loss; train.init_from reads it back into
 * the checkpoint's exact parameters (lr 0: the step changes nothing). */
Test(llama_mesh, export_loads_in_pytorch_and_init_from_reads_it_back, .timeout = 240) {
    static char out[1 << 16];
    run_ok(LOCO " train configs/tiny.ini" LLAMA " --set run.dir=%s/ref", dir);
    run_ok(LOCO " ckpt export %s/ref/ckpt_%08d %s/hf", dir, STEPS, dir);
    int rc = test_run(out, sizeof out,
                      LOCO " eval configs/tiny.ini" LLAMA " --set train.batch_size=4"
                           " --ckpt %s/ref/ckpt_%08d --batches 1",
                      dir, STEPS);
    cr_assert_eq(rc, 0, "%s", out);
    const char *p = strstr(out, "\"val_loss\": ");
    cr_assert(p, "%s", out);
    const double eval_loss = atof(p + 12);
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0) {
        rc = test_run(out, sizeof out,
                      "/usr/bin/python3 tests/fixtures/make_llama_fixtures.py --load-check %s/hf"
                      " --tokens \"$(ls data/kjv_val_*.bin | head -n 1)\" -B 4 -T 16",
                      dir);
        cr_assert_eq(rc, 0, "%s", out);
        p = strstr(out, "T=16: ");
        cr_assert(p, "%s", out);
        const double torch_loss = atof(p + 6);
        cr_expect(fabs(torch_loss - eval_loss) <= 1e-4 * fabs(eval_loss),
                  "PyTorch loss %.6f, loco eval %.6f", torch_loss, eval_loss);
    } else {
        /* info, not warn: Criterion 2.4 ends a run that logged a warning with
         * status 1 */
        cr_log_info("skipped: PyTorch not installed (apt-get install python3-torch): "
                    "the export was not evaluated in PyTorch");
    }
    run_ok(LOCO " train configs/tiny.ini" LLAMA " --set train.init_from=%s/hf --set train.lr=0"
                " --set train.weight_decay=0 --set run.dir=%s/mesh",
           dir, dir);
    size_t n1, n2;
    float *a = load_whole("mesh", &n1), *b = load_whole("ref", &n2);
    cr_assert_eq(n1, n2);
    cr_expect(!memcmp(a, b, n1 * sizeof(float)), "init_from the export differs from the "
                                                  "checkpoint that was exported");
    free(a), free(b);
}

/* Megatron's splits with grouped-query attention: q, k and v heads each
 * split over tp (2 key/value heads over 2 ranks), SwiGLU's gate and up
 * each split by columns, the untied head by vocabulary rows. */
Test(llama_mesh, tp2_gqa_swiglu_untied_head, .timeout = 240) {
    check_mesh(2, 1, "--set parallel.tp=2", "");
}

Test(llama_mesh, tp2_sp_dp2_zero1, .timeout = 240) {
    check_mesh(4, 2, "--set parallel.tp=2 --set parallel.sp=true --set parallel.dp=2"
                     " --set parallel.zero_stage=1", "");
}

Test(llama_mesh, tp2_pp2_cp_ring, .timeout = 300) {
    check_mesh(8, 2, "--set parallel.tp=2 --set parallel.pp=2 --set train.grad_accum=2"
                     " --set parallel.cp=2", "");
}

/* Fewer key/value heads than tp ranks: each replicated on the ranks whose
 * query heads read it (Megatron's), its gradient summed over them, counted
 * once in the clipping norm. */
Test(llama_mesh, tp4_two_kv_heads_replicated, .timeout = 240) {
    check_mesh(4, 1, "--set parallel.tp=4", "");
}

Test(llama_mesh, tp2_sp_one_kv_head_replicated_zero2, .timeout = 240) {
    check_mesh(4, 2, "--set parallel.tp=2 --set parallel.sp=true --set parallel.dp=2"
                     " --set parallel.zero_stage=2", "--set model.n_kv_head=1");
}

/* `loco bench memory --plan` for Llama 3 8B at tp = 4 + sp, dp = 64,
 * ZeRO-1: one rank holds 1/4 of the 8,029,995,008 split parameters and all
 * 266,240 norm weights, 2,007,764,992 = 2007.8M; ZeRO-1 keeps 8P + 8P/64
 * bytes = 16,313,090,560 = 15.19 GiB. */
Test(llama_mesh, memory_plan_of_llama3_8b) {
    static char out[1 << 16];
    const int rc =
        test_run(out, sizeof out, LOCO " bench memory configs/llama3-8b.ini --plan");
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(strstr(out, "8.030B parameters"), "%s", out);
    cr_expect(strstr(out, "| 0 | 0-31 | 2007.8M | 15.19 |"), "%s", out);
}
