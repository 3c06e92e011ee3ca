/* The sharded device model (ZeRO-3, loco_gpt_cuda_create_sharded) against
 * the whole one, in one process: the trainer's gathers replaced by hooks
 * that bind every unit to a device copy of the whole model's weights.
 *
 *   passes: the loss and every gradient equal to the whole model's to the
 *     bit (the same kernels on the same weights, fp32 and bf16), and the
 *     hooks called in zero.c's order: forward acquires 0, 1..L, L+1;
 *     backward acquires 0 and L+1, then grads_ready(L+1), each block's
 *     acquire and grads_ready from L down to 1, grads_ready(0).
 *   ranged update: AdamW on the owned range of the shard equal to the
 *     whole model's AdamW there, the owned weights in the passes' type
 *     refreshed (and their version bumped).
 *   refusals: a pass with no binding, the whole-model clip on a shard,
 *     ranges outside the held one, binding on a whole model.
 *   the ZeRO plan: the device model's units plan the same buckets,
 *     counts and owned ranges as the CPU model's (the host executor's),
 *     ZeRO 0, 1 and 3 over dp 1-4, and a shard made for a plan's owned
 *     range holds it (what train_device.c executes and checks at start).
 *
 * Without a device or a CUDA build the tests skip with the reason. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if !defined(LOCO_HAVE_CUDA)
Test(gpu_sharded, skipped) {
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): the device model not "
                 "compiled");
}
#else

#include "inner/model/model.h"
#include "inner/optim/optim.h"
#include "inner/parallel/parallel.h"
#include "tests/gpu/gpu_test.h"

static const loco_gpt_config cfg = {
    .n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = 8, .vocab_size = 97};
enum { B = 2, T = 8, N = B * T, MAX_CALLS = 64 };

typedef struct {
    loco_gpt_cuda *g;
    const unsigned char *w; /* the whole model's weights, passes' type (device) */
    float *grads;           /* whole-model-sized unit gradients (device) */
    size_t es;
    int calls[MAX_CALLS], n;
} binder;

static int acquire(void *ctx, int unit, bool backward) {
    binder *b = ctx;
    if (b->n < MAX_CALLS)
        b->calls[b->n++] = (backward ? 100 : 0) + unit;
    size_t lo, hi;
    loco_gpt_cuda_unit_range(b->g, unit, &lo, &hi);
    return loco_gpt_cuda_bind_unit(b->g, unit, b->w + lo * b->es,
                                   backward ? b->grads + lo : NULL);
}

static int grads_ready(void *ctx, int unit) {
    binder *b = ctx;
    if (b->n < MAX_CALLS)
        b->calls[b->n++] = 200 + unit;
    return 0;
}

static void batch(int32_t *in, int32_t *tg) {
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)((i * 37 + 11) % cfg.vocab_size);
        tg[i] = (int32_t)((i * 53 + 5) % cfg.vocab_size);
    }
}

