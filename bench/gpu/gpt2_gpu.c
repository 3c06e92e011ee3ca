/* The GPU benchmarks of scripts/gpu-check.sh, with loco's kernels/cuda
 * twins; each prints a JSON summary line last (bench/pytorch_gpt2.py prints
 * PyTorch's references in the same form).
 *
 * --bench gpt2 (the default): GPT-2 training steps on one GPU, bf16, beside
 * PyTorch eager and torch.compile. The model is the trainer's own device
 * model (inner/model/gpt_cuda.c, loco_gpt_cuda: the CPU model's layouts and
 * order of kernels); fp32 master weights, gradients and AdamW state; bf16
 * weight copy, activations and activation gradients. Data: a learnable
 * synthetic token stream (the loss must fall, a cheap sanity check of the
 * whole backward), or an llm.c .bin shard (--data). Prints one line per
 * step, with --profile N the time per kind of kernel over N more steps,
 * and last {"impl": "loco", "graph": false, "tok_per_s": ..., "mfu": ...,
 * ...}. A step is the trainer's: zero_grad, forward_backward without a
 * host wait, loco_gpt_cuda_clip_adamw (no clip; its one wait reads the
 * loss). --graph on: the micro-step as a CUDA graph (train.cuda_graph);
 * --graph both: first the graph's steps and line ("graph": true), then
 * the plain ones (the last line, as without the option). MFU uses
 * loco_gpt_flops_per_token (6N + 12 L C T, as llm.c) and the device's
 * dense bf16 peak (--peak-tflops, default 989 for H100/H200 SXM).
 * --attention auto|tensor|reference: the model's attention kernel, as
 * train.attention (default auto, the trainer's default: the tensor-core
 * kernel at head size 64); the JSON line names the kernel that ran.
 * (Until 2026-12-04 the bench never chose, so its model ran the reference
 * kernel while the trainer's ran the tensor-core one.)
 * --recompute N: full activation recompute of the first N blocks
 * (train.recompute = full); the JSON line gives the blocks' activations
 * (act_mib) beside the whole device memory (device_mib).
 *
 * --bench attention: the fused causal attention, bf16, forward + backward,
 * both kernels (loco_cuda_attention_{fwd,bwd}_bf16, the reference, and
 * loco_cuda_attention_tc_{fwd,bwd}_bf16, the tensor cores: one line each,
 * "kernel": "reference" | "tensor") at --batch, --seq, --heads, --embd
 * (default B 16, T 1024, 12 heads of 64), beside PyTorch's
 * scaled_dot_product_attention: {"bench": "attention", "ms": ..,
 * "tflops": ..}, FLOPs counted as FlashAttention's benchmarks do (forward
 * 4 B NH T^2 hs / 2 when causal, backward 2.5 times the forward).
 *
 * --bench codecs: the pseudo-gradient codecs (kernels/cuda/quant.cu)
 * encoding with error feedback and decoding (dequant-acc) --elems floats
 * (default 2^27) in blocks of 128, beside a device-to-device cudaMemcpy of
 * the same floats: one line per codec and direction, {"bench": "codec",
 * "gbps": ..}, GB/s counting every byte read and written once.
 *
 * --bench versions: the CUDA runtime, driver API, cuBLASLt and NCCL
 * versions and the device, as one JSON line. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#ifdef LOCO_HAVE_NCCL
#include <nccl.h>
#endif

#include "compress/compress.h"
#include "core/core.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"
#include "kernels/kernels.h"

typedef struct {
    int B, T, L, NH, C, V, steps, warmup, profile;
    int graph; /* 0 off, 1 on, 2 both */
    int rerun; /* gpt2: blocks under full recompute (train.recompute = full) */
    double peak_tflops, lr;
    const char *data;
    const char *bench;     /* gpt2, attention, codecs, versions */
    const char *attention; /* gpt2: the model's kernel, train.attention's choices */
    int iters;             /* attention and codecs: timed calls per repeat */
    size_t elems;          /* codecs: floats encoded */
} opts;

