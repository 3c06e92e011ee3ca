/* The chunk wire format (docs/COMPRESS.md): the header read back with a
 * reader written here from the byte table, and every malformed input —
 * short, long, flipped bits, forged fields with valid checksums, bad scales,
 * lying zstd frames, overlapping chunks — refused with LOCO_EPROTO and dst
 * left untouched. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "compress/compress.h"

#define HDR LOCO_CHUNK_HEADER_BYTES

static uint64_t rd(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void wr(uint8_t *p, int bytes, uint64_t v) {
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Recomputes both checksums after a forgery: the payload one over the
 * enc_len bytes the header claims, as far as the buffer of len bytes goes. */
static void reseal(uint8_t *chunk, size_t len) {
    const uint64_t enc = rd(chunk + 40, 8);
    wr(chunk + 48, 8, loco_hash64(chunk + HDR, enc < len - HDR ? enc : len - HDR));
    wr(chunk + 56, 8, loco_hash64(chunk, 56));
}

typedef struct {
    loco_codec *c;
    uint8_t *chunk; /* one encoded chunk, a private copy */
    size_t len;
    size_t n; /* elements of the destination range */
    float *dst, *dst0;
} fixture;

static fixture make(loco_codec_kind k, loco_zstd_mode z, size_t n) {
    fixture f = {.n = n};
    loco_codec_params p;
    loco_codec_params_default(&p);
    p.codec = k;
    p.zstd = z;
    p.error_feedback = false;
    p.chunk_bytes = 4 * ((n + 127) / 128 * 128); /* one chunk */
    p.threads = 2;
    cr_assert_eq(loco_codec_create(&f.c, &p), 0);
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = sinf((float)i * 0.01f) * (float)(i % 13); /* compressible */
    loco_encode_plan plan;
    cr_assert_eq(loco_codec_plan(f.c, &plan, x, n, 0, 0), 0);
    cr_assert_eq(plan.n_chunks, 1);
    f.chunk = malloc(plan.slot_bytes);
    cr_assert_eq(loco_codec_encode_chunk(f.c, 0, &plan, f.chunk, plan.slot_bytes, &f.len, x, 0), 0);
    free(x);
    f.dst = malloc(n * sizeof(float));
    f.dst0 = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        f.dst[i] = f.dst0[i] = (float)i;
    return f;
}

static void release(fixture *f) {
    loco_codec_destroy(f->c);
    free(f->chunk);
    free(f->dst);
    free(f->dst0);
}

/* Decodes buf and expects `want` with dst unchanged: LOCO_EPROTO for a
 * malformed chunk, LOCO_EREFUSED for a well-formed one holding a
 * non-finite scale or an invalid code (the sender's doing, not the wire's). */
static void refused_as(fixture *f, const uint8_t *buf, size_t len, const char *what, int want) {
    loco_err_clear();
    const int rc = loco_codec_decode_chunk(f->c, 1, f->dst, f->n, 1.0f, buf, len);
    cr_assert_eq(rc, want, "%s: rc %d", what, rc);
    cr_assert(loco_errmsg()[0], "%s: no message", what);
    cr_assert_eq(memcmp(f->dst, f->dst0, f->n * sizeof(float)), 0, "%s: dst touched", what);
}

static void refused(fixture *f, const uint8_t *buf, size_t len, const char *what) {
    refused_as(f, buf, len, what, LOCO_EPROTO);
}

static void accepted(fixture *f, const uint8_t *buf, size_t len) {
    cr_assert_eq(loco_codec_decode_chunk(f->c, 0, f->dst, f->n, 1.0f, buf, len), 0, "%s",
                 loco_errmsg());
    memcpy(f->dst, f->dst0, f->n * sizeof(float));
}

Test(compress_wire, header_layout) {
    fixture f = make(LOCO_CODEC_INT8, LOCO_ZSTD_ON, 1000);
    const uint8_t *h = f.chunk;
    cr_assert_eq(memcmp(h, "LOCZ", 4), 0);
    cr_assert_eq(h[4], 1); /* version */
    cr_assert_eq(h[5], LOCO_CODEC_INT8);
    cr_assert_eq(h[6], 1); /* zstd, no planes */
    cr_assert_eq(h[7], 0);
    cr_assert_eq(rd(h + 8, 4), 128);           /* block */
    cr_assert_eq(rd(h + 12, 4), 0);            /* chunk index */
    cr_assert_eq(rd(h + 16, 8), 0);            /* first */
    cr_assert_eq(rd(h + 24, 8), 1000);         /* count */
    cr_assert_eq(rd(h + 32, 8), 8 * 4 + 1000); /* raw payload */
    cr_assert_eq(rd(h + 40, 8) + HDR, f.len);
    cr_assert_eq(rd(h + 48, 8), loco_hash64(h + HDR, f.len - HDR));
    cr_assert_eq(rd(h + 56, 8), loco_hash64(h, 56));
    /* the payload is one zstd frame of the raw size */
    cr_assert_eq(ZSTD_getFrameContentSize(h + HDR, f.len - HDR), 8 * 4 + 1000);
    accepted(&f, f.chunk, f.len);
    release(&f);
}

