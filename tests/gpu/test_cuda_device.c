/* Which GPU a rank uses (loco_cuda_select_local_device: the launcher's
 * local rank modulo the device count) and the outer loop's device mode
 * called from a thread other than the one that created it (the exchange's
 * sender thread): its calls must go to the creator's device, not to the
 * device 0 a new thread starts on. With one GPU every choice is device 0,
 * so there the selection checks reduce to the rule's arithmetic, the
 * errors and the get/set round trip; the emulator (tests/gpu/emu) runs
 * them with LOCO_EMU_DEVICES emulated devices, which these tests ask for
 * (a real GPU ignores the variable). Skips, with the reason, without a
 * device or a CUDA build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_device, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "no device selection to check");
}
#else

#include <pthread.h>

#include "outer/outer.h"
#include "tests/gpu/gpu_test.h"

static const char *const vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                   "SLURM_LOCALID", "LOCAL_RANK"};
enum { NVARS = sizeof vars / sizeof *vars };

/* No launcher variable set; `emu` devices on the emulator. */
static void clean_env(const char *emu)
{
    for (int i = 0; i < NVARS; i++)
        unsetenv(vars[i]);
    setenv("LOCO_EMU_DEVICES", emu, 1);
}

static int devices(void)
{
    int n = 0;
    GPU_OK(loco_cuda_device_count(&n));
    cr_assert_gt(n, 0);
    return n;
}

/* Selects with fallback rank `fb`, expects `want`, made current. */
static void expect_select(int fb, int want, const char *what)
{
    int dev = -7, cur = -7;
    GPU_OK(loco_cuda_select_local_device(fb, &dev));
    cr_expect_eq(dev, want, "%s: device %d, expected %d", what, dev, want);
    GPU_OK(loco_cuda_get_device(&cur));
    cr_expect_eq(cur, dev, "%s: device %d selected but %d current", what, dev, cur);
}

Test(gpu_device, select_follows_local_rank)
{
    clean_env("3");
    gpu_require();
    const int n = devices();
    if (n == 1)
        cr_log_info("one device: every local rank maps to device 0");
    char buf[32], what[96];
    /* each variable alone, local ranks below, at and above the count */
    for (int i = 0; i < NVARS; i++) {
        const int ks[] = {0, 1, 2, n, n + 1, 2 * n + 1, 7};
        for (size_t j = 0; j < sizeof ks / sizeof *ks; j++) {
            snprintf(buf, sizeof buf, "%d", ks[j]);
            setenv(vars[i], buf, 1);
            snprintf(what, sizeof what, "%s=%s, %d device(s)", vars[i], buf, n);
            expect_select(0, ks[j] % n, what);
        }
        unsetenv(vars[i]);
    }
    /* the first variable set wins; an empty one counts as unset */
    snprintf(buf, sizeof buf, "%d", n + 1);
    setenv("LOCAL_RANK", buf, 1);
    setenv("SLURM_LOCALID", "0", 1);
    expect_select(0, 0, "SLURM_LOCALID before LOCAL_RANK");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", buf, 1);
    expect_select(0, (n + 1) % n, "OMPI_COMM_WORLD_LOCAL_RANK before the others");
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "", 1);
    expect_select(0, 0, "an empty OMPI_COMM_WORLD_LOCAL_RANK skipped");
    /* no variable: the rank given */
    clean_env("3");
    for (int fb = 0; fb < 2 * n + 2; fb++)
        expect_select(fb, fb % n, "no launcher variable");
}

Test(gpu_device, bad_local_rank_is_a_clear_error)
{
    /* checked before any device is touched: runs without one too */
    const char *bad[] = {"x", "-1", "1x", "2.5", "99999999999999999999"};
    for (size_t j = 0; j < sizeof bad / sizeof *bad; j++) {
        clean_env("3");
        setenv("SLURM_LOCALID", bad[j], 1);
        int dev = 5;
        cr_expect_eq(loco_cuda_select_local_device(0, &dev), LOCO_EINVAL, "SLURM_LOCALID=%s",
                     bad[j]);
        cr_expect_eq(dev, -1);
        cr_expect(strstr(loco_errmsg(), "SLURM_LOCALID") && strstr(loco_errmsg(), bad[j]),
                  "the message names the variable and its value: %s", loco_errmsg());
    }
    clean_env("3");
    int dev = 5;
    cr_expect_eq(loco_cuda_select_local_device(-1, &dev), LOCO_EINVAL, "a negative rank");
}

Test(gpu_device, no_device_is_a_clear_error)
{
    clean_env("1");
    int n = 0;
    if (loco_cuda_device_count(&n) == 0)
        cr_skip_test("a device is present: the failure path cannot be taken");
    int dev = 5;
    cr_expect_eq(loco_cuda_select_local_device(0, &dev), LOCO_ECUDA);
    cr_expect_eq(dev, -1);
    cr_expect(strstr(loco_errmsg(), "no CUDA device") != NULL, "%s", loco_errmsg());
}

Test(gpu_device, set_get_round_trip)
{
    clean_env("3");
    gpu_require();
    const int n = devices();
    for (int d = n - 1; d >= 0; d--) {
        int cur = -7;
        GPU_OK(loco_cuda_set_device(d));
        GPU_OK(loco_cuda_get_device(&cur));
        cr_expect_eq(cur, d);
    }
    cr_expect_eq(loco_cuda_set_device(n), LOCO_ECUDA, "device %d of %d", n, n);
    cr_expect(strstr(loco_errmsg(), "cudaSetDevice") != NULL, "%s", loco_errmsg());
    /* the failure is not sticky: the thread stays on its device */
    int cur = -7;
    GPU_OK(loco_cuda_get_device(&cur));
    cr_expect_eq(cur, 0);
    GPU_OK(loco_cuda_set_device(0));
}