/* Timed repeats of the attention and codec loops; the median is reported. */
enum { REPEATS = 5 };

typedef struct {
    opts o;
    loco_gpt_config cfg;
    size_t P;                  /* parameters */
    loco_gpt_cuda *dev;        /* the model, gradients and AdamW state on the GPU */
    loco_adamw opt;            /* hyper-parameters and step count (moments on the GPU) */
    int32_t *inputs, *targets; /* (B,T) host */
} gpu_model;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The trainer's model (inner/model/gpt_cuda.c) in bf16, with GPT-2's
 * initialisation from seed 1337 (loco_gpt_init_weights). */
static int setup(gpu_model *g) {
    const opts *o = &g->o;
    g->cfg = (loco_gpt_config){.n_layer = o->L, .n_head = o->NH, .n_embd = o->C,
                               .seq_len = o->T, .vocab_size = o->V};
    const size_t N = (size_t)o->B * o->T;
    g->inputs = malloc(N * sizeof *g->inputs);
    g->targets = malloc(N * sizeof *g->targets);
    if (!g->inputs || !g->targets)
        return LOCO_ERR(LOCO_ENOMEM, "batch");
    /* host parameters only, for the initialisation */
    loco_gpt *host = NULL;
    LOCO_CHECK(loco_gpt_create_ex(&host, &g->cfg, 1, 1, LOCO_GPT_NO_GRADS | LOCO_GPT_NO_ACTS));
    loco_rng rng;
    loco_rng_seed(&rng, 1337);
    loco_gpt_init_weights(host, &rng);
    g->P = loco_gpt_num_params(host);
    const loco_gpt_cuda_opts co = {.bf16 = true, .lo = 0, .hi = SIZE_MAX, .rerun = o->rerun};
    int rc = loco_gpt_cuda_create_with(&g->dev, &g->cfg, o->B, o->T, &co);
    if (rc == 0) /* as the trainer: the model starts on the reference kernel */
        rc = loco_gpt_cuda_set_attention(g->dev, o->attention);
    if (rc == 0)
        rc = loco_gpt_cuda_upload(g->dev, loco_gpt_params(host), NULL, NULL);
    loco_gpt_destroy(host);
    LOCO_CHECK(rc);
    /* AdamW as bench/pytorch_gpt2.py: betas 0.9/0.95, eps 1e-8, decay 0.1 */
    g->opt = (loco_adamw){.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
    return 0;
}

/* Tokens of step `step`: B*T+1 consecutive ones of the stream. */
static void load_batch(gpu_model *g, const uint16_t *shard, size_t shard_n, int step) {
    const size_t N = (size_t)g->o.B * g->o.T;
    for (size_t i = 0; i <= N; i++) {
        const size_t p = (size_t)step * N + i;
        int32_t tok;
        if (shard)
            tok = shard[p % shard_n] % (uint32_t)g->o.V;
        else /* a learnable stream: short arithmetic runs */
            tok = (int32_t)(((p / 7) * 31 + (p % 7) * 3) % 997 % (size_t)g->o.V);
        if (i < N)
            g->inputs[i] = tok;
        if (i > 0)
            g->targets[i - 1] = tok;
    }
}

/* One training step as the trainer's: forward, backward, AdamW (no
 * clipping, as bench/pytorch_gpt2.py), one wait, the mean loss. */
static int step(gpu_model *g, float *loss) {
    LOCO_CHECK(loco_gpt_cuda_zero_grad(g->dev));
    LOCO_CHECK(loco_gpt_cuda_forward_backward(g->dev, g->inputs, g->targets, g->o.B, g->o.T,
                                              1.0f, NULL));
    double norm, sum;
    LOCO_CHECK(loco_gpt_cuda_clip_adamw(g->dev, &g->opt, (float)g->o.lr, 0.0, &norm, &sum));
    *loss = (float)sum;
    return 0;
}

static void teardown(gpu_model *g) {
    loco_gpt_cuda_destroy(g->dev);
    free(g->inputs);
    free(g->targets);
}

static uint16_t *read_shard(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    int32_t hdr[256];
    uint16_t *tok = NULL;
    if (fread(hdr, 4, 256, f) == 256 && hdr[0] == 20240520 && hdr[2] > 0) {
        tok = malloc((size_t)hdr[2] * 2);
        if (tok && fread(tok, 2, (size_t)hdr[2], f) != (size_t)hdr[2]) {
            free(tok);
            tok = NULL;
        }
        *n = (size_t)hdr[2];
    }
    fclose(f);
    return tok;
}

static void usage(void) {
    fprintf(stderr, "usage: loco-gpu-bench [--bench gpt2|attention|codecs|versions] [--batch B] "
                    "[--seq T] [--layers L] [--heads NH] [--embd C] [--vocab V] [--steps N] "
                    "[--warmup N] [--lr X] [--peak-tflops X] [--data shard.bin] [--profile N] "
                    "[--iters N] [--elems N] [--graph off|on|both] [--recompute BLOCKS] "
                    "[--attention auto|tensor|reference]\n");
}

/* ------------------------------------------------------------ attention */

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* n bf16 values uniform in [-1, 1) from a fixed seed, on the device. */
static int upload_rand_bf16(loco_bf16 *d, size_t n, uint64_t seed) {
    loco_bf16 *h = malloc(n * sizeof *h);
    if (!h)
        return LOCO_ERR(LOCO_ENOMEM, "host staging");
    loco_rng rng;
    loco_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) {
        const float f = 2.0f * loco_rng_uniform(&rng) - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (loco_bf16)((u + 0x7fffU + ((u >> 16) & 1)) >> 16);
    }
    int rc = loco_cuda_copy(d, h, n * sizeof *h, NULL);
    if (rc == 0)
        rc = loco_cuda_sync(NULL);
    free(h);
    return rc;
}

