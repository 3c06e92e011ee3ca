/* The codec handle end to end: encode → chunks → decode-accumulate, error
 * feedback over 100 rounds, bit-identical output for 1 and 2 workers, the
 * zstd=auto decision, size bounds, config keys and allocation failures.
 *
 * One file: every test drives the one codec handle through its public calls. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compress/compress.h"

static uint64_t sm64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double unif(uint64_t *s) {
    return ((double)(sm64(s) >> 11) + 0.5) * 0x1p-53;
}

static float *gaussian(size_t n, uint64_t seed, double sigma) {
    float *x = malloc(n * sizeof *x);
    cr_assert(x);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(sigma * sqrt(-2.0 * log(unif(&seed))) * cos(2.0 * M_PI * unif(&seed)));
    return x;
}

static loco_codec_params params(loco_codec_kind k, loco_zstd_mode z, size_t chunk_bytes,
                                int threads) {
    loco_codec_params p;
    loco_codec_params_default(&p);
    p.codec = k;
    p.zstd = z;
    p.chunk_bytes = chunk_bytes;
    p.threads = threads;
    p.error_feedback = false;
    return p;
}

typedef struct {
    uint8_t *buf;
    size_t cap;
    loco_chunk_ref *chunks;
    loco_encode_plan plan;
} encoded;

static encoded encode(loco_codec *c, const float *x, size_t n, size_t state_offset,
                      uint64_t nonce) {
    encoded e = {0};
    cr_assert_eq(loco_codec_plan(c, &e.plan, x, n, state_offset, nonce), 0, "%s", loco_errmsg());
    e.cap = loco_compress_bound(n, loco_codec_get_params(c));
    e.buf = malloc(e.cap + 1);
    e.chunks = calloc(e.plan.n_chunks + 1, sizeof *e.chunks);
    cr_assert_eq(loco_codec_encode(c, &e.plan, e.buf, e.cap, e.chunks, x), 0, "%s", loco_errmsg());
    return e;
}

static void encoded_free(encoded *e) {
    free(e->buf);
    free(e->chunks);
}

static size_t wire_bytes(const encoded *e) {
    size_t b = 0;
    for (size_t i = 0; i < e->plan.n_chunks; i++)
        b += e->chunks[i].len;
    return b;
}

static double rel_err(const float *x, const float *y, size_t n) {
    double e = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        e += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        s += (double)x[i] * x[i];
    }
    return sqrt(e / s);
}

/* ---- round trip through the handle ---- */

Test(compress_codec, roundtrip_every_codec_and_zstd_mode) {
    const size_t n = 300007; /* several chunks and a ragged tail */
    float *x = gaussian(n, 1, 0.02);
    /* ||q(x) - x|| / ||x||: test_quant.c's roundtrip_error_bounds, where
     * each comes from (the Gaussian bounds; fp4 measured + 6%;
     * bf16 2^-9, its worst case per element); none is exact */
    const double bound[LOCO_CODEC_TOPK] = {0, 0x1p-9, 0.007, 0.125, 0.027, 0.115};
    for (int k = 0; k < LOCO_CODEC_TOPK; k++)
        for (int z = LOCO_ZSTD_OFF; z <= LOCO_ZSTD_AUTO; z++) {
            loco_codec_params p = params((loco_codec_kind)k, (loco_zstd_mode)z, 256 << 10, 2);
            loco_codec *c;
            cr_assert_eq(loco_codec_create(&c, &p), 0);
            encoded e = encode(c, x, n, 0, 7);
            cr_assert_eq(e.plan.n_chunks, (n + 65535) / 65536);
            float *y = calloc(n, sizeof *y);
            cr_assert_eq(loco_codec_decode(c, y, n, 1.0f, e.buf, e.cap, e.chunks, e.plan.n_chunks),
                         0, "%s", loco_errmsg());
            const double err = rel_err(x, y, n);
            cr_assert(err <= bound[k], "%s zstd %d: error %.5f", loco_codec_name(k), z, err);
            if (k == LOCO_CODEC_NONE)
                cr_assert_eq(memcmp(x, y, n * sizeof *x), 0);
            /* what crossed the wire: header + payload per chunk, and zstd shrinks */
            size_t raw = 0;
            for (size_t i = 0; i < e.plan.n_chunks; i++) {
                const size_t cn = i + 1 < e.plan.n_chunks ? 65536 : n - 65536 * i;
                raw += LOCO_CHUNK_HEADER_BYTES +
                       loco_quant_payload_bytes(loco_codec_format(k), cn, 128);
            }
            if (z == LOCO_ZSTD_OFF)
                cr_assert_eq(wire_bytes(&e), raw);
            if (z == LOCO_ZSTD_ON)
                cr_assert_lt(wire_bytes(&e), raw, "%s: zstd did not shrink", loco_codec_name(k));
            free(y);
            encoded_free(&e);
            loco_codec_destroy(c);
        }
    free(x);
}