static void check_passes(bool bf16) {
    gpu_require();
    loco_gpt *cpu = NULL; /* the initial weights */
    cr_assert_eq(loco_gpt_create(&cpu, &cfg, B, T), 0, "%s", loco_errmsg());
    loco_rng rng;
    loco_rng_seed(&rng, 11);
    loco_gpt_init_weights(cpu, &rng);
    const size_t P = loco_gpt_num_params(cpu), lo = P / 3, hi = 2 * P / 3, es = bf16 ? 2 : 4;
    int32_t in[N], tg[N];
    batch(in, tg);

    loco_gpt_cuda *whole, *shard;
    GPU_OK(loco_gpt_cuda_create(&whole, &cfg, B, T, bf16));
    GPU_OK(loco_gpt_cuda_create_sharded(&shard, &cfg, B, T, bf16, lo, hi));
    size_t hl, hh;
    loco_gpt_cuda_shard(shard, &hl, &hh, NULL, NULL);
    cr_assert(hl == lo && hh == hi, "holds [%zu, %zu), asked [%zu, %zu)", hl, hh, lo, hi);
    GPU_OK(loco_gpt_cuda_upload(whole, loco_gpt_params(cpu), NULL, NULL));
    GPU_OK(loco_gpt_cuda_upload(shard, loco_gpt_params(cpu) + lo, NULL, NULL));

    /* a pass before any binding is refused, naming the unit */
    float loss_s = 0, loss_w = 0;
    cr_expect_eq(loco_gpt_cuda_forward(shard, in, tg, B, T, &loss_s), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "unit 0 has no weights bound"), "%s", loco_errmsg());

    gpu_env env;
    gpu_env_init(&env, P * (4 + 4 + es) + 4096);
    float *dparams = dup_to_dev(&env, loco_gpt_params(cpu), P * 4);
    unsigned char *w = bf16 ? dalloc(&env, P * 2) : (unsigned char *)dparams;
    if (bf16)
        GPU_OK(loco_cuda_cast_bf16((loco_bf16 *)w, dparams, P, NULL));
    binder b = {.g = shard, .w = w, .grads = dalloc(&env, P * 4), .es = es};
    GPU_OK(loco_cuda_zero(b.grads, P * 4, NULL));
    loco_gpt_cuda_hooks h = {.ctx = &b, .acquire = acquire, .grads_ready = grads_ready};
    loco_gpt_cuda_set_hooks(shard, &h);

    GPU_OK(loco_gpt_cuda_zero_grad(whole));
    GPU_OK(loco_gpt_cuda_forward_backward(whole, in, tg, B, T, 1.0f, &loss_w));
    GPU_OK(loco_gpt_cuda_zero_grad(shard));
    GPU_OK(loco_gpt_cuda_forward_backward(shard, in, tg, B, T, 1.0f, &loss_s));
    cr_expect_eq(loss_s, loss_w, "loss: sharded %.9g, whole %.9g", loss_s, loss_w);

    const int L = cfg.n_layer;
    int want[MAX_CALLS], n = 0;
    for (int u = 0; u <= L + 1; u++)
        want[n++] = u;
    want[n++] = 100;
    want[n++] = 100 + L + 1;
    want[n++] = 200 + L + 1;
    for (int u = L; u >= 1; u--) {
        want[n++] = 100 + u;
        want[n++] = 200 + u;
    }
    want[n++] = 200;
    cr_expect_eq(b.n, n, "%d hook calls, want %d", b.n, n);
    for (int i = 0; i < n && i < b.n; i++)
        cr_expect_eq(b.calls[i], want[i], "hook call %d: %d, want %d", i, b.calls[i], want[i]);

    float *gw = malloc(P * 4), *gs = malloc(P * 4);
    cr_assert(gw && gs);
    GPU_OK(loco_gpt_cuda_download(whole, NULL, gw, NULL, NULL));
    GPU_OK(loco_cuda_copy(gs, b.grads, P * 4, NULL));
    size_t differ = 0;
    for (size_t i = 0; i < P; i++)
        differ += memcmp(&gw[i], &gs[i], 4) != 0;
    cr_expect_eq(differ, 0, "%zu of %zu gradients differ from the whole model's", differ, P);

    /* AdamW on the owned range: the shard's gradients are the whole's
     * there (what the reduce-scatter leaves on one rank) */
    float *sp, *sg;
    loco_gpt_cuda_state(shard, &sp, &sg, NULL, NULL, NULL);
    GPU_OK(loco_cuda_copy(sg, b.grads + lo, (hi - lo) * 4, NULL));
    loco_config c;
    loco_config_defaults(&c);
    loco_adamw ow, os;
    cr_assert_eq(loco_adamw_init(&ow, P, &c), 0);
    cr_assert_eq(loco_adamw_init(&os, hi - lo, &c), 0);
    uint64_t v0, v1;
    loco_gpt_cuda_shard(shard, &hl, &hh, NULL, &v0);
    GPU_OK(loco_gpt_cuda_adamw(whole, &ow, 1e-2f));
    GPU_OK(loco_gpt_cuda_adamw_range(shard, &os, 1e-2f, lo, hi));
    GPU_OK(loco_gpt_cuda_upload(shard, NULL, NULL, NULL));
    const void *wshard;
    loco_gpt_cuda_shard(shard, &hl, &hh, &wshard, &v1);
    cr_expect_gt(v1, v0, "the weights' version did not move after a refresh");
    float *pw = malloc(P * 4), *ps = malloc((hi - lo) * 4);
    unsigned char *ws = malloc((hi - lo) * es), *ww = malloc(P * es);
    cr_assert(pw && ps && ws && ww);
    GPU_OK(loco_gpt_cuda_download(whole, pw, NULL, NULL, NULL));
    GPU_OK(loco_gpt_cuda_download(shard, ps, NULL, NULL, NULL));
    cr_expect_eq(memcmp(pw + lo, ps, (hi - lo) * 4), 0, "AdamW on the owned range differs");
    cr_expect_eq(os.t, 1, "opt.t %lld after one ranged update", (long long)os.t);
    /* the owned weights in the passes' type: the refreshed parameters */
    GPU_OK(loco_cuda_copy(ws, wshard, (hi - lo) * es, NULL));
    if (bf16) {
        GPU_OK(loco_cuda_cast_bf16((loco_bf16 *)w, sp, hi - lo, NULL));
        GPU_OK(loco_cuda_copy(ww, w, (hi - lo) * 2, NULL));
    } else {
        memcpy(ww, ps, (hi - lo) * 4);
    }
    cr_expect_eq(memcmp(ws, ww, (hi - lo) * es), 0, "the owned weights were not refreshed");

    /* refusals */
    double norm;
    cr_expect_eq(loco_gpt_cuda_clip(shard, 1.0, &norm), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "clips by range"), "%s", loco_errmsg());
    double ss;
    cr_expect_eq(loco_gpt_cuda_grad_sumsq(shard, 0, hi, &ss), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "outside the held"), "%s", loco_errmsg());
    cr_expect_eq(loco_gpt_cuda_bind_unit(whole, 1, w, NULL), LOCO_EINVAL);
    cr_expect_eq(loco_gpt_cuda_create_sharded(&(loco_gpt_cuda *){NULL}, &cfg, B, T, bf16, hi, lo),
                 LOCO_EINVAL);

    cr_log_info("%s sharded [%zu, %zu) of %zu: loss %.7f (whole %.7f), %d hook calls",
                bf16 ? "bf16" : "fp32", lo, hi, P, loss_s, loss_w, b.n);
    free(gw), free(gs), free(pw), free(ps), free(ws), free(ww);
    loco_adamw_fini(&ow);
    loco_adamw_fini(&os);
    loco_gpt_cuda_destroy(whole);
    loco_gpt_cuda_destroy(shard);
    gpu_env_fini(&env);
    loco_gpt_destroy(cpu);
}