/* One forward + backward of kernel `tc` (the tensor-core one, else the
 * reference), as the model calls them. */
static int attention_step(bool tc, const opts *o, loco_bf16 *out, float *lse, loco_bf16 *dqkv,
                          float *scratch, const loco_bf16 *dout, const loco_bf16 *qkv) {
    if (tc) {
        LOCO_CHECK(loco_cuda_attention_tc_fwd_bf16(out, lse, qkv, o->B, o->T, o->C, o->NH, NULL));
        return loco_cuda_attention_tc_bwd_bf16(dqkv, scratch, dout, out, qkv, lse, o->B, o->T,
                                               o->C, o->NH, NULL);
    }
    LOCO_CHECK(loco_cuda_attention_fwd_bf16(out, lse, qkv, o->B, o->T, o->C, o->NH, NULL));
    return loco_cuda_attention_bwd_bf16(dqkv, scratch, dout, out, qkv, lse, o->B, o->T, o->C,
                                        o->NH, NULL);
}

/* Forward + backward of the fused causal attention, bf16, as the model
 * calls it: qkv (B,T,3C) in, out (B,T,C), dqkv (B,T,3C) accumulated; both
 * kernels, the reference (attention.cu) and the tensor-core one
 * (attention_tc.cu, where loco_cuda_attention_select allows it), one JSON
 * line each ("kernel": "reference" | "tensor"). */