Test(compress_codec, decode_accumulates_with_weight) {
    const size_t n = 70000;
    float *x = gaussian(n, 2, 1.0);
    float *y = gaussian(n, 3, 1.0), *y0 = malloc(n * sizeof *y0);
    memcpy(y0, y, n * sizeof *y);
    loco_codec_params p = params(LOCO_CODEC_INT8, LOCO_ZSTD_ON, 64 << 10, 2);
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    encoded e = encode(c, x, n, 0, 0);
    /* two contributions of weight 1/4 one chunk at a time, in reverse */
    for (int rep = 0; rep < 2; rep++)
        for (size_t i = e.plan.n_chunks; i-- > 0;)
            cr_assert_eq(loco_codec_decode_chunk(c, 1, y, n, 0.25f, e.buf + e.chunks[i].offset,
                                                 e.chunks[i].len),
                         0, "%s", loco_errmsg());
    double err = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        const double want = (double)y0[i] + 0.5 * x[i];
        err += (y[i] - want) * (y[i] - want);
        s += 0.25 * (double)x[i] * x[i];
    }
    /* y - want = 0.5 (q(x) - x) and s = ||0.5 x||^2: the int8 round-trip
     * error, the Gaussian bound 0.7% (the fp32 sums onto y add
     * 2^-24 of |y| ~ 1, three orders below) */
    cr_assert_lt(sqrt(err / s), 0.007);
    encoded_free(&e);
    loco_codec_destroy(c);
    free(x);
    free(y);
    free(y0);
}

Test(compress_codec, chunk_headers_describe_the_range) {
    const size_t n = 10000;
    float *x = gaussian(n, 4, 1.0);
    loco_codec_params p = params(LOCO_CODEC_FP4, LOCO_ZSTD_OFF, 4096 * 4, 1);
    p.block = 64;
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    encoded e = encode(c, x, n, 0, 0);
    cr_assert_eq(e.plan.n_chunks, 3);
    for (size_t i = 0; i < 3; i++) {
        loco_chunk_info info;
        cr_assert_eq(loco_chunk_parse(e.buf + e.chunks[i].offset, e.chunks[i].len, &info), 0);
        cr_assert_eq(info.codec, LOCO_CODEC_FP4);
        cr_assert_eq(info.block, 64);
        cr_assert_eq(info.chunk_index, i);
        cr_assert_eq(info.first, 4096 * i);
        cr_assert_eq(info.count, i < 2 ? 4096 : n - 8192);
        cr_assert_eq(info.raw_len, 4 * ((info.count + 63) / 64) + (info.count + 1) / 2);
        cr_assert_eq(info.total_len, e.chunks[i].len);
        cr_assert_not(info.zstd);
        cr_assert_eq(e.chunks[i].offset % 64, 0);
    }
    encoded_free(&e);
    loco_codec_destroy(c);
    free(x);
}

/* ---- error feedback ---- */

/* 100 rounds of fresh Gaussian pseudo-gradients through int4: with error
 * feedback the running sum of what was decoded stays within one round's
 * quantization error of the sum of the inputs (the difference is exactly the
 * final EF state); without it the errors add up like a random walk. */
