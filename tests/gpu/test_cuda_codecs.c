/* The codecs' CUDA twins (kernels/cuda/quant.cu) against kernels/cpu/quant.c:
 * byte-identical payloads and error-feedback state for every codec, block
 * size, rounding mode and layout, and bit-identical dequantize-accumulate;
 * the same for the top-k codec (kernels/cuda/topk.cu).
 * Skips, with the reason, without a device or a CUDA build. */
#include <criterion/criterion.h>

#ifndef LOCO_HAVE_CUDA
Test(gpu_codecs, skipped)
{
    cr_skip_test("built without the CUDA toolkit (no nvcc found by make): "
                 "GPU codecs not compiled");
}
#else

#include "compress/compress.h"
#include "tests/gpu/gpu_test.h"

/* Values over many magnitudes per block: some blocks all zero, some tiny
 * (flushed or subnormal after scaling), some large. */
static float *codec_input(uint64_t *s, size_t n, int block)
{
    float *x = rand_f(s, n, 1.0);
    for (size_t i = 0; i < n; i++) {
        const size_t b = i / (size_t)block;
        switch (b % 5) {
        case 1: x[i] = 0.0f; break;
        case 2: x[i] *= 1e-38f; break;
        case 3: x[i] *= 3e4f; break;
        case 4: x[i] *= (float)(gpu_splitmix(s) % 1000) * 1e-6f; break;
        default: break;
        }
    }
    return x;
}

static void check_codec(loco_codec_kind k, size_t n, int block, bool stochastic, bool use_ef,
                        bool planes, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, 64 << 20);
    uint64_t s = seed;
    float *x = codec_input(&s, n, block);
    float *ef = use_ef ? rand_f(&s, n, 1e-3) : NULL;
    float *ef_gpu = use_ef ? copy_f(ef, n) : NULL;
    const loco_quant_args a = {.block = block, .stochastic = stochastic, .planes = planes,
                               .key = 0x0123456789abcdefull ^ seed};
    const size_t pb = loco_quant_payload_bytes(loco_codec_format(k), n, block);
    uint8_t *want = calloc(pb + 1, 1), *got = calloc(pb + 1, 1);
    const int rc = loco_quant(loco_codec_format(k), want, x, ef, n, &a);
    cr_assert_eq(rc, 0, "CPU quant %s: %s", loco_codec_name(k), loco_errmsg());

    void *d_x = dup_to_dev(&e, x, n * 4);
    void *d_ef = use_ef ? dup_to_dev(&e, ef_gpu, n * 4) : NULL;
    uint8_t *d_pay = dalloc(&e, pb + 1);
    uint32_t *d_bad = dalloc(&e, 4), bad = 7;
    /* odd address: payloads have any alignment */
    GPU_OK(loco_cuda_quant(loco_codec_format(k), d_pay + 1, d_x, d_ef, n, &a, d_bad, NULL));
    to_host(got, d_pay + 1, pb);
    to_host(&bad, d_bad, 4);
    cr_expect_eq(bad, 0, "finite input flagged");
    const char *what = loco_codec_name(k);
    size_t first = pb;
    for (size_t i = 0; i < pb && first == pb; i++)
        if (got[i] != want[i])
            first = i;
    cr_expect_eq(first, pb,
                 "%s n=%zu block=%d sr=%d ef=%d planes=%d: payload differs at byte %zu of %zu "
                 "(gpu %02x, cpu %02x)",
                 what, n, block, stochastic, use_ef, planes, first, pb,
                 first < pb ? got[first] : 0, first < pb ? want[first] : 0);
    if (use_ef) {
        float *gef = malloc(n * 4);
        to_host(gef, d_ef, n * 4);
        cr_expect_eq(memcmp(gef, ef, n * 4), 0, "%s: error feedback differs", what);
        free(gef);
    }

    /* dequantize-accumulate the CPU's payload on both */
    float *dst = rand_f(&s, n, 1.0);
    void *d_dst = dup_to_dev(&e, dst, n * 4);
    uint8_t *d_in = dup_to_dev(&e, want, pb + 1);
    GPU_OK(loco_cuda_dequant_acc(loco_codec_format(k), d_dst, d_in, n, block, planes, 0.37f, NULL));
    loco_dequant_acc(loco_codec_format(k), dst, want, n, block, planes, 0.37f);
    float *gdst = malloc(n * 4);
    to_host(gdst, d_dst, n * 4);
    cr_expect_eq(memcmp(gdst, dst, n * 4), 0, "%s n=%zu block=%d: dequant-acc differs", what, n,
                 block);
    free(x), free(ef), free(ef_gpu), free(want), free(got), free(dst), free(gdst);
    gpu_env_fini(&e);
}