static int bench_attention(const opts *o) {
    const size_t B = (size_t)o->B, T = (size_t)o->T, C = (size_t)o->C, NH = (size_t)o->NH;
    const size_t n_qkv = B * T * 3 * C, n_out = B * T * C, n_lse = B * NH * T;
    loco_cuda_slab *slab = NULL;
    loco_bf16 *qkv, *dqkv, *out, *dout;
    float *lse, *scratch;
    double t[REPEATS];
    LOCO_CHECK(loco_cuda_slab_create(&slab, 2 * (n_qkv + n_out) * 2 + 2 * n_lse * 4 + 8 * 256));
    int rc = loco_cuda_slab_alloc(slab, (void **)&qkv, n_qkv * 2, "qkv");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&dqkv, n_qkv * 2, "dqkv");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&out, n_out * 2, "out");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&dout, n_out * 2, "dout");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&lse, n_lse * 4, "lse");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&scratch, n_lse * 4, "scratch");
    if (rc == 0)
        rc = upload_rand_bf16(qkv, n_qkv, 1);
    if (rc == 0)
        rc = upload_rand_bf16(dout, n_out, 2);
    const double hs = (double)C / (double)NH;
    const double fwd = 4.0 * (double)B * (double)NH * (double)T * (double)T * hs / 2.0;
    for (int tc = 0; rc == 0 && tc < 2; tc++) {
        const char *kernel = tc ? "tensor" : "reference";
        loco_attn_impl impl = LOCO_ATTN_REFERENCE;
        if (tc && (rc = loco_cuda_attention_select("tensor", o->C / o->NH, true, &impl)) == 0 &&
            impl != LOCO_ATTN_TENSOR) {
            printf("{\"impl\": \"loco\", \"bench\": \"attention\", \"kernel\": \"tensor\", "
                   "\"skipped\": \"not available on this device or head size (see the "
                   "warning)\"}\n");
            break;
        }
        if (rc == 0)
            rc = loco_cuda_zero(dqkv, n_qkv * 2, NULL);
        /* one warm-up call, then REPEATS timed loops of iters calls */
        for (int r = -1; rc == 0 && r < REPEATS; r++) {
            const int n = r < 0 ? 1 : o->iters;
            double t0 = now();
            for (int i = 0; rc == 0 && i < n; i++)
                rc = attention_step(tc, o, out, lse, dqkv, scratch, dout, qkv);
            if (rc == 0)
                rc = loco_cuda_sync(NULL);
            if (r >= 0)
                t[r] = (now() - t0) / n;
        }
        if (rc)
            break;
        const double sec = median(t, REPEATS);
        printf("{\"impl\": \"loco\", \"bench\": \"attention\", \"kernel\": \"%s\", "
               "\"dtype\": \"bf16\", \"B\": %d, \"T\": %d, \"NH\": %d, \"hs\": %d, "
               "\"causal\": true, \"ms\": %.3f, \"tflops\": %.2f}\n",
               kernel, o->B, o->T, o->NH, o->C / o->NH, 1e3 * sec, 3.5 * fwd / sec / 1e12);
        fflush(stdout);
    }
    loco_cuda_slab_destroy(slab);
    return rc;
}

/* --------------------------------------------------------------- codecs */

/* Median seconds of one call of `which` (0 memcpy, 1 encode, 2 decode). */
static int time_codec(int which, loco_codec_kind k, const opts *o, uint8_t *pay, float *x,
                      float *ef, float *dst, double *secs) {
    const loco_quant_args qa = {.block = 128};
    const size_t n = o->elems;
    double t[REPEATS];
    int rc = 0;
    for (int r = -1; rc == 0 && r < REPEATS; r++) {
        const int iters = r < 0 ? 1 : o->iters;
        const double t0 = now();
        for (int i = 0; rc == 0 && i < iters; i++) {
            if (which == 0)
                rc = loco_cuda_copy(dst, x, n * 4, NULL);
            else if (which == 1)
                rc = loco_cuda_quant(loco_codec_format(k), pay, x, ef, n, &qa, NULL, NULL);
            else
                rc = loco_cuda_dequant_acc(loco_codec_format(k), dst, pay, n, 128, false, 1e-3f,
                                           NULL);
        }
        if (rc == 0)
            rc = loco_cuda_sync(NULL);
        if (r >= 0)
            t[r] = (now() - t0) / iters;
    }
    *secs = median(t, REPEATS);
    return rc;
}