Test(compress_codec, error_feedback_tracks_the_sum) {
    const size_t n = 8192;
    const int rounds = 100;
    double drift[2];
    for (int with_ef = 0; with_ef < 2; with_ef++) {
        loco_codec_params p = params(LOCO_CODEC_INT4, LOCO_ZSTD_OFF, 4096 * 4, 1);
        p.error_feedback = with_ef;
        p.n_state = 3 * n; /* the range sits at offset n of a larger shard */
        loco_codec *c;
        cr_assert_eq(loco_codec_create(&c, &p), 0);
        cr_assert_eq(loco_codec_ef(c) != NULL, with_ef);
        double *sx = calloc(n, sizeof *sx);
        float *sd = calloc(n, sizeof *sd);
        for (int r = 0; r < rounds; r++) {
            float *x = gaussian(n, 1000 + (uint64_t)r, 1.0);
            for (size_t i = 0; i < n; i++)
                sx[i] += x[i];
            encoded e = encode(c, x, n, n, (uint64_t)r);
            cr_assert_eq(loco_codec_decode(c, sd, n, 1.0f, e.buf, e.cap, e.chunks, e.plan.n_chunks),
                         0);
            encoded_free(&e);
            free(x);
        }
        double d = 0, s = 0;
        for (size_t i = 0; i < n; i++) {
            d += (sd[i] - sx[i]) * (sd[i] - sx[i]);
            s += sx[i] * sx[i];
        }
        drift[with_ef] = sqrt(d / s);
        if (with_ef) { /* sum(decoded) + ef = sum(inputs), up to fp32 rounding */
            const float *ef = loco_codec_ef(c);
            double resid = 0;
            for (size_t i = 0; i < n; i++) {
                cr_assert_eq(ef[i], 0.0f); /* outside the range: untouched */
                cr_assert_eq(ef[2 * n + i], 0.0f);
                const double r = sd[i] + ef[n + i] - sx[i];
                resid += r * r;
            }
            /* fp32 rounding: round r adds at most 2^-24 of |sd| ~
             * sqrt(r) |x| to the sum, and its EF three roundings of
             * |x + ef| ~ |x|: summed over R rounds, 2^-24 (2R/3 + 3
             * sqrt(R)) of ||sum x|| = sqrt(R) ||x||, 5.8e-6 for R = 100 */
            cr_assert_lt(sqrt(resid / s), 0x1p-24 * (2.0 * rounds / 3 + 3 * sqrt(rounds)));
            loco_codec_ef_reset(c);
            for (size_t i = 0; i < 3 * n; i++)
                cr_assert_eq(ef[i], 0.0f);
        }
        free(sx);
        free(sd);
        loco_codec_destroy(c);
    }
    cr_log_info("relative drift of the sum after %d rounds: %.4f without EF, %.5f with", rounds,
                drift[0], drift[1]);
    /* measured 0.117 without EF, 0.0119 with (a ratio of 9.9); EF carries
     * the error forward instead of adding it up, so it must beat half that */
    cr_assert_gt(drift[0] / drift[1], 5.0, "EF drift %.5f, without %.5f", drift[1], drift[0]);
}

Test(compress_codec, error_feedback_range_checked) {
    loco_codec_params p = params(LOCO_CODEC_INT8, LOCO_ZSTD_OFF, 4096, 1);
    p.error_feedback = true;
    p.n_state = 1000;
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    float x[600] = {0};
    loco_encode_plan plan;
    cr_assert_eq(loco_codec_plan(c, &plan, x, 600, 400, 0), 0);
    cr_assert_eq(loco_codec_plan(c, &plan, x, 600, 401, 0), LOCO_EINVAL);
    loco_codec_destroy(c);
}

/* ---- determinism ---- */

static encoded encode_with(int threads, uint64_t seed, const float *x, size_t n, float **ef_out,
                           float **dec_out) {
    loco_codec_params p = params(LOCO_CODEC_FP8, LOCO_ZSTD_ON, 32 << 10, threads);
    p.stochastic = true;
    p.error_feedback = true;
    p.n_state = n;
    p.seed = seed;
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    cr_assert_eq(loco_codec_workers(c), threads);
    encoded e = encode(c, x, n, 0, 1);
    encoded_free(&e);
    e = encode(c, x, n, 0, 2); /* the second round sees the EF of the first */
    *ef_out = malloc(n * sizeof(float));
    memcpy(*ef_out, loco_codec_ef(c), n * sizeof(float));
    *dec_out = calloc(n, sizeof(float));
    cr_assert_eq(loco_codec_decode(c, *dec_out, n, 0.5f, e.buf, e.cap, e.chunks, e.plan.n_chunks),
                 0);
    loco_codec_destroy(c);
    return e;
}