Test(compress_wire, every_truncation_and_extension) {
    for (int z = 0; z < 2; z++) {
        fixture f = make(LOCO_CODEC_FP8, z ? LOCO_ZSTD_ON : LOCO_ZSTD_OFF, 500);
        uint8_t *big = calloc(f.len + 16, 1);
        memcpy(big, f.chunk, f.len);
        for (size_t len = 0; len < f.len; len++)
            refused(&f, f.chunk, len, "truncated");
        refused(&f, big, f.len + 1, "one byte long");
        refused(&f, big, f.len + 16, "sixteen bytes long");
        refused(&f, NULL, 0, "NULL");
        accepted(&f, f.chunk, f.len);
        free(big);
        release(&f);
    }
}

Test(compress_wire, every_flipped_bit_refused) {
    for (int z = 0; z < 2; z++) {
        fixture f = make(LOCO_CODEC_INT4, z ? LOCO_ZSTD_ON : LOCO_ZSTD_OFF, 300);
        for (size_t byte = 0; byte < f.len; byte++)
            for (int bit = 0; bit < 8; bit += (byte < HDR ? 1 : 3)) {
                f.chunk[byte] ^= (uint8_t)(1u << bit);
                refused(&f, f.chunk, f.len, "flipped bit");
                f.chunk[byte] ^= (uint8_t)(1u << bit);
            }
        accepted(&f, f.chunk, f.len);
        release(&f);
    }
}

/* A forged header field with both checksums recomputed. */
static void forge(fixture *f, int off, int bytes, uint64_t v, const char *what) {
    uint8_t *c = malloc(f->len);
    memcpy(c, f->chunk, f->len);
    wr(c + off, bytes, v);
    reseal(c, f->len);
    refused(f, c, f->len, what);
    free(c);
}

Test(compress_wire, forged_fields_refused) {
    fixture f = make(LOCO_CODEC_INT8, LOCO_ZSTD_OFF, 1000);
    forge(&f, 0, 4, 0x5a434f4dU, "magic");
    forge(&f, 4, 1, 2, "version");
    forge(&f, 5, 1, LOCO_CODEC_COUNT, "codec");
    forge(&f, 5, 1, LOCO_CODEC_FP4, "other codec: payload length");
    forge(&f, 6, 1, 4, "unknown flag");
    forge(&f, 6, 1, 2, "planes with int8");
    forge(&f, 6, 1, 1, "zstd flag on a raw payload");
    forge(&f, 7, 1, 1, "reserved byte");
    forge(&f, 8, 4, 0, "block 0");
    forge(&f, 8, 4, 24, "block under 32");
    forge(&f, 8, 4, 8192, "block over 4096");
    forge(&f, 8, 4, 132, "block not a multiple of 8");
    forge(&f, 8, 4, 256, "block changes the scale count");
    forge(&f, 16, 8, 1, "range past dst");
    forge(&f, 16, 8, UINT64_MAX - 10, "first overflows");
    forge(&f, 24, 8, 0, "count 0");
    forge(&f, 24, 8, 999, "count disagrees with raw length");
    forge(&f, 24, 8, UINT64_MAX, "count huge");
    forge(&f, 32, 8, 1031, "raw length");
    forge(&f, 32, 8, UINT64_MAX, "raw length huge");
    forge(&f, 40, 8, 1031, "encoded length short");
    forge(&f, 40, 8, UINT64_MAX - 63, "encoded length wraps");
    /* only the header hash fixed: payload checksum fails */
    uint8_t *c = malloc(f.len);
    memcpy(c, f.chunk, f.len);
    wr(c + 48, 8, rd(c + 48, 8) + 1);
    wr(c + 56, 8, loco_hash64(c, 56));
    refused(&f, c, f.len, "payload checksum");
    free(c);
    release(&f);
}