static int bench_codecs(const opts *o) {
    static const loco_codec_kind kinds[] = {LOCO_CODEC_BF16, LOCO_CODEC_INT8, LOCO_CODEC_INT4,
                                            LOCO_CODEC_FP8, LOCO_CODEC_FP4};
    const size_t n = o->elems, fb = n * 4,
                 pb = loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_NONE), n, 128);
    loco_cuda_slab *slab = NULL;
    float *x, *ef, *dst;
    uint8_t *pay;
    LOCO_CHECK(loco_cuda_slab_create(&slab, 3 * fb + pb + 4 * 256));
    int rc = loco_cuda_slab_alloc(slab, (void **)&x, fb, "x");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&ef, fb, "ef");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&dst, fb, "dst");
    if (rc == 0)
        rc = loco_cuda_slab_alloc(slab, (void **)&pay, pb, "payload");
    /* random x (bf16 values widened), zero error feedback and accumulator */
    if (rc == 0)
        rc = upload_rand_bf16((loco_bf16 *)dst, n, 3);
    if (rc == 0)
        rc = loco_cuda_cast_f32(x, (const loco_bf16 *)dst, n, NULL);
    if (rc == 0)
        rc = loco_cuda_zero(ef, fb, NULL);
    if (rc == 0)
        rc = loco_cuda_zero(dst, fb, NULL);
    double s = 0;
    if (rc == 0)
        rc = time_codec(0, LOCO_CODEC_NONE, o, pay, x, ef, dst, &s);
    if (rc == 0)
        printf("{\"impl\": \"cudaMemcpy\", \"bench\": \"memcpy_d2d\", \"elems\": %zu, "
               "\"ms\": %.3f, \"gbps\": %.1f}\n",
               n, 1e3 * s, 2.0 * (double)fb / s / 1e9);
    for (size_t c = 0; rc == 0 && c < sizeof kinds / sizeof *kinds; c++) {
        const size_t p = loco_quant_payload_bytes(loco_codec_format(kinds[c]), n, 128);
        /* encode reads x and ef, writes ef and the payload; decode reads
         * the payload and dst, writes dst */
        const double bytes[3] = {0, 3.0 * (double)fb + (double)p, 2.0 * (double)fb + (double)p};
        for (int which = 1; rc == 0 && which <= 2; which++) {
            rc = time_codec(which, kinds[c], o, pay, x, ef, dst, &s);
            if (rc == 0)
                printf("{\"impl\": \"loco\", \"bench\": \"codec\", \"codec\": \"%s\", "
                       "\"op\": \"%s\", \"elems\": %zu, \"block\": 128, \"ms\": %.3f, "
                       "\"gbps\": %.1f}\n",
                       loco_codec_name(kinds[c]), which == 1 ? "encode" : "decode", n, 1e3 * s,
                       bytes[which] / s / 1e9);
        }
    }
    loco_cuda_slab_destroy(slab);
    return rc;
}

/* ------------------------------------------------------------- versions */

static void print_versions(void) {
    int rt = 0, drv = 0, dev = 0;
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    cudaRuntimeGetVersion(&rt);
    cudaDriverGetVersion(&drv);
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess)
        snprintf(prop.name, sizeof prop.name, "none");
    const size_t lt = cublasLtGetVersion();
    char nccl[32] = "none (built without NCCL)";
#ifdef LOCO_HAVE_NCCL
    int nv = 0;
    if (ncclGetVersion(&nv) == ncclSuccess)
        snprintf(nccl, sizeof nccl, "%d.%d.%d", nv / 10000, nv / 100 % 100, nv % 100);
#endif
    printf("{\"bench\": \"versions\", \"cuda_runtime\": \"%d.%d\", \"cuda_driver_api\": "
           "\"%d.%d\", \"cublaslt\": \"%zu.%zu.%zu\", \"nccl\": \"%s\", \"device\": \"%s\", "
           "\"sm\": \"%d.%d\", \"multiprocessors\": %d}\n",
           rt / 1000, rt % 1000 / 10, drv / 1000, drv % 1000 / 10, lt / 10000, lt / 100 % 100,
           lt % 100, nccl, prop.name, prop.major, prop.minor, prop.multiProcessorCount);
}

/* ----------------------------------------------------------------- gpt2 */

static int run_gpt2(const opts *o);