/* ------------------------------------------ the outer loop on a thread */

enum { N = 3000, CHUNK = 1024 }; /* 3 chunks, the last one short */

typedef struct {
    loco_outer *o;
    float *tl; /* device θ_local */
    unsigned char *b[4];
    size_t len[4], nc;
    int dev_before, dev_after, rc, at;
    char msg[512]; /* the thread's loco_errmsg (it is per thread) */
} job;

/* One outer step of one island on this thread, as the exchange's threads
 * run it: plan, encode, add its own chunks, apply. No assertion here
 * (Criterion asserts on the test's thread): the first failure is kept. */
static void *island_step(void *arg)
{
    job *j = arg;
#define STEP(call)                                                                           \
    do {                                                                                     \
        j->at = __LINE__;                                                                    \
        if ((j->rc = (call)) < 0) {                                                          \
            snprintf(j->msg, sizeof j->msg, "%s", loco_errmsg());                            \
            return NULL;                                                                     \
        }                                                                                    \
    } while (0)
    STEP(loco_cuda_get_device(&j->dev_before));
    STEP(loco_outer_plan(j->o, j->tl, 1, &j->nc));
    if (j->nc > 4) {
        j->rc = LOCO_EINVAL;
        snprintf(j->msg, sizeof j->msg, "%zu chunks planned, 4 expected at most", j->nc);
        return NULL;
    }
    for (size_t c = 0; c < j->nc; c++) {
        const void *b;
        STEP(loco_outer_encode_chunk(j->o, 0, c, &b, &j->len[c]));
        j->b[c] = malloc(j->len[c]);
        memcpy(j->b[c], b, j->len[c]);
    }
    loco_outer_begin_average(j->o, 1);
    for (size_t c = 0; c < j->nc; c++)
        STEP(loco_outer_add_chunk(j->o, 0, 0, j->b[c], j->len[c]));
    STEP(loco_outer_apply(j->o, j->tl));
    STEP(loco_cuda_get_device(&j->dev_after));
#undef STEP
    return NULL;
}

Test(gpu_device, outer_calls_follow_the_creating_thread)
{
    clean_env("2");
    gpu_require();
    const int n = devices(), target = n - 1;
    if (n == 1)
        cr_log_info("one device: the thread starts on the creator's device already; this "
                    "checks the calls from another thread and the get/set round trip only");
    GPU_OK(loco_cuda_set_device(target));
    gpu_env e;
    gpu_env_init(&e, 1 << 20);
    loco_codec_params cp;
    loco_codec_params_default(&cp);
    cp.codec = LOCO_CODEC_INT8;
    cp.block = 64;
    cp.zstd = LOCO_ZSTD_AUTO; /* the sample of Δ is a device call too */
    cp.chunk_bytes = CHUNK * 4;
    cp.threads = 1;
    const loco_outer_params p = {.H = 1, .nesterov = true, .lr = 0.7f, .momentum = 0.9f};
    uint64_t s = 4242;
    float *theta0 = rand_f(&s, N, 1.0), *tl = copy_f(theta0, N), *g = rand_f(&s, N, 1e-2);
    for (size_t i = 0; i < N; i++)
        tl[i] -= g[i];
    loco_outer *h = NULL;
    job j = {.dev_before = -7, .dev_after = -7};
    GPU_OK(loco_outer_create(&h, &p, &cp, N, theta0));
    GPU_OK(loco_outer_create_device(&j.o, &p, &cp, N, dup_to_dev(&e, theta0, N * 4)));
    j.tl = dup_to_dev(&e, tl, N * 4);
    GPU_OK(loco_cuda_sync(NULL));

    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, island_step, &j), 0);
    pthread_join(th, NULL);
    cr_assert_eq(j.rc, 0, "the outer step on another thread failed (line %d): %s", j.at, j.msg);
    cr_expect_eq(j.dev_before, 0, "a new thread starts on device 0, not %d", j.dev_before);
    cr_expect_eq(j.dev_after, target, "the thread's outer calls ran on device %d, created on %d",
                 j.dev_after, target);

    /* the reference: the host path on this thread, the same bits */
    size_t nc = 0;
    GPU_OK(loco_outer_plan(h, tl, 1, &nc));
    cr_assert_eq(nc, j.nc);
    loco_outer_begin_average(h, 1);
    for (size_t c = 0; c < nc; c++) {
        const void *b;
        size_t len;
        GPU_OK(loco_outer_encode_chunk(h, 0, c, &b, &len));
        cr_expect(len == j.len[c] && memcmp(b, j.b[c], len) == 0, "chunk %zu: bytes differ", c);
        GPU_OK(loco_outer_add_chunk(h, 0, 0, b, len));
    }
    GPU_OK(loco_outer_apply(h, tl));
    float *got = down_f(j.tl, N);
    EXPECT_SAME_BITS("θ_local", got, tl, N);
    EXPECT_SAME_BITS("θ_global", loco_outer_theta(j.o), loco_outer_theta(h), N);
    EXPECT_SAME_BITS("momentum", loco_outer_momentum(j.o), loco_outer_momentum(h), N);

    for (size_t c = 0; c < j.nc; c++)
        free(j.b[c]);
    free(got), free(theta0), free(tl), free(g);
    loco_outer_destroy(h);
    loco_outer_destroy(j.o);
    gpu_env_fini(&e);
}

#endif /* LOCO_HAVE_CUDA */
