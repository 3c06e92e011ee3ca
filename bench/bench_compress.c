/* `loco bench compress`: every codec on a pseudo-gradient-like buffer
 * (Gaussian tensors of log-normally spread scales), encode and decode GB/s
 * of fp32, bytes ratio and relative error, beside memcpy and raw libzstd
 * measured in the same run, for each thread count. The zstd stage is held
 * against raw libzstd on the same payload bytes with the same level and
 * chunking: stage time = (codec with zstd) - (codec without). */
#include "bench/bench.h"
#include "compress/compress.h"
#include "core/core.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

typedef struct {
    size_t mb;
    int threads[8], n_threads;
    int level, reps, chunk_mb;
} bench_opts;

typedef struct {
    loco_codec_kind codec;
    bool zstd, ef, stochastic;
} row_cfg;

static const row_cfg rows[] = {
    {LOCO_CODEC_NONE, false, false, false}, {LOCO_CODEC_NONE, true, false, false},
    {LOCO_CODEC_BF16, false, false, false}, {LOCO_CODEC_BF16, true, false, false},
    {LOCO_CODEC_INT8, false, false, false}, {LOCO_CODEC_INT8, true, false, false},
    {LOCO_CODEC_INT8, false, true, false},  {LOCO_CODEC_INT8, false, false, true},
    {LOCO_CODEC_INT4, false, false, false}, {LOCO_CODEC_INT4, true, false, false},
    {LOCO_CODEC_FP8, false, false, false},  {LOCO_CODEC_FP8, true, false, false},
    {LOCO_CODEC_FP4, false, false, false},  {LOCO_CODEC_FP4, true, false, false},
    {LOCO_CODEC_TOPK, false, false, false}, {LOCO_CODEC_TOPK, true, false, false},
};
#define N_ROWS (sizeof rows / sizeof rows[0])

/* Buffers shared by every measurement of one run. */
typedef struct {
    size_t n;
    float *x, *y; /* input, decode target */
    uint8_t *enc; /* encoded chunks */
    size_t enc_cap;
    loco_chunk_ref *chunks;
    uint8_t *raw, *zraw; /* raw payloads for raw libzstd, and its frames */
    size_t raw_cap, zraw_cap;
} bufs;

static int parse_opts(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){
        .mb = 256, .threads = {1, 2}, .n_threads = 2, .level = 1, .reps = 3, .chunk_mb = 4};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--mb") && v) {
            o->mb = (size_t)atol(v);
        } else if (!strcmp(a, "--level") && v) {
            o->level = atoi(v);
        } else if (!strcmp(a, "--reps") && v) {
            o->reps = atoi(v);
        } else if (!strcmp(a, "--chunk-mb") && v) {
            o->chunk_mb = atoi(v);
        } else if (!strcmp(a, "--threads") && v) {
            o->n_threads = 0;
            for (const char *p = v; *p && o->n_threads < 8;) {
                char *end;
                long t = strtol(p, &end, 10);
                if (end == p || t < 1 || t > 4096)
                    return LOCO_ERR(LOCO_EINVAL, "--threads %s: expected a list like 1,2", v);
                o->threads[o->n_threads++] = (int)t;
                p = *end == ',' ? end + 1 : end;
                if (*end && *end != ',')
                    return LOCO_ERR(LOCO_EINVAL, "--threads %s: expected a list like 1,2", v);
            }
        } else {
            return LOCO_ERR(LOCO_EINVAL,
                            "bench compress: unknown option '%s' (--mb N, --threads 1,2, "
                            "--level L, --reps R, --chunk-mb M)",
                            a);
        }
        i++;
    }
    if (o->mb < 1 || o->reps < 1 || o->chunk_mb < 1 || o->n_threads < 1)
        return LOCO_ERR(LOCO_EINVAL, "bench compress: --mb, --reps, --chunk-mb must be >= 1");
    return 0;
}

/* Pseudo-gradient-like data: tensors of 2^20 elements, each Gaussian with a
 * standard deviation of 1e-3 * exp(N(0, 1)) (outer deltas of different
 * layers differ in scale by orders of magnitude). */
static void fill(float *x, size_t n) {
    const size_t seg = (size_t)1 << 20, nseg = (n + seg - 1) / seg;
#pragma omp parallel for schedule(static)
    for (size_t s = 0; s < nseg; s++) {
        loco_rng r;
        loco_rng_seed(&r, 1000 + s);
        const float sigma = 1e-3f * expf(loco_rng_normal(&r));
        for (size_t i = s * seg; i < n && i < (s + 1) * seg; i++)
            x[i] = sigma * loco_rng_normal(&r);
    }
}