int main(int argc, char **argv) {
    opts o = (opts){.B = 16, .T = 1024, .L = 12, .NH = 12, .C = 768, .V = 50304, .steps = 20,
                 .warmup = 3, .peak_tflops = 989.0, .lr = 6e-4, .bench = "gpt2",
                 .attention = "auto", .iters = 10, .elems = (size_t)1 << 27};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(a, "--batch")) o.B = atoi(v);
        else if (!strcmp(a, "--seq")) o.T = atoi(v);
        else if (!strcmp(a, "--layers")) o.L = atoi(v);
        else if (!strcmp(a, "--heads")) o.NH = atoi(v);
        else if (!strcmp(a, "--embd")) o.C = atoi(v);
        else if (!strcmp(a, "--vocab")) o.V = atoi(v);
        else if (!strcmp(a, "--steps")) o.steps = atoi(v);
        else if (!strcmp(a, "--warmup")) o.warmup = atoi(v);
        else if (!strcmp(a, "--lr")) o.lr = atof(v);
        else if (!strcmp(a, "--peak-tflops")) o.peak_tflops = atof(v);
        else if (!strcmp(a, "--data")) o.data = v;
        else if (!strcmp(a, "--profile")) o.profile = atoi(v);
        else if (!strcmp(a, "--bench")) o.bench = v;
        else if (!strcmp(a, "--attention")) o.attention = v;
        else if (!strcmp(a, "--iters")) o.iters = atoi(v);
        else if (!strcmp(a, "--elems")) o.elems = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--recompute")) o.rerun = atoi(v);
        else if (!strcmp(a, "--graph"))
            o.graph = !strcmp(v, "on") ? 1 : !strcmp(v, "both") ? 2 : !strcmp(v, "off") ? 0 : -1;
        else {
            usage();
            return 2;
        }
        i++;
    }
    const bool attn_known = !strcmp(o.attention, "auto") || !strcmp(o.attention, "tensor") ||
                            !strcmp(o.attention, "reference");
    const bool known = attn_known && (!strcmp(o.bench, "gpt2") || !strcmp(o.bench, "attention") ||
                       !strcmp(o.bench, "codecs") || !strcmp(o.bench, "versions"));
    if (!known || o.B < 1 || o.T < 1 || o.NH < 1 || o.C % o.NH || o.iters < 1 || !o.elems ||
        o.graph < 0) {
        usage();
        return 2;
    }
    if (!strcmp(o.bench, "versions")) {
        print_versions();
        return 0;
    }
    int ndev = 0;
    if (loco_cuda_device_count(&ndev) < 0) {
        fprintf(stderr, "loco-gpu-bench: %s\n", loco_errmsg());
        return 1;
    }
    if (!strcmp(o.bench, "gpt2"))
        return run_gpt2(&o);
    const int rc = !strcmp(o.bench, "attention") ? bench_attention(&o) : bench_codecs(&o);
    if (rc < 0)
        fprintf(stderr, "loco-gpu-bench: %s\n", loco_errmsg());
    return rc < 0 ? 1 : 0;
}

/* Warm-up and timed steps from data step s0: their lines, *step_ms (the
 * mean of the timed ones), the first and last loss. */
static int timed_steps(gpu_model *g, const uint16_t *shard, size_t shard_n, int s0,
                       double *step_ms, float *first, float *loss) {
    const double tokens = (double)g->o.B * g->o.T;
    double t_sum = 0;
    int measured = 0;
    for (int s = 0; s < g->o.warmup + g->o.steps; s++) {
        load_batch(g, shard, shard_n, s0 + s);
        const double t0 = now();
        LOCO_CHECK(step(g, loss));
        const double dt = now() - t0;
        if (s == 0)
            *first = *loss;
        if (s >= g->o.warmup) {
            t_sum += dt;
            measured++;
        }
        printf("step %3d  loss %.4f  %.1f ms  %.0f tok/s%s\n", s + 1, *loss, dt * 1e3,
               tokens / dt, s < g->o.warmup ? "  (warm-up)" : "");
    }
    *step_ms = measured ? 1e3 * t_sum / measured : 0.0;
    return 0;
}