Test(compress_codec, bit_identical_for_one_and_two_threads) {
    const size_t n = 200000;
    float *x = gaussian(n, 5, 0.1);
    float *ef1, *ef2, *ef3, *d1, *d2, *d3;
    encoded a = encode_with(1, 99, x, n, &ef1, &d1);
    encoded b = encode_with(2, 99, x, n, &ef2, &d2);
    encoded c = encode_with(2, 98, x, n, &ef3, &d3);
    cr_assert_eq(a.plan.n_chunks, b.plan.n_chunks);
    cr_assert_gt(a.plan.n_chunks, 4);
    for (size_t i = 0; i < a.plan.n_chunks; i++) {
        cr_assert_eq(a.chunks[i].len, b.chunks[i].len);
        cr_assert_eq(
            memcmp(a.buf + a.chunks[i].offset, b.buf + b.chunks[i].offset, a.chunks[i].len), 0,
            "chunk %zu differs", i);
    }
    cr_assert_eq(memcmp(ef1, ef2, n * sizeof(float)), 0);
    cr_assert_eq(memcmp(d1, d2, n * sizeof(float)), 0);
    /* another seed draws other rounding */
    cr_assert_neq(memcmp(d1, d3, n * sizeof(float)), 0);
    encoded_free(&a);
    encoded_free(&b);
    encoded_free(&c);
    free(ef1), free(ef2), free(ef3), free(d1), free(d2), free(d3);
    free(x);
}

Test(compress_codec, stochastic_stream_follows_position_not_chunking) {
    /* The same elements encoded as one range or as two ranges at their
     * state offsets draw the same random bits. */
    const size_t n = 8192;
    float *x = gaussian(n, 6, 1.0);
    loco_codec_params p = params(LOCO_CODEC_INT8, LOCO_ZSTD_OFF, 4096 * 4, 1);
    p.stochastic = true;
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    float *whole = calloc(n, sizeof(float)), *parts = calloc(n, sizeof(float));
    encoded e = encode(c, x, n, 0, 3);
    cr_assert_eq(loco_codec_decode(c, whole, n, 1, e.buf, e.cap, e.chunks, e.plan.n_chunks), 0);
    encoded_free(&e);
    for (size_t h = 0; h < 2; h++) {
        e = encode(c, x + h * 4096, 4096, h * 4096, 3);
        cr_assert_eq(loco_codec_decode(c, parts + h * 4096, 4096, 1, e.buf, e.cap, e.chunks,
                                       e.plan.n_chunks),
                     0);
        encoded_free(&e);
    }
    cr_assert_eq(memcmp(whole, parts, n * sizeof(float)), 0);
    loco_codec_destroy(c);
    free(whole), free(parts), free(x);
}

/* ---- zstd=auto ---- */

Test(compress_codec, zstd_auto_decides_by_ratio_and_link) {
    const size_t n = 1 << 18;
    float *x = gaussian(n, 7, 0.01);
    loco_encode_plan plan;
    loco_codec *c;
    /* int8 of Gaussian data: zstd gains ~6% (FIGURES.md), under 1.1 */
    loco_codec_params p = params(LOCO_CODEC_INT8, LOCO_ZSTD_AUTO, 1 << 20, 1);
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 0), 0);
    cr_log_info("int8 sampled ratio %.3f", plan.sampled_ratio);
    cr_assert(plan.sampled_ratio > 1.0 && plan.sampled_ratio < 1.1);
    cr_assert_not(plan.zstd);
    loco_codec_destroy(c);
    /* bf16 byte planes: 1.2-1.5 depending on the exponent spread */
    p = params(LOCO_CODEC_BF16, LOCO_ZSTD_AUTO, 1 << 20, 1);
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 0), 0);
    cr_assert_gt(plan.sampled_ratio, 1.2);
    cr_assert(plan.zstd);
    encoded e = encode(c, x, n, 0, 0);
    loco_chunk_info info;
    cr_assert_eq(loco_chunk_parse(e.buf, e.chunks[0].len, &info), 0);
    cr_assert(info.zstd && info.planes);
    /* the sample predicts the ratio of the whole range */
    const double full = (double)(2 * n) / (double)(wire_bytes(&e) - LOCO_CHUNK_HEADER_BYTES);
    cr_log_info("bf16 sampled ratio %.3f, whole range %.3f", plan.sampled_ratio, full);
    /* measured 1.450 sampled, 1.464 whole (1%); 5% is the planner's
     * allowance for a sample of the range, not a rounding bound */
    cr_assert(fabs(plan.sampled_ratio / full - 1) < 0.05, "sample %.3f, whole %.3f",
              plan.sampled_ratio, full);
    encoded_free(&e);
    /* a link faster than any compressor: skip */
    loco_codec_set_link_gbps(c, 1e6);
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 0), 0);
    cr_assert_not(plan.zstd);
    /* a slow WAN link: compress */
    loco_codec_set_link_gbps(c, 0.001); /* slower than any compressor, even descheduled */
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 0), 0);
    cr_assert(plan.zstd);
    loco_codec_destroy(c);
    /* zstd=on compresses whatever the ratio */
    p = params(LOCO_CODEC_INT8, LOCO_ZSTD_ON, 1 << 20, 1);
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 0), 0);
    cr_assert(plan.zstd);
    loco_codec_destroy(c);
    free(x);
}