static double best_of(double a, double b) {
    return a < b ? a : b;
}

typedef struct {
    double enc_s, dec_s; /* seconds */
    size_t out_bytes;
} raw_zstd;

/* Raw libzstd on nc payloads (payload i at raw + i * stride, len[i]): one
 * context per thread, one frame per chunk, dynamic schedule. */
static int time_raw_zstd_once(bufs *b, const size_t *len, size_t nc, size_t stride, int threads,
                              int level, raw_zstd *out) {
    size_t *zlen = calloc(nc, sizeof *zlen);
    ZSTD_CCtx *cc[64] = {0};
    ZSTD_DCtx *dc[64] = {0};
    int rc = 0;
    if (!zlen || threads > 64)
        return LOCO_ERR(LOCO_ENOMEM, "bench: raw zstd setup");
    for (int t = 0; t < threads; t++) {
        cc[t] = ZSTD_createCCtx();
        dc[t] = ZSTD_createDCtx();
    }
    const size_t zstride = ZSTD_compressBound(stride);
    out->enc_s = out->dec_s = 1e30;
    int failed = 0;
    {
        double t0 = loco_now();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (size_t i = 0; i < nc; i++) {
            size_t z = ZSTD_compressCCtx(cc[omp_get_thread_num()], b->zraw + i * zstride, zstride,
                                         b->raw + i * stride, len[i], level);
            if (ZSTD_isError(z)) {
#pragma omp atomic write
                failed = 1;
            }
            zlen[i] = z;
        }
        out->enc_s = best_of(out->enc_s, loco_now() - t0);
        t0 = loco_now();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (size_t i = 0; i < nc; i++) {
            size_t d = ZSTD_decompressDCtx(dc[omp_get_thread_num()], b->raw + i * stride, len[i],
                                           b->zraw + i * zstride, zlen[i]);
            if (ZSTD_isError(d) || d != len[i]) {
#pragma omp atomic write
                failed = 1;
            }
        }
        out->dec_s = best_of(out->dec_s, loco_now() - t0);
    }
    out->out_bytes = 0;
    for (size_t i = 0; i < nc; i++)
        out->out_bytes += zlen[i];
    if (failed)
        rc = LOCO_ERR(LOCO_EIO, "bench: raw zstd failed");
    for (int t = 0; t < threads; t++) {
        ZSTD_freeCCtx(cc[t]);
        ZSTD_freeDCtx(dc[t]);
    }
    free(zlen);
    return rc;
}

static int time_raw_zstd(bufs *b, const size_t *len, size_t nc, size_t stride, int threads,
                         int level, int reps, raw_zstd *out) {
    raw_zstd best = {1e30, 1e30, 0};
    for (int r = 0; r < reps; r++) {
        raw_zstd one;
        LOCO_CHECK(time_raw_zstd_once(b, len, nc, stride, threads, level, &one));
        best.enc_s = best_of(best.enc_s, one.enc_s);
        best.dec_s = best_of(best.dec_s, one.dec_s);
        best.out_bytes = one.out_bytes;
    }
    *out = best;
    return 0;
}

typedef struct {
    double enc_s, dec_s;         /* best times of the codec */
    double raw_enc_s, raw_dec_s; /* zstd rows: raw libzstd on the same payloads */
    double err;
    size_t wire;
    double sampled_ratio; /* zstd=auto's sample of this codec */
    bool auto_zstd;
} row_result;

static loco_codec_params row_params(const row_cfg *cfg, const bench_opts *o, int threads,
                                    size_t n) {
    loco_codec_params p;
    loco_codec_params_default(&p);
    p.codec = cfg->codec;
    p.zstd = cfg->zstd ? LOCO_ZSTD_ON : LOCO_ZSTD_OFF;
    p.zstd_level = o->level;
    p.error_feedback = cfg->ef;
    p.stochastic = cfg->stochastic;
    p.chunk_bytes = (size_t)o->chunk_mb << 20;
    p.threads = threads;
    p.n_state = cfg->ef ? n : 0;
    return p;
}

/* One timed encode and decode of a row; the first call also measures error,
 * bytes and what zstd=auto would pick. */