static void sweep(loco_codec_kind k, uint64_t seed)
{
    const size_t ns[] = {1, 37, 4096, 20011};
    const int blocks[] = {32, 136, 4096};
    const bool layout = k == LOCO_CODEC_NONE || k == LOCO_CODEC_BF16;
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
        for (size_t j = 0; j < sizeof blocks / sizeof *blocks; j++)
            for (int v = 0; v < (layout ? 8 : 4); v++)
                check_codec(k, ns[i], blocks[j], v & 1, v & 2, v & 4,
                            seed + 100 * i + 10 * j + (uint64_t)v);
}

Test(gpu_codecs, none) { sweep(LOCO_CODEC_NONE, 1000); }
Test(gpu_codecs, bf16) { sweep(LOCO_CODEC_BF16, 2000); }
Test(gpu_codecs, int8) { sweep(LOCO_CODEC_INT8, 3000); }
Test(gpu_codecs, int4) { sweep(LOCO_CODEC_INT4, 4000); }
Test(gpu_codecs, fp8) { sweep(LOCO_CODEC_FP8, 5000); }
Test(gpu_codecs, fp4) { sweep(LOCO_CODEC_FP4, 6000); }

/* The top-k twins: payload bytes and EF of loco_cuda_topk_quant equal
 * loco_topk_quant's (both index layouts, every value width, ties, with and
 * without EF), and the dequantize-accumulate bit-identical. */
static void check_topk(size_t n, size_t k, int bits, bool use_ef, bool ties, uint64_t seed)
{
    gpu_env e;
    gpu_env_init(&e, 64 << 20);
    uint64_t s = seed;
    float *x = rand_f(&s, n, 1.0);
    if (ties)
        for (size_t i = 0; i < n; i++)
            x[i] = (float)((int)(gpu_splitmix(&s) % 7) - 3);
    float *ef = use_ef ? rand_f(&s, n, 1e-3) : NULL;
    float *ef_gpu = use_ef ? copy_f(ef, n) : NULL;
    const size_t pb = loco_topk_payload_bytes(n, k, bits);
    cr_assert_gt(pb, 0);
    uint8_t *want = calloc(pb + 1, 1), *got = calloc(pb + 1, 1);
    cr_assert_eq(loco_topk_quant(want, x, ef, n, k, bits), 0);
    void *d_x = dup_to_dev(&e, x, n * 4);
    void *d_ef = use_ef ? dup_to_dev(&e, ef_gpu, n * 4) : NULL;
    uint8_t *d_pay = dalloc(&e, pb + 1);
    void *d_work = dalloc(&e, loco_topk_work_bytes(k));
    uint32_t *d_bad = dalloc(&e, 4), bad = 7;
    /* odd address: payloads have any alignment */
    GPU_OK(loco_cuda_topk_quant(d_pay + 1, d_x, d_ef, n, k, bits, d_work, d_bad, NULL));
    to_host(got, d_pay + 1, pb);
    to_host(&bad, d_bad, 4);
    cr_expect_eq(bad, 0, "finite input flagged");
    size_t first = pb;
    for (size_t i = 0; i < pb && first == pb; i++)
        if (got[i] != want[i])
            first = i;
    cr_expect_eq(first, pb,
                 "topk n=%zu k=%zu bits=%d ef=%d ties=%d: payload differs at byte %zu of %zu "
                 "(gpu %02x, cpu %02x)",
                 n, k, bits, use_ef, ties, first, pb, first < pb ? got[first] : 0,
                 first < pb ? want[first] : 0);
    if (use_ef) {
        float *gef = malloc(n * 4);
        to_host(gef, d_ef, n * 4);
        cr_expect_eq(memcmp(gef, ef, n * 4), 0, "topk n=%zu k=%zu: error feedback differs", n, k);
        free(gef);
    }
    float *dst = rand_f(&s, n, 1.0);
    void *d_dst = dup_to_dev(&e, dst, n * 4);
    uint8_t *d_in = dup_to_dev(&e, want, pb + 1);
    GPU_OK(loco_cuda_topk_dequant_acc(d_dst, d_in, n, 0.37f, NULL));
    loco_topk_dequant_acc(dst, want, n, 0.37f);
    float *gdst = malloc(n * 4);
    to_host(gdst, d_dst, n * 4);
    cr_expect_eq(memcmp(gdst, dst, n * 4), 0, "topk n=%zu k=%zu bits=%d: dequant-acc differs", n,
                 k, bits);
    free(x), free(ef), free(ef_gpu), free(want), free(got), free(dst), free(gdst);
    gpu_env_fini(&e);
}