/* With a known link, the exchanges' own timings decide after the sample's
 * first guess: the other way is tried, the faster kept, the slower re-timed
 * every LOCO_ZSTD_RETRY plans; the first (cold) exchange is not timed. */
Test(compress_codec, zstd_auto_keeps_the_faster_measured_way) {
    const size_t n = 1 << 18;
    float *x = gaussian(n, 7, 0.01);
    loco_encode_plan plan;
    loco_codec *c;
    loco_codec_params p = params(LOCO_CODEC_BF16, LOCO_ZSTD_AUTO, 1 << 20, 1);
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    loco_codec_set_link_gbps(c, 0.001); /* slower than any compressor, even descheduled */
    /* plan 1: the sample says compress; its exchange is cold, not timed */
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 1), 0);
    cr_assert(plan.zstd);
    loco_codec_note_exchange(c, true, 0.001, n);
    /* plan 2: still the guess, timed (slow, as on a machine short of cores) */
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 2), 0);
    cr_assert(plan.zstd);
    loco_codec_note_exchange(c, true, 2.0, n);
    /* plan 3: the other way, faster */
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 3), 0);
    cr_assert_not(plan.zstd);
    loco_codec_note_exchange(c, false, 1.5, n);
    /* then the faster is kept until the slower is due for a re-timing */
    int64_t k = 4;
    for (; k < 2 + LOCO_ZSTD_RETRY; k++) {
        cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, (uint64_t)k), 0);
        cr_assert_not(plan.zstd, "plan %lld", (long long)k);
        loco_codec_note_exchange(c, false, 1.5, n);
    }
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, (uint64_t)k), 0);
    cr_assert(plan.zstd, "plan %lld re-times zstd", (long long)k);
    /* zstd barely faster (under LOCO_ZSTD_MARGIN): not worth its cores */
    loco_codec_note_exchange(c, true, 1.5 * (1 - LOCO_ZSTD_MARGIN / 2), n);
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, (uint64_t)++k), 0);
    cr_assert_not(plan.zstd);
    /* the load changed: zstd is clearly faster now, and stays */
    loco_codec_note_exchange(c, true, 1.0, n);
    for (int m = 0; m < 4; m++) {
        cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, (uint64_t)++k), 0);
        cr_assert(plan.zstd);
        loco_codec_note_exchange(c, true, 1.0, n);
    }
    loco_codec_destroy(c);
    /* whatever the sample guessed, every island times with, then without */
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    loco_codec_set_link_gbps(c, 1e6);
    const bool order[] = {false, true, false};
    for (int m = 0; m < 3; m++) {
        cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, (uint64_t)m), 0);
        cr_assert_eq(plan.zstd, order[m], "plan %d", m + 1);
        loco_codec_note_exchange(c, plan.zstd, 1.0, n);
    }
    loco_codec_destroy(c);
    /* a ratio under auto_min_ratio is never tried, whatever is timed */
    p = params(LOCO_CODEC_INT8, LOCO_ZSTD_AUTO, 1 << 20, 1);
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    loco_codec_set_link_gbps(c, 0.001); /* slower than any compressor, even descheduled */
    for (int m = 0; m < 4; m++) {
        cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, (uint64_t)m), 0);
        cr_assert_not(plan.zstd);
        loco_codec_note_exchange(c, false, 5.0, n);
    }
    loco_codec_destroy(c);
    free(x);
}