static int run_row(bufs *b, const row_cfg *cfg, const bench_opts *o, int threads, bool first,
                   row_result *res) {
    loco_codec_params p = row_params(cfg, o, threads, b->n);
    loco_codec *c;
    LOCO_CHECK(loco_codec_create(&c, &p));
    int rc = 0;
    loco_encode_plan plan;
    double t0 = loco_now();
    LOCO_CHECK_GOTO(loco_codec_plan(c, &plan, b->x, b->n, 0, 0), out);
    LOCO_CHECK_GOTO(loco_codec_encode(c, &plan, b->enc, b->enc_cap, b->chunks, b->x), out);
    res->enc_s = best_of(res->enc_s, loco_now() - t0);
    memset(b->y, 0, b->n * sizeof(float));
    t0 = loco_now();
    LOCO_CHECK_GOTO(
        loco_codec_decode(c, b->y, b->n, 1.0f, b->enc, b->enc_cap, b->chunks, plan.n_chunks), out);
    res->dec_s = best_of(res->dec_s, loco_now() - t0);
    if (!first)
        goto out;
    res->wire = 0;
    for (size_t i = 0; i < plan.n_chunks; i++)
        res->wire += b->chunks[i].len;
    double e = 0, s = 0;
#pragma omp parallel for reduction(+ : e, s) num_threads(threads)
    for (size_t i = 0; i < b->n; i++) {
        const double d = (double)b->y[i] - b->x[i];
        e += d * d;
        s += (double)b->x[i] * b->x[i];
    }
    res->err = sqrt(e / s);
    /* what zstd=auto would pick for this codec */
    loco_codec_destroy(c);
    c = NULL;
    p.zstd = LOCO_ZSTD_AUTO;
    LOCO_CHECK_GOTO(loco_codec_create(&c, &p), out);
    LOCO_CHECK_GOTO(loco_codec_plan(c, &plan, b->x, b->n, 0, 0), out);
    res->sampled_ratio = plan.sampled_ratio;
    res->auto_zstd = plan.zstd;
out:
    loco_codec_destroy(c);
    return rc;
}

/* Raw payloads of a codec as the zstd stage sees them (planes for fp32 and
 * bf16, nearest rounding, no EF), chunk by chunk, for raw libzstd. */
static int fill_raw(bufs *b, const row_cfg *cfg, const bench_opts *o, size_t *len, size_t *nc,
                    size_t *stride) {
    loco_codec_params p = row_params(cfg, o, 1, b->n);
    const size_t ce = loco_compress_chunk_elems(&p);
    *nc = loco_compress_chunk_count(b->n, &p);
    *stride = loco_codec_payload_bytes(&p, ce);
    const loco_quant_args qa = {.block = p.block,
                                .planes = p.codec == LOCO_CODEC_NONE || p.codec == LOCO_CODEC_BF16};
    int failed = 0;
#pragma omp parallel for schedule(dynamic, 1)
    for (size_t i = 0; i < *nc; i++) {
        const size_t first = i * ce, m = b->n - first < ce ? b->n - first : ce;
        len[i] = loco_codec_payload_bytes(&p, m);
        const int rc = p.codec == LOCO_CODEC_TOPK
                           ? loco_topk_quant(b->raw + i * *stride, b->x + first, NULL, m,
                                             loco_codec_topk_k(&p, m), p.topk_bits)
                           : loco_quant(loco_codec_format(p.codec), b->raw + i * *stride,
                                        b->x + first, NULL, m, &qa);
        if (rc < 0) {
#pragma omp atomic write
            failed = 1;
        }
    }
    return failed ? LOCO_ERR(LOCO_EINVAL, "bench: non-finite data") : 0;
}

static const char *row_name(const row_cfg *r, char *buf, size_t cap) {
    /* topk at the defaults of its keys (1%, 2 bits) */
    snprintf(buf, cap, "%s%s%s%s", loco_codec_name(r->codec),
             r->codec == LOCO_CODEC_TOPK ? " 1% 2-bit" : "", r->ef ? " +EF" : "",
             r->stochastic ? " stoch" : "");
    return buf;
}

/* Everything measured for one thread count. */
typedef struct {
    int threads;
    double memcpy_s;
    raw_zstd fp32; /* raw libzstd on the plain fp32 buffer */
    row_result row[N_ROWS];
} thread_result;

/* One repetition of every measurement at one thread count, keeping the best
 * times. Repetitions go round the whole table, so that a burst of other work
 * on a shared machine spoils one sample of each cell, not all of one. */