Test(compress_wire, range_and_size_limits) {
    fixture f = make(LOCO_CODEC_INT8, LOCO_ZSTD_OFF, 1000);
    /* a smaller receiving range */
    cr_assert_eq(loco_codec_decode_chunk(f.c, 0, f.dst, 999, 1.0f, f.chunk, f.len), LOCO_EPROTO);
    /* a chunk larger than this decoder's chunks */
    loco_codec_params p = *loco_codec_get_params(f.c);
    p.chunk_bytes = 512 * 4;
    loco_codec *small;
    cr_assert_eq(loco_codec_create(&small, &p), 0);
    cr_assert_eq(loco_codec_decode_chunk(small, 0, f.dst, f.n, 1.0f, f.chunk, f.len), LOCO_EPROTO);
    cr_assert(strstr(loco_errmsg(), "chunks hold"), "%s", loco_errmsg());
    /* bad arguments are EINVAL, not EPROTO */
    cr_assert_eq(loco_codec_decode_chunk(f.c, 2, f.dst, f.n, 1.0f, f.chunk, f.len), LOCO_EINVAL);
    cr_assert_eq(loco_codec_decode_chunk(f.c, -1, f.dst, f.n, 1.0f, f.chunk, f.len), LOCO_EINVAL);
    cr_assert_eq(loco_codec_decode_chunk(f.c, 0, f.dst, f.n, NAN, f.chunk, f.len), LOCO_EINVAL);
    cr_assert_eq(memcmp(f.dst, f.dst0, f.n * sizeof(float)), 0);
    loco_codec_destroy(small);
    release(&f);
}

/* Payload forgeries with valid checksums: the checks on the payload itself. */
Test(compress_wire, bad_scales_and_codes_refused) {
    for (int k = LOCO_CODEC_INT8; k < LOCO_CODEC_TOPK; k++) {
        fixture f = make((loco_codec_kind)k, LOCO_ZSTD_OFF, 1000);
        const float bad[] = {NAN, INFINITY, -2.0f};
        for (int j = 0; j < 3; j++) {
            uint8_t *c = malloc(f.len);
            memcpy(c, f.chunk, f.len);
            memcpy(c + HDR + 4 * 3, &bad[j], 4); /* the scale of block 3 */
            reseal(c, f.len);
            refused_as(&f, c, f.len, "bad scale", LOCO_EREFUSED);
            free(c);
        }
        release(&f);
    }
    fixture f = make(LOCO_CODEC_FP8, LOCO_ZSTD_OFF, 1000);
    f.chunk[HDR + 8 * 4 + 999] = 0xff; /* NaN code in the last element */
    reseal(f.chunk, f.len);
    refused_as(&f, f.chunk, f.len, "fp8 NaN code", LOCO_EREFUSED);
    release(&f);
}

/* zstd payloads that pass their checksum but lie. */
Test(compress_wire, lying_zstd_frames_refused) {
    fixture f = make(LOCO_CODEC_INT8, LOCO_ZSTD_ON, 1000);
    const size_t raw_len = 8 * 4 + 1000;
    uint8_t *raw = malloc(raw_len + 64), *c = malloc(f.len + 4096);
    cr_assert_eq(ZSTD_decompress(raw, raw_len, f.chunk + HDR, f.len - HDR), raw_len);
    /* a frame of one byte fewer than the header claims */
    size_t z = ZSTD_compress(c + HDR, 4096, raw, raw_len - 1, 1);
    cr_assert(!ZSTD_isError(z) && z < raw_len);
    memcpy(c, f.chunk, HDR);
    wr(c + 40, 8, z);
    reseal(c, HDR + z);
    refused(&f, c, HDR + z, "frame content size");
    /* a frame without a content size (streaming API) */
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    z = ZSTD_compress2(cc, c + HDR, 4096, raw, raw_len);
    cr_assert(!ZSTD_isError(z));
    ZSTD_freeCCtx(cc);
    memcpy(c, f.chunk, HDR);
    wr(c + 40, 8, z);
    reseal(c, HDR + z);
    if (z < raw_len)
        refused(&f, c, HDR + z, "frame without content size");
    /* two frames back to back */
    const size_t z1 = ZSTD_compress(c + HDR, 4096, raw, 500, 1);
    const size_t z2 = ZSTD_compress(c + HDR + z1, 4096, raw + 500, raw_len - 500, 1);
    memcpy(c, f.chunk, HDR);
    wr(c + 40, 8, z1 + z2);
    reseal(c, HDR + z1 + z2);
    if (z1 + z2 < raw_len)
        refused(&f, c, HDR + z1 + z2, "two frames");
    /* garbage */
    memcpy(c, f.chunk, f.len);
    for (size_t i = HDR + 8; i < f.len; i++)
        c[i] = (uint8_t)(i * 37);
    reseal(c, f.len);
    refused(&f, c, f.len, "garbage frame");
    /* a valid frame of NaN scales */
    const float nan = NAN;
    memcpy(raw, &nan, 4);
    z = ZSTD_compress(c + HDR, 4096, raw, raw_len, 1);
    memcpy(c, f.chunk, HDR);
    wr(c + 40, 8, z);
    reseal(c, HDR + z);
    refused_as(&f, c, HDR + z, "NaN scale inside zstd", LOCO_EREFUSED);
    free(raw);
    free(c);
    release(&f);
}