/* ---- bounds ---- */

Test(compress_codec, output_within_bound_even_when_incompressible) {
    const size_t sizes[] = {1, 7, 127, 128, 129, 4095, 4096, 4097, 50001};
    uint64_t s = 11;
    for (int k = 0; k < LOCO_CODEC_COUNT; k++)
        for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++) {
            const size_t n = sizes[j];
            float *x = malloc(n * sizeof *x);
            for (size_t i = 0; i < n; i++) /* random finite bit patterns */
                x[i] = ldexpf((float)(unif(&s) - 0.5), (int)(sm64(&s) % 200) - 100);
            loco_codec_params p = params((loco_codec_kind)k, LOCO_ZSTD_ON, 4096 * 4, 2);
            loco_codec *c;
            cr_assert_eq(loco_codec_create(&c, &p), 0);
            encoded e = encode(c, x, n, 0, 0);
            cr_assert_eq(e.cap, loco_compress_bound(n, &p));
            cr_assert_eq(e.plan.n_chunks, loco_compress_chunk_count(n, &p));
            for (size_t i = 0; i < e.plan.n_chunks; i++)
                cr_assert_leq(e.chunks[i].len, loco_compress_slot_bytes(&p));
            float *y = calloc(n, sizeof *y);
            cr_assert_eq(loco_codec_decode(c, y, n, 1, e.buf, e.cap, e.chunks, e.plan.n_chunks), 0,
                         "%s n %zu: %s", loco_codec_name(k), n, loco_errmsg());
            if (k == LOCO_CODEC_NONE)
                cr_assert_eq(memcmp(x, y, n * sizeof *x), 0);
            free(y);
            encoded_free(&e);
            loco_codec_destroy(c);
            free(x);
        }
}

Test(compress_codec, empty_range) {
    loco_codec_params p = params(LOCO_CODEC_INT8, LOCO_ZSTD_AUTO, 4096, 1);
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    loco_encode_plan plan;
    cr_assert_eq(loco_codec_plan(c, &plan, NULL, 0, 0, 0), 0);
    cr_assert_eq(plan.n_chunks, 0);
    cr_assert_eq(loco_compress_bound(0, &p), 0);
    cr_assert_eq(loco_codec_encode(c, &plan, NULL, 0, NULL, NULL), 0);
    cr_assert_eq(loco_codec_decode(c, NULL, 0, 1, NULL, 0, NULL, 0), 0);
    loco_codec_destroy(c);
}

/* ---- params and config ---- */

Test(compress_codec, params_from_config) {
    loco_config cfg;
    loco_config_defaults(&cfg);
    loco_codec_params p;
    cr_assert_eq(loco_codec_params_from_config(&p, &cfg), 0, "%s", loco_errmsg());
    cr_assert_eq(p.codec, LOCO_CODEC_INT8);
    cr_assert_eq(p.block, 128);
    cr_assert_not(p.stochastic);
    cr_assert(p.error_feedback);
    cr_assert_eq(p.zstd, LOCO_ZSTD_AUTO);
    cr_assert_eq(p.zstd_level, 1);
    cr_assert_eq(p.chunk_bytes, 4u << 20);
    cr_assert_eq(loco_compress_chunk_elems(&p), 1u << 20);
    const char *set[] = {"compress.codec=fp4",
                         "compress.block=256",
                         "compress.rounding=stochastic",
                         "compress.error_feedback=false",
                         "compress.zstd=off",
                         "compress.zstd_level=-5",
                         "compress.chunk_mb=8",
                         "compress.link_gbps=2.5",
                         "compress.threads=2",
                         "train.seed=77"};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        cr_assert_eq(loco_config_set(&cfg, set[i]), 0, "%s: %s", set[i], loco_errmsg());
    cr_assert_eq(loco_codec_params_from_config(&p, &cfg), 0);
    cr_assert_eq(p.codec, LOCO_CODEC_FP4);
    cr_assert_eq(p.block, 256);
    cr_assert(p.stochastic);
    cr_assert_not(p.error_feedback);
    cr_assert_eq(p.zstd, LOCO_ZSTD_OFF);
    cr_assert_eq(p.zstd_level, -5);
    cr_assert_eq(p.chunk_bytes, 8u << 20);
    cr_assert_eq(p.link_gbps, 2.5);
    cr_assert_eq(p.threads, 2);
    cr_assert_eq(p.seed, 77);
    /* the config refuses what it can; params_check the rest */
    cr_assert_eq(loco_config_set(&cfg, "compress.codec=int3"), LOCO_EINVAL);
    cr_assert_eq(loco_config_set(&cfg, "compress.block=16"), LOCO_EINVAL);
    cr_assert_eq(loco_config_set(&cfg, "compress.block=100"), 0);
    cr_assert_eq(loco_codec_params_from_config(&p, &cfg), LOCO_EINVAL);
    cr_assert(strstr(loco_errmsg(), "compress.block"), "%s", loco_errmsg());
}