static int measure(bufs *b, const bench_opts *o, bool first, size_t *len, thread_result *tr) {
    const int threads = tr->threads;
    const size_t bytes = b->n * sizeof(float);
    double t0 = loco_now();
    uint8_t *dst = (uint8_t *)b->y;
    const uint8_t *src = (const uint8_t *)b->x;
#pragma omp parallel num_threads(threads)
    {
        const size_t nt = (size_t)omp_get_num_threads(), t = (size_t)omp_get_thread_num();
        const size_t lo = bytes * t / nt, hi = bytes * (t + 1) / nt;
        memcpy(dst + lo, src + lo, hi - lo);
    }
    tr->memcpy_s = best_of(tr->memcpy_s, loco_now() - t0);
    /* raw libzstd on the plain fp32 buffer, same level and chunking */
    const size_t ce = ((size_t)o->chunk_mb << 20) / 4, nc = (b->n + ce - 1) / ce;
    for (size_t i = 0; i < nc; i++)
        len[i] = (b->n - i * ce < ce ? b->n - i * ce : ce) * sizeof(float);
    memcpy(b->raw, b->x, bytes);
    raw_zstd one;
    LOCO_CHECK(time_raw_zstd(b, len, nc, ce * sizeof(float), threads, o->level, 1, &one));
    tr->fp32.enc_s = best_of(tr->fp32.enc_s, one.enc_s);
    tr->fp32.dec_s = best_of(tr->fp32.dec_s, one.dec_s);
    tr->fp32.out_bytes = one.out_bytes;
    for (size_t r = 0; r < N_ROWS; r++) {
        row_result *res = &tr->row[r];
        LOCO_CHECK(run_row(b, &rows[r], o, threads, first, res));
        if (!rows[r].zstd)
            continue;
        size_t n_raw, stride;
        LOCO_CHECK(fill_raw(b, &rows[r], o, len, &n_raw, &stride));
        LOCO_CHECK(time_raw_zstd(b, len, n_raw, stride, threads, o->level, 1, &one));
        res->raw_enc_s = best_of(res->raw_enc_s, one.enc_s);
        res->raw_dec_s = best_of(res->raw_dec_s, one.dec_s);
    }
    return 0;
}

static void print_threads(const bufs *b, const bench_opts *o, const thread_result *tr) {
    const double gb = (double)b->n * sizeof(float) / 1e9;
    printf("\n### %d thread%s\n\n", tr->threads, tr->threads > 1 ? "s" : "");
    printf("memcpy: %.2f GB/s. raw libzstd level %d on the fp32 buffer (%d MiB frames): "
           "compress %.2f GB/s, decompress %.2f GB/s, ratio %.3f\n\n",
           gb / tr->memcpy_s, o->level, o->chunk_mb, gb / tr->fp32.enc_s, gb / tr->fp32.dec_s,
           (double)b->n * 4 / (double)tr->fp32.out_bytes);
    printf("| codec | zstd | encode GB/s | decode GB/s | ratio | rel. error | "
           "zstd stage / raw libzstd (enc, dec) | auto picks (sampled ratio) |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (size_t r = 0; r < N_ROWS; r++) {
        const row_result *res = &tr->row[r];
        char name[32], stage[64] = "", picks[48] = "";
        if (rows[r].zstd) {
            /* the same codec without zstd is the row before */
            const row_result *plain = &tr->row[r - 1];
            snprintf(stage, sizeof stage, "%.0f%%, %.0f%% (raw %.2f, %.2f GB/s)",
                     100 * res->raw_enc_s / (res->enc_s - plain->enc_s),
                     100 * res->raw_dec_s / (res->dec_s - plain->dec_s), gb / res->raw_enc_s,
                     gb / res->raw_dec_s);
        }
        if (!rows[r].zstd && !rows[r].ef && !rows[r].stochastic)
            snprintf(picks, sizeof picks, "%s (%.3f)", res->auto_zstd ? "zstd" : "no zstd",
                     res->sampled_ratio);
        printf("| %s | %s | %.2f | %.2f | %.3f | %.3f%% | %s | %s |\n",
               row_name(&rows[r], name, sizeof name), rows[r].zstd ? "on" : "off", gb / res->enc_s,
               gb / res->dec_s, (double)b->n * 4 / (double)res->wire, 100 * res->err, stage, picks);
    }
}