Test(compress_wire, batch_decode_checks_all_before_applying) {
    loco_codec_params p;
    loco_codec_params_default(&p);
    p.zstd = LOCO_ZSTD_OFF;
    p.error_feedback = false;
    p.chunk_bytes = 1024 * 4;
    p.threads = 2;
    loco_codec *c;
    cr_assert_eq(loco_codec_create(&c, &p), 0);
    const size_t n = 4000;
    float *x = malloc(n * sizeof *x), *dst = calloc(n, sizeof *dst);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)i;
    loco_encode_plan plan;
    cr_assert_eq(loco_codec_plan(c, &plan, x, n, 0, 0), 0);
    const size_t cap = loco_compress_bound(n, &p);
    uint8_t *buf = malloc(cap);
    loco_chunk_ref ch[4], bad[4];
    cr_assert_eq(loco_codec_encode(c, &plan, buf, cap, ch, x), 0);
    /* the same chunk twice: overlap */
    memcpy(bad, ch, sizeof ch);
    bad[3] = ch[0];
    cr_assert_eq(loco_codec_decode(c, dst, n, 1, buf, cap, bad, 4), LOCO_EPROTO);
    cr_assert(strstr(loco_errmsg(), "overlap"), "%s", loco_errmsg());
    /* a ref past the buffer */
    memcpy(bad, ch, sizeof ch);
    bad[2].len = cap;
    cr_assert_eq(loco_codec_decode(c, dst, n, 1, buf, cap, bad, 4), LOCO_EPROTO);
    /* a corrupt last chunk: nothing applied */
    buf[ch[3].offset + HDR + 100] ^= 1;
    cr_assert_eq(loco_codec_decode(c, dst, n, 1, buf, cap, ch, 4), LOCO_EPROTO);
    cr_assert(strstr(loco_errmsg(), "chunk 3"), "%s", loco_errmsg());
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(dst[i], 0.0f);
    buf[ch[3].offset + HDR + 100] ^= 1;
    cr_assert_eq(loco_codec_decode(c, dst, n, 1, buf, cap, ch, 4), 0);
    /* int8 of block absmax a (blocks of p.block elements, x[i] = i): half
     * a step of the scale a / 127, plus the kernel's fp32 rounding of
     * x * (127 / a), 2^-22 of the up to 127 steps (see test_quant.c's
     * check_nearest_block_codec), plus the decode's fma (2^-24 of x) */
    for (size_t i = 0; i < n; i++) {
        const size_t end = (i / (size_t)p.block + 1) * (size_t)p.block;
        const double s = (double)((end < n ? end : n) - 1) / 127;
        cr_assert(fabs((double)dst[i] - x[i]) <= (0.5 + 127 * 0x1p-22) * s + 0x1p-24 * x[i],
                  "element %zu: %.9g", i, (double)dst[i]);
    }
    free(buf);
    free(x);
    free(dst);
    loco_codec_destroy(c);
}

Test(compress_wire, random_bytes_never_crash) {
    fixture f = make(LOCO_CODEC_BF16, LOCO_ZSTD_ON, 2000);
    uint64_t s = 1;
    uint8_t *c = malloc(f.len);
    for (int t = 0; t < 2000; t++) {
        memcpy(c, f.chunk, f.len);
        /* a few random byte writes, then sometimes re-sealed */
        for (int k = 0; k < 1 + t % 4; k++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            c[(s >> 33) % f.len] = (uint8_t)(s >> 20);
        }
        if (t & 1)
            reseal(c, f.len);
        if (memcmp(c, f.chunk, f.len) == 0)
            continue;
        const int rc = loco_codec_decode_chunk(f.c, 0, f.dst, f.n, 1.0f, c, f.len);
        cr_assert(rc == 0 || rc == LOCO_EPROTO);
        memcpy(f.dst, f.dst0, f.n * sizeof(float));
    }
    free(c);
    release(&f);
}