Test(compress_codec, names_round_trip) {
    for (int k = 0; k < LOCO_CODEC_COUNT; k++) {
        loco_codec_kind got;
        cr_assert_eq(loco_codec_parse(loco_codec_name((loco_codec_kind)k), &got), 0);
        cr_assert_eq(got, k);
    }
    loco_codec_kind got;
    cr_assert_eq(loco_codec_parse("int16", &got), LOCO_EINVAL);
    cr_assert_str_eq(loco_codec_name(LOCO_CODEC_COUNT), "?");
}

Test(compress_codec, bad_params_refused) {
    loco_codec_params p;
    loco_codec *c = (loco_codec *)1;
    loco_codec_params_default(&p);
    p.block = 4104;
    cr_assert_eq(loco_codec_create(&c, &p), LOCO_EINVAL);
    cr_assert_null(c);
    loco_codec_params_default(&p);
    p.chunk_bytes = 100; /* less than one block */
    cr_assert_eq(loco_codec_create(&c, &p), LOCO_EINVAL);
    loco_codec_params_default(&p);
    p.zstd_level = 1000;
    cr_assert_eq(loco_codec_create(&c, &p), LOCO_EINVAL);
    loco_codec_params_default(&p);
    p.codec = LOCO_CODEC_COUNT;
    cr_assert_eq(loco_codec_create(&c, &p), LOCO_EINVAL);
    loco_codec_destroy(NULL);
}

Test(compress_codec, allocation_failures_are_clean) {
    loco_codec_params p = params(LOCO_CODEC_INT8, LOCO_ZSTD_AUTO, 1 << 16, 2);
    p.error_feedback = true;
    p.n_state = 1000;
    int failures = 0;
    for (long k = 1; k < 100; k++) {
        loco_codec *c = NULL;
        loco_alloc_fail_after(k);
        const int rc = loco_codec_create(&c, &p);
        loco_alloc_fail_after(0);
        if (rc == 0) {
            loco_codec_destroy(c);
            break;
        }
        cr_assert_eq(rc, LOCO_ENOMEM);
        cr_assert_null(c);
        failures++;
    }
    cr_assert_geq(failures, 5);
}

Test(compress_codec, non_finite_input_is_einval) {
    const size_t n = 5000;
    float *x = gaussian(n, 8, 1.0);
    x[4321] = NAN;
    for (int z = LOCO_ZSTD_OFF; z <= LOCO_ZSTD_AUTO; z++) {
        loco_codec_params p = params(LOCO_CODEC_INT8, (loco_zstd_mode)z, 4096, 2);
        loco_codec *c;
        cr_assert_eq(loco_codec_create(&c, &p), 0);
        loco_encode_plan plan;
        int rc = loco_codec_plan(c, &plan, x, n, 0, 0);
        if (rc == 0) {
            uint8_t *buf = malloc(loco_compress_bound(n, &p));
            loco_chunk_ref *ch = calloc(plan.n_chunks, sizeof *ch);
            rc = loco_codec_encode(c, &plan, buf, loco_compress_bound(n, &p), ch, x);
            free(buf);
            free(ch);
        }
        cr_assert_eq(rc, LOCO_EINVAL, "zstd mode %d", z);
        cr_assert(strstr(loco_errmsg(), "non-finite"), "%s", loco_errmsg());
        loco_codec_destroy(c);
    }
    free(x);
}