int loco_bench_compress(int argc, char **argv) {
    bench_opts o;
    LOCO_CHECK(parse_opts(argc, argv, &o));
    bufs b = {.n = o.mb * ((size_t)1 << 20) / sizeof(float)};
    loco_codec_params worst; /* fp32 without zstd bounds every codec's output */
    loco_codec_params_default(&worst);
    worst.codec = LOCO_CODEC_NONE;
    worst.block = LOCO_COMPRESS_BLOCK_MIN;
    worst.chunk_bytes = (size_t)o.chunk_mb << 20;
    b.enc_cap = loco_compress_bound(b.n, &worst);
    const size_t nc = loco_compress_chunk_count(b.n, &worst);
    b.raw_cap = nc * loco_quant_payload_bytes(loco_codec_format(LOCO_CODEC_NONE),
                                              worst.chunk_bytes / 4, 32);
    b.zraw_cap = nc * ZSTD_compressBound(worst.chunk_bytes);
    b.x = loco_alloc(b.n * sizeof(float));
    b.y = loco_alloc(b.n * sizeof(float));
    b.enc = loco_alloc(b.enc_cap);
    b.chunks = loco_alloc((nc + 1) * sizeof *b.chunks);
    b.raw = loco_alloc(b.raw_cap);
    b.zraw = loco_alloc(b.zraw_cap);
    size_t *len = loco_alloc((nc + 1) * sizeof *len);
    thread_result *tr = loco_alloc((size_t)o.n_threads * sizeof *tr);
    int rc = 0;
    if (!b.x || !b.y || !b.enc || !b.chunks || !b.raw || !b.zraw || !len || !tr) {
        rc = LOCO_ERR(LOCO_ENOMEM, "bench compress: cannot allocate %zu MiB buffers", o.mb);
        goto out;
    }
    for (int t = 0; t < o.n_threads; t++) {
        tr[t].threads = o.threads[t];
        tr[t].memcpy_s = tr[t].fp32.enc_s = tr[t].fp32.dec_s = 1e30;
        for (size_t r = 0; r < N_ROWS; r++)
            tr[t].row[r] =
                (row_result){.enc_s = 1e30, .dec_s = 1e30, .raw_enc_s = 1e30, .raw_dec_s = 1e30};
    }
    fill(b.x, b.n);
    printf("loco bench compress: %zu MiB of fp32 pseudo-gradient-like data (Gaussian "
           "tensors of 2^20, sigma = 1e-3 exp(N(0,1))), block 128, %d MiB chunks, zstd level "
           "%d, best of %d rounds over the whole table\n",
           o.mb, o.chunk_mb, o.level, o.reps);
    printf("GB/s are of fp32 elements (4 bytes each) in for encode and out for decode; "
           "ratio = fp32 bytes / bytes on the wire (headers included)\n");
    fflush(stdout);
    for (int r = 0; r < o.reps; r++)
        for (int t = 0; t < o.n_threads; t++)
            LOCO_CHECK_GOTO(measure(&b, &o, r == 0, len, &tr[t]), out);
    for (int t = 0; t < o.n_threads; t++)
        print_threads(&b, &o, &tr[t]);
    if (o.n_threads > 1) {
        const thread_result *a = &tr[0], *z = &tr[o.n_threads - 1];
        printf("\nscaling %d -> %d threads (encode, decode): memcpy %.2fx", a->threads, z->threads,
               a->memcpy_s / z->memcpy_s);
        for (size_t r = 0; r < N_ROWS; r++) {
            char name[32];
            printf(", %s%s %.2fx, %.2fx", row_name(&rows[r], name, sizeof name),
                   rows[r].zstd ? "+zstd" : "", a->row[r].enc_s / z->row[r].enc_s,
                   a->row[r].dec_s / z->row[r].dec_s);
        }
        printf("\n");
    }
    for (size_t r = 0; r < N_ROWS; r++)
        if (rows[r].codec == LOCO_CODEC_INT8 && !rows[r].zstd && !rows[r].ef && !rows[r].stochastic)
            printf("\ngoal: int8 quantize >= 3.5 GB/s of fp32 per core: %.2f GB/s on %d "
                   "thread%s\n",
                   (double)b.n * 4 / 1e9 / tr[0].row[r].enc_s, tr[0].threads,
                   tr[0].threads > 1 ? "s" : "");
out:
    loco_free(b.x);
    loco_free(b.y);
    loco_free(b.enc);
    loco_free(b.chunks);
    loco_free(b.raw);
    loco_free(b.zraw);
    loco_free(len);
    loco_free(tr);
    return rc;
}