static void json_line(const gpu_model *g, bool graph, double step_ms, float first, float loss) {
    const double tps = step_ms > 0 ? (double)g->o.B * g->o.T / (step_ms * 1e-3) : 0.0;
    const double mfu = tps * loco_gpt_flops_per_token(&g->cfg, g->o.T) / (g->o.peak_tflops * 1e12);
    loco_attn_impl impl = LOCO_ATTN_REFERENCE; /* the kernel set_attention chose */
    (void)loco_cuda_attention_select(g->o.attention, g->o.C / g->o.NH, true, &impl);
    loco_err_clear();
    printf("{\"impl\": \"loco\", \"mode\": \"bf16\", \"attention\": \"%s\", \"graph\": %s, "
           "\"B\": %d, \"T\": %d, "
           "\"params\": %zu, \"step_ms\": %.2f, \"tok_per_s\": %.0f, \"mfu\": %.4f, "
           "\"loss_first\": %.4f, \"loss_last\": %.4f, \"recompute_blocks\": %d, "
           "\"act_mib\": %.1f, \"device_mib\": %.1f}\n",
           impl == LOCO_ATTN_TENSOR ? "tensor" : "reference", graph ? "true" : "false",
           g->o.B, g->o.T, g->P, step_ms, tps, mfu, first, loss, g->o.rerun,
           (double)loco_gpt_cuda_act_bytes(g->dev) / (1 << 20),
           (double)loco_gpt_cuda_bytes(g->dev) / (1 << 20));
}

/* Warm-up and timed steps (with --graph, the graph's first), the profile,
 * and the JSON lines; 0, 1 on an error, 3 when the loss did not fall. */
static int run_gpt2(const opts *o) {
    gpu_model g;
    memset(&g, 0, sizeof g);
    g.o = *o;
    size_t shard_n = 0;
    uint16_t *shard = NULL;
    if (g.o.data && !(shard = read_shard(g.o.data, &shard_n))) {
        fprintf(stderr, "loco-gpu-bench: cannot read llm.c shard %s\n", g.o.data);
        return 1;
    }
    int rc = setup(&g);
    float first = 0, loss = 0;
    double step_ms = 0;
    int s0 = 0;
    if (rc == 0 && g.o.graph) {
        loco_gpt_cuda_set_graph(g.dev, true);
        rc = timed_steps(&g, shard, shard_n, s0, &step_ms, &first, &loss);
        loco_gpt_cuda_set_graph(g.dev, false);
        if (rc == 0)
            json_line(&g, true, step_ms, first, loss);
        s0 = g.o.warmup + g.o.steps;
    }
    if (rc == 0 && g.o.graph != 1) {
        rc = timed_steps(&g, shard, shard_n, s0, &step_ms, &first, &loss);
        s0 += g.o.warmup + g.o.steps;
    }
    if (rc == 0 && g.o.profile > 0) {
        double prof[LOCO_PROF_N] = {0};
        loco_gpt_cuda_profile(g.dev, true, prof);
        for (int s = 0; rc == 0 && s < g.o.profile; s++) {
            load_batch(&g, shard, shard_n, s0 + s);
            float l;
            rc = step(&g, &l);
        }
        loco_gpt_cuda_profile(g.dev, false, NULL);
        double total = 0;
        for (int k = 0; k < LOCO_PROF_N; k++)
            total += prof[k];
        printf("profile (ms per step, each call waited for):");
        for (int k = 0; k < LOCO_PROF_N; k++)
            printf(" %s %.1f (%.0f%%)%s", loco_gpt_cuda_prof_names[k],
                   1e3 * prof[k] / g.o.profile, total > 0 ? 100 * prof[k] / total : 0.0,
                   k + 1 < LOCO_PROF_N ? "," : "\n");
    }
    if (rc < 0) {
        fprintf(stderr, "loco-gpu-bench: %s\n", loco_errmsg());
        teardown(&g);
        free(shard);
        return 1;
    }
    if (g.o.graph != 1)
        json_line(&g, false, step_ms, first, loss);
    teardown(&g);
    free(shard);
    return loss < first ? 0 : 3; /* a loss that did not fall is a failure */
}