/* The plan of a model's units (unit_range: the CPU's or the device's). */
static void plan_of(loco_zero_plan *p, size_t P, const size_t *bounds, int dp, int rank,
                    int stage, size_t bucket) {
    const loco_zero_plan_spec s = {.n_params = P, .n_units = cfg.n_layer + 2, .unit_lo = bounds,
                                   .dp = dp, .rank = rank, .stage = stage,
                                   .bucket_elems = bucket, .unit_buffers = stage >= 2};
    cr_assert_eq(loco_zero_plan_init(p, &s), 0, "%s", loco_errmsg());
}

Test(gpu_sharded, device_units_plan_as_the_host, .timeout = 240) {
    gpu_require();
    loco_gpt *cpu;
    cr_assert_eq(loco_gpt_create(&cpu, &cfg, B, T), 0, "%s", loco_errmsg());
    loco_gpt_cuda *whole;
    GPU_OK(loco_gpt_cuda_create(&whole, &cfg, B, T, false));
    const int n = cfg.n_layer + 2;
    size_t hb[8], db[8], a, b, P; /* n <= 4 units */
    loco_gpt_cuda_state(whole, NULL, NULL, NULL, NULL, &P);
    cr_assert_eq(P, loco_gpt_num_params(cpu));
    for (int u = 0; u < n; u++) {
        loco_gpt_unit_range(cpu, u, &a, &b);
        hb[u] = a, hb[u + 1] = b;
        loco_gpt_cuda_unit_range(whole, u, &a, &b);
        db[u] = a, db[u + 1] = b;
    }
    static const int stages[] = {0, 1, 3};
    static const size_t buckets[] = {1, 500, 3000, 1u << 20};
    for (int dp = 1; dp <= 4; dp++)
        for (int si = 0; si < 3; si++)
            for (int bi = 0; bi < 4; bi++) {
                const int rank = dp - 1;
                loco_zero_plan host, dev;
                plan_of(&host, P, hb, dp, rank, stages[si], buckets[bi]);
                plan_of(&dev, P, db, dp, rank, stages[si], buckets[bi]);
                if (!loco_zero_plan_equal(&host, &dev)) {
                    loco_zero_plan_print(&host, stderr);
                    loco_zero_plan_print(&dev, stderr);
                    cr_expect_fail("dp %d ZeRO-%d bucket %zu: the plans differ", dp, stages[si],
                                   buckets[bi]);
                }
                if (stages[si] == 3 && dp > 1) { /* the shard train_device.c makes */
                    loco_gpt_cuda *shard;
                    const size_t lo = dev.own[rank], hi = dev.own[rank + 1];
                    GPU_OK(loco_gpt_cuda_create_sharded(&shard, &cfg, B, T, false, lo, hi));
                    size_t hl, hh;
                    loco_gpt_cuda_shard(shard, &hl, &hh, NULL, NULL);
                    cr_expect(hl == lo && hh == hi, "holds [%zu, %zu), planned [%zu, %zu)", hl,
                              hh, lo, hi);
                    loco_gpt_cuda_destroy(shard);
                }
                loco_zero_plan_fini(&host);
                loco_zero_plan_fini(&dev);
            }
    loco_gpt_cuda_destroy(whole);
    loco_gpt_destroy(cpu);
}

Test(gpu_sharded, passes_and_update_f32, .timeout = 240) { check_passes(false); }
Test(gpu_sharded, passes_and_update_bf16, .timeout = 240) { check_passes(true); }

#endif