Test(gpu_codecs, topk)
{
    /* 20011 is no multiple of the tile (4096) nor of a byte */
    const size_t ns[] = {1, 37, 4096, 20011};
    uint64_t seed = 7000;
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        const size_t n = ns[i];
        const size_t ks[] = {1, (n + 99) / 100, n / 2 ? n / 2 : 1, n};
        for (size_t j = 0; j < sizeof ks / sizeof *ks; j++)
            for (int bits = 2; bits <= 8; bits *= 2)
                for (int v = 0; v < 4; v++)
                    check_topk(n, ks[j], bits, v & 1, v & 2, seed++);
    }
}

Test(gpu_codecs, topk_nonfinite_is_flagged)
{
    gpu_env e;
    gpu_env_init(&e, 1 << 20);
    float x[300];
    for (size_t i = 0; i < 300; i++)
        x[i] = (float)i;
    x[211] = NAN;
    void *d_x = dup_to_dev(&e, x, sizeof x);
    uint8_t *d_pay = dalloc(&e, 4 * 300 + 64);
    void *d_work = dalloc(&e, loco_topk_work_bytes(3));
    uint32_t *d_bad = dalloc(&e, 4), bad = 0;
    GPU_OK(loco_cuda_topk_quant(d_pay, d_x, NULL, 300, 3, 2, d_work, d_bad, NULL));
    to_host(&bad, d_bad, 4);
    cr_expect_eq(bad, 1, "NaN not flagged");
    cr_expect_eq(loco_cuda_topk_quant(d_pay, d_x, NULL, 300, 0, 2, d_work, d_bad, NULL),
                 LOCO_EINVAL);
    cr_expect_eq(loco_cuda_topk_quant(d_pay, d_x, NULL, 300, 3, 3, d_work, d_bad, NULL),
                 LOCO_EINVAL);
    gpu_env_fini(&e);
}

Test(gpu_codecs, nonfinite_is_flagged)
{
    gpu_env e;
    gpu_env_init(&e, 1 << 20);
    const size_t n = 300;
    float x[300];
    for (size_t i = 0; i < n; i++)
        x[i] = (float)i;
    x[211] = INFINITY;
    const loco_quant_args a = {.block = 64};
    void *d_x = dup_to_dev(&e, x, sizeof x);
    uint8_t *d_pay = dalloc(&e, 4 * n + 64);
    uint32_t *d_bad = dalloc(&e, 4);
    for (int k = 0; k < LOCO_CODEC_TOPK; k++) {
        uint32_t bad = 0;
        GPU_OK(loco_cuda_quant(loco_codec_format((loco_codec_kind)k), d_pay, d_x, NULL, n, &a,
                               d_bad, NULL));
        to_host(&bad, d_bad, 4);
        cr_expect_eq(bad, 1, "%s: infinity not flagged", loco_codec_name((loco_codec_kind)k));
    }
    cr_expect_eq(
        loco_cuda_quant(loco_codec_format(LOCO_CODEC_COUNT), d_pay, d_x, NULL, n, &a, d_bad, NULL),
        LOCO_EINVAL);
    gpu_env_fini(&e);
}

#endif /* LOCO_HAVE_CUDA */
