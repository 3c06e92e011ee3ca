/* The codec handle: chunk framing, the zstd stage, error-feedback state,
 * parallel encode and checked decode-accumulate. The element loops are the
 * kernels of kernels/cpu/quant.c; the wire format is docs/COMPRESS.md.
 *
 * Why one file: the handle is one object whose encoder and checked decoder
 * read the same framing and error-feedback state; they change together. */
#include "compress/compress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) {
    return 0;
}
static int omp_get_max_threads(void) {
    return 1;
}
#endif

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "compress/: payloads are little-endian; a big-endian port swaps scales and fp32 values"
#endif

/* Fuzzing builds compute the checksums but do not enforce them, so that
 * the fuzzer reaches the field checks and the zstd stage behind them. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define CHECKSUMS_ENFORCED 0
#else
#define CHECKSUMS_ENFORCED 1
#endif

/* "LOCZ" read as a little-endian u32. */
#define CHUNK_MAGIC 0x5a434f4cU
#define CHUNK_VERSION 1
#define FLAG_ZSTD 0x1U
#define FLAG_PLANES 0x2U
#define HDR LOCO_CHUNK_HEADER_BYTES
#define HDR_HASHED 56 /* bytes covered by the header checksum */
/* Largest count a header may claim, whatever the decoder's chunk size. */
#define MAX_COUNT (LOCO_COMPRESS_CHUNK_MAX / 4)
/* zstd=auto samples this many pieces of about SAMPLE_PIECE elements. */
#define SAMPLE_PIECES 8
#define SAMPLE_PIECE 4096

typedef struct {
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    uint8_t *raw; /* raw payload of one chunk: raw_cap bytes */
} worker_ws;

struct loco_codec {
    loco_codec_params p;
    size_t chunk_elems; /* elements per chunk */
    size_t raw_cap;     /* scratch bytes: any codec's payload of chunk_elems */
    size_t slot_bytes;
    int n_workers;
    worker_ws *ws; /* [n_workers] */
    float *ef;     /* [n_state] with error feedback, else NULL */
    double link_gbps;
    /* zstd=auto, measured: seconds per element of the last exchange
     * without [0] and with [1] the zstd stage (0 = none yet), and the plan
     * count when each was taken. */
    double xch_s[2];
    uint64_t xch_at[2], plans;
    bool noted; /* an exchange reports its times: plan from them */
    ZSTD_CCtx *plan_cctx;
    bool plan_warm;  /* plan_cctx has compressed once (timing is fair) */
    float *sample_x; /* zstd=auto: the gathered sample */
    uint8_t *sample_raw, *sample_z;
    size_t sample_raw_cap, sample_z_cap;
};

/* A failure inside a parallel loop: the lowest failing chunk and its
 * message (error messages are per thread, so it is carried out by hand). */
typedef struct {
    int rc;
    size_t chunk;
    char msg[512];
} par_err;

static void par_err_note(par_err *e, int rc, size_t chunk) {
#pragma omp critical(loco_compress_err)
    if (e->rc == 0 || chunk < e->chunk) {
        e->rc = rc;
        e->chunk = chunk;
        snprintf(e->msg, sizeof e->msg, "%s", loco_errmsg());
    }
}

static int par_err_raise(const par_err *e, const char *what) {
    if (e->rc == 0)
        return 0;
    return LOCO_ERR(e->rc, "%s chunk %zu: %s", what, e->chunk, e->msg);
}

/* ------------------------------------------------------------- rounding */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Stochastic stream of the chunk starting at state position pos: depends on
 * seed, nonce and position only, never on threads or chunk sizes. */
static uint64_t chunk_key(uint64_t seed, uint64_t nonce, uint64_t pos) {
    uint64_t k = mix64(seed + 0x9e3779b97f4a7c15ULL);
    k = mix64(k ^ (nonce + 0x632be59bd9b4e019ULL));
    return mix64(k ^ (pos + 0x2545f4914f6cdd1dULL));
}

static bool planes_apply(loco_codec_kind k, bool zstd) {
    return zstd && (k == LOCO_CODEC_NONE || k == LOCO_CODEC_BF16);
}

/* The element loop of codec p->codec over one chunk (or sample). */
static int quant_chunk(const loco_codec_params *p, uint8_t *out, const float *x, float *ef,
                       size_t count, const loco_quant_args *qa) {
    if (p->codec == LOCO_CODEC_TOPK)
        return loco_topk_quant(out, x, ef, count, loco_codec_topk_k(p, count), p->topk_bits);
    return loco_quant(loco_codec_format(p->codec), out, x, ef, count, qa);
}

/* A raw payload of `info`'s chunk that decodes safely. */
static bool payload_ok(const loco_chunk_info *info, const uint8_t *payload) {
    if (info->codec == LOCO_CODEC_TOPK)
        return loco_topk_payload_ok(payload, info->raw_len, info->count);
    return loco_quant_payload_ok(loco_codec_format(info->codec), payload, info->count, info->block);
}

/* ------------------------------------------------------------- lifecycle */

void loco_codec_destroy(loco_codec *c) {
    if (!c)
        return;
    if (c->ws)
        for (int i = 0; i < c->n_workers; i++) {
            ZSTD_freeCCtx(c->ws[i].cctx);
            ZSTD_freeDCtx(c->ws[i].dctx);
            loco_free(c->ws[i].raw);
        }
    loco_free(c->ws);
    loco_free(c->ef);
    ZSTD_freeCCtx(c->plan_cctx);
    loco_free(c->sample_x);
    loco_free(c->sample_raw);
    loco_free(c->sample_z);
    loco_free(c);
}

int loco_codec_create(loco_codec **out, const loco_codec_params *p) {
    *out = NULL;
    LOCO_CHECK(loco_codec_params_check(p));
    loco_codec *c = loco_alloc(sizeof *c);
    if (!c)
        return LOCO_ERR(LOCO_ENOMEM, "compress: cannot allocate the codec");
    c->p = *p;
    c->chunk_elems = loco_compress_chunk_elems(p);
    c->raw_cap = 4 * c->chunk_elems + 64; /* fp32 is the largest payload */
    c->slot_bytes = loco_compress_slot_bytes(p);
    c->n_workers = p->threads > 0 ? p->threads : omp_get_max_threads();
    c->link_gbps = p->link_gbps;
    int rc = 0;
    c->ws = loco_alloc(sizeof *c->ws * (size_t)c->n_workers);
    if (!c->ws) {
        rc = LOCO_ERR(LOCO_ENOMEM, "compress: cannot allocate %d workspaces", c->n_workers);
        goto out_destroy;
    }
    for (int i = 0; i < c->n_workers; i++) {
        worker_ws *w = &c->ws[i];
        w->cctx = ZSTD_createCCtx();
        w->dctx = ZSTD_createDCtx();
        w->raw = loco_alloc(c->raw_cap);
        if (!w->cctx || !w->dctx || !w->raw) {
            rc = LOCO_ERR(LOCO_ENOMEM, "compress: cannot allocate workspace %d (%zu bytes)", i,
                          c->raw_cap);
            goto out_destroy;
        }
    }
    if (p->error_feedback && p->n_state > 0) {
        c->ef = loco_alloc(p->n_state * sizeof(float));
        if (!c->ef) {
            rc = LOCO_ERR(LOCO_ENOMEM, "compress: cannot allocate error feedback of %zu floats",
                          p->n_state);
            goto out_destroy;
        }
    }
    const size_t piece =
        (size_t)p->block *
        (SAMPLE_PIECE / (size_t)p->block > 0 ? SAMPLE_PIECE / (size_t)p->block : 1);
    c->sample_raw_cap = loco_codec_payload_bytes(p, SAMPLE_PIECES * piece);
    c->sample_z_cap = ZSTD_compressBound(c->sample_raw_cap);
    c->plan_cctx = ZSTD_createCCtx();
    c->sample_x = loco_alloc(SAMPLE_PIECES * piece * sizeof(float));
    c->sample_raw = loco_alloc(c->sample_raw_cap);
    c->sample_z = loco_alloc(c->sample_z_cap);
    if (!c->plan_cctx || !c->sample_x || !c->sample_raw || !c->sample_z) {
        rc = LOCO_ERR(LOCO_ENOMEM, "compress: cannot allocate the zstd sample");
        goto out_destroy;
    }
    *out = c;
    return 0;
out_destroy:
    loco_codec_destroy(c);
    return rc;
}

const loco_codec_params *loco_codec_get_params(const loco_codec *c) {
    return &c->p;
}
int loco_codec_workers(const loco_codec *c) {
    return c->n_workers;
}
float *loco_codec_ef(loco_codec *c) {
    return c->ef;
}

void loco_codec_ef_reset(loco_codec *c) {
    if (c->ef)
        memset(c->ef, 0, c->p.n_state * sizeof(float));
}

void loco_codec_set_link_gbps(loco_codec *c, double gbps) {
    c->link_gbps = gbps > 0 && isfinite(gbps) ? gbps : 0;
}

void loco_codec_note_exchange(loco_codec *c, bool zstd, double seconds, size_t n) {
    c->noted = true;
    /* The first exchange of a run writes its buffers for the first time
     * (page faults): too slow to tell anything about zstd. */
    if (c->plans > 1 && n > 0 && seconds > 0 && isfinite(seconds)) {
        c->xch_s[zstd] = seconds / (double)n;
        c->xch_at[zstd] = c->plans;
    }
}
/* --------------------------------------------------------------- planning */

/* zstd=auto: quantizes SAMPLE_PIECES evenly spaced pieces (nearest, no
 * error feedback) and compresses them as one buffer. Returns the ratio and
 * the compressor speed in payload bytes per second of one worker. */
static int sample_zstd(loco_codec *c, const float *src, size_t n, double *ratio, double *bps) {
    const loco_codec_params *p = &c->p;
    const size_t B = (size_t)p->block;
    const size_t piece = B * (SAMPLE_PIECE / B > 0 ? SAMPLE_PIECE / B : 1);
    const loco_quant_args qa = {.block = p->block, .planes = planes_apply(p->codec, true)};
    /* The pieces are gathered and quantized as one small chunk, so that the
     * sample has the layout (scales, codes, byte planes) of a real one. */
    const float *xs = src;
    size_t m = n;
    if (n > SAMPLE_PIECES * piece) {
        for (size_t k = 0; k < SAMPLE_PIECES; k++) {
            const size_t off = k * (n - piece) / (SAMPLE_PIECES - 1) / B * B;
            memcpy(c->sample_x + k * piece, src + off, piece * sizeof(float));
        }
        xs = c->sample_x;
        m = SAMPLE_PIECES * piece;
    }
    if (quant_chunk(p, c->sample_raw, xs, NULL, m, &qa) < 0)
        return LOCO_ERR(LOCO_EINVAL, "compress: non-finite value in the zstd sample");
    const size_t raw = loco_codec_payload_bytes(p, m);
    /* Byte planes are compressed one by one: in a real chunk each zstd block
     * (128 KiB) holds one plane, and a small sample must not mix them. */
    const size_t segs = !qa.planes ? 1 : p->codec == LOCO_CODEC_NONE ? 4 : 2;
    const size_t seg = raw / segs;
    size_t z = 0;
    double dt = 0;
    for (int rep = c->plan_warm ? 1 : 0; rep < 2; rep++) { /* first call warms */
        const double t0 = loco_now();
        z = 0;
        for (size_t k = 0; k < segs; k++) {
            const size_t r = ZSTD_compressCCtx(c->plan_cctx, c->sample_z, c->sample_z_cap,
                                               c->sample_raw + k * seg, seg, p->zstd_level);
            if (ZSTD_isError(r))
                return LOCO_ERR(LOCO_EIO, "compress: zstd on the sample: %s", ZSTD_getErrorName(r));
            z += r;
        }
        dt = loco_now() - t0;
    }
    c->plan_warm = true;
    *ratio = z ? (double)raw / (double)z : 1.0;
    *bps = dt > 0 ? (double)raw / dt : 1e30;
    return 0;
}

int loco_codec_plan(loco_codec *c, loco_encode_plan *plan, const float *src, size_t n,
                    size_t state_offset, uint64_t nonce) {
    return loco_codec_plan_sampled(c, plan, src, n, n, state_offset, nonce);
}

int loco_codec_plan_sampled(loco_codec *c, loco_encode_plan *plan, const float *sample,
                            size_t sample_n, size_t n, size_t state_offset, uint64_t nonce) {
    const loco_codec_params *p = &c->p;
    const float *src = sample;
    if (n > 0 && !src)
        return LOCO_ERR(LOCO_EINVAL, "compress: NULL source for %zu elements", n);
    if (n > 0 && (sample_n == 0 || sample_n > n))
        return LOCO_ERR(LOCO_EINVAL, "compress: a sample of %zu elements for %zu", sample_n, n);
    if (p->error_feedback && p->codec != LOCO_CODEC_NONE && n > 0 &&
        (state_offset > p->n_state || n > p->n_state - state_offset))
        return LOCO_ERR(LOCO_EINVAL,
                        "compress: range [%zu, %zu) outside the error-feedback state of "
                        "%zu elements",
                        state_offset, state_offset + n, p->n_state);
    *plan = (loco_encode_plan){
        .n = n,
        .state_offset = state_offset,
        .nonce = nonce,
        .chunk_elems = c->chunk_elems,
        .n_chunks = loco_compress_chunk_count(n, p),
        .slot_bytes = c->slot_bytes,
        .zstd = p->zstd == LOCO_ZSTD_ON,
    };
    if (p->zstd != LOCO_ZSTD_AUTO || n == 0)
        return 0;
    double ratio = 0, bps = 0;
    LOCO_CHECK(sample_zstd(c, src, sample_n, &ratio, &bps));
    plan->sampled_ratio = ratio;
    const double link_bps = c->link_gbps * 1e9 / 8;
    const uint64_t now = ++c->plans;
    /* Streaming hides the slower of compressor and link: with no
     * measurement, zstd pays when it shrinks enough and one compressor
     * outruns the link. */
    plan->zstd = ratio >= p->auto_min_ratio && (link_bps <= 0 || bps > link_bps);
    if (ratio < p->auto_min_ratio || link_bps <= 0)
        return 0;
    /* Then the exchanges decide: try the way not measured yet, keep the
     * faster, and re-time the slower now and then (the load changes). */
    const double *t = c->xch_s;
    if (t[0] > 0 && t[1] > 0) {
        /* zstd has to earn the cores it takes from everything else (the
         * inner loop, other ranks): kept only when clearly faster. */
        const bool best = t[1] < t[0] * (1 - LOCO_ZSTD_MARGIN);
        plan->zstd = now - c->xch_at[!best] >= LOCO_ZSTD_RETRY ? !best : best;
    } else if (t[0] > 0 || t[1] > 0) {
        plan->zstd = t[0] > 0;
    } else if (c->noted) {
        /* The same order on every island (with, then without), so that
         * islands time the same combination of choices. */
        plan->zstd = true;
    }
    return 0;
}

/* --------------------------------------------------------------- encoding */

static void write_header(uint8_t *h, const loco_codec_params *p, uint32_t flags, size_t chunk,
                         uint64_t first, uint64_t count, uint64_t raw_len, uint64_t enc_len,
                         uint64_t payload_hash) {
    loco_put_le32(h + 0, CHUNK_MAGIC);
    h[4] = CHUNK_VERSION;
    h[5] = (uint8_t)p->codec;
    h[6] = (uint8_t)flags;
    h[7] = 0;
    loco_put_le32(h + 8, (uint32_t)p->block);
    loco_put_le32(h + 12, (uint32_t)chunk);
    loco_put_le64(h + 16, first);
    loco_put_le64(h + 24, count);
    loco_put_le64(h + 32, raw_len);
    loco_put_le64(h + 40, enc_len);
    loco_put_le64(h + 48, payload_hash);
    loco_put_le64(h + 56, loco_hash64(h, HDR_HASHED));
}

int loco_codec_encode_chunk(loco_codec *c, int worker, const loco_encode_plan *plan, void *dst,
                            size_t dst_cap, size_t *dst_len, const float *src, size_t chunk) {
    *dst_len = 0;
    if (chunk >= plan->n_chunks || plan->chunk_elems != c->chunk_elems)
        return LOCO_ERR(LOCO_EINVAL, "compress: chunk %zu of a plan with %zu chunks", chunk,
                        plan->n_chunks);
    return loco_codec_encode_chunk_from(c, worker, plan, dst, dst_cap, dst_len,
                                        src + chunk * c->chunk_elems, chunk);
}

int loco_codec_encode_chunk_from(loco_codec *c, int worker, const loco_encode_plan *plan, void *dst,
                                 size_t dst_cap, size_t *dst_len, const float *x, size_t chunk) {
    const loco_codec_params *p = &c->p;
    *dst_len = 0;
    if (worker < 0 || worker >= c->n_workers)
        return LOCO_ERR(LOCO_EINVAL, "compress: worker %d outside [0, %d)", worker, c->n_workers);
    if (chunk >= plan->n_chunks || plan->chunk_elems != c->chunk_elems)
        return LOCO_ERR(LOCO_EINVAL, "compress: chunk %zu of a plan with %zu chunks", chunk,
                        plan->n_chunks);
    if (chunk > UINT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "compress: chunk index %zu exceeds 32 bits", chunk);
    const size_t first = chunk * c->chunk_elems;
    const size_t count = plan->n - first < c->chunk_elems ? plan->n - first : c->chunk_elems;
    const size_t raw_len = loco_codec_payload_bytes(p, count);
    if (dst_cap < HDR + raw_len)
        return LOCO_ERR(LOCO_EINVAL, "compress: %zu bytes of output for a chunk of up to %zu",
                        dst_cap, HDR + raw_len);
    const bool planes = planes_apply(p->codec, plan->zstd);
    const loco_quant_args qa = {
        .block = p->block,
        .stochastic = p->stochastic,
        .planes = planes,
        .key = chunk_key(p->seed, plan->nonce, plan->state_offset + first),
    };
    float *ef = c->ef && p->codec != LOCO_CODEC_NONE ? c->ef + plan->state_offset + first : NULL;
    uint8_t *out = dst, *payload = out + HDR;
    worker_ws *w = &c->ws[worker];
    uint32_t flags = planes ? FLAG_PLANES : 0;
    size_t enc_len = raw_len;
    if (quant_chunk(p, plan->zstd ? w->raw : payload, x, ef, count, &qa) < 0)
        return LOCO_ERR(LOCO_EINVAL, "compress: non-finite value in elements [%zu, %zu)", first,
                        first + count);
    if (plan->zstd) {
        /* Capacity raw_len - 1: a chunk zstd cannot shrink goes raw. */
        const size_t z =
            ZSTD_compressCCtx(w->cctx, payload, raw_len - 1, w->raw, raw_len, p->zstd_level);
        if (!ZSTD_isError(z)) {
            enc_len = z;
            flags |= FLAG_ZSTD;
        } else if (ZSTD_getErrorCode(z) == ZSTD_error_dstSize_tooSmall) {
            memcpy(payload, w->raw, raw_len);
        } else {
            return LOCO_ERR(LOCO_EIO, "compress: zstd: %s", ZSTD_getErrorName(z));
        }
    }
    write_header(out, p, flags, chunk, first, count, raw_len, enc_len,
                 loco_hash64(payload, enc_len));
    *dst_len = HDR + enc_len;
    return 0;
}

int loco_codec_encode(loco_codec *c, const loco_encode_plan *plan, void *dst, size_t dst_cap,
                      loco_chunk_ref *chunks, const float *src) {
    const size_t nc = plan->n_chunks, slot = plan->slot_bytes;
    if (slot != c->slot_bytes || (nc > 0 && (!dst || !chunks)))
        return LOCO_ERR(LOCO_EINVAL, "compress: encode with a plan of another codec");
    if (nc > 0 && dst_cap / nc < slot)
        return LOCO_ERR(LOCO_EINVAL, "compress: %zu bytes of output, %zu chunks need %zu", dst_cap,
                        nc, nc * slot);
    par_err err = {0};
    uint8_t *out = dst;
#pragma omp parallel for num_threads(c->n_workers) schedule(dynamic, 1) if (nc > 1)
    for (size_t i = 0; i < nc; i++) {
        size_t len = 0;
        int rc = loco_codec_encode_chunk(c, omp_get_thread_num(), plan, out + i * slot, slot, &len,
                                         src, i);
        chunks[i] = (loco_chunk_ref){.offset = i * slot, .len = len};
        if (rc < 0)
            par_err_note(&err, rc, i);
    }
    return par_err_raise(&err, "encode");
}

/* --------------------------------------------------------------- decoding */

int loco_chunk_parse(const void *src, size_t len, loco_chunk_info *info) {
    const uint8_t *h = src;
    if (!src || len < HDR)
        return LOCO_ERR(LOCO_EPROTO, "chunk: %zu bytes, shorter than the %d-byte header", len, HDR);
    if (loco_get_le32(h) != CHUNK_MAGIC)
        return LOCO_ERR(LOCO_EPROTO, "chunk: bad magic 0x%08x", loco_get_le32(h));
    if (h[4] != CHUNK_VERSION)
        return LOCO_ERR(LOCO_EPROTO, "chunk: version %u, expected %u", h[4], CHUNK_VERSION);
    if (loco_get_le64(h + 56) != loco_hash64(h, HDR_HASHED) && CHECKSUMS_ENFORCED)
        return LOCO_ERR(LOCO_EPROTO, "chunk: header checksum mismatch");
    const unsigned codec = h[5], flags = h[6];
    const uint32_t block = loco_get_le32(h + 8);
    const uint64_t first = loco_get_le64(h + 16), count = loco_get_le64(h + 24);
    const uint64_t raw_len = loco_get_le64(h + 32), enc_len = loco_get_le64(h + 40);
    if (codec >= LOCO_CODEC_COUNT)
        return LOCO_ERR(LOCO_EPROTO, "chunk: unknown codec %u", codec);
    if (flags & ~(FLAG_ZSTD | FLAG_PLANES) || h[7] != 0)
        return LOCO_ERR(LOCO_EPROTO, "chunk: unknown flags 0x%02x/0x%02x", flags, h[7]);
    if ((flags & FLAG_PLANES) && codec != LOCO_CODEC_NONE && codec != LOCO_CODEC_BF16)
        return LOCO_ERR(LOCO_EPROTO, "chunk: byte planes with codec %s",
                        loco_codec_name((loco_codec_kind)codec));
    if (block < LOCO_COMPRESS_BLOCK_MIN || block > LOCO_COMPRESS_BLOCK_MAX || block % 8)
        return LOCO_ERR(LOCO_EPROTO, "chunk: block %u", block);
    if (count == 0 || count > MAX_COUNT)
        return LOCO_ERR(LOCO_EPROTO, "chunk: %llu elements", (unsigned long long)count);
    if (first > UINT64_MAX - count)
        return LOCO_ERR(LOCO_EPROTO, "chunk: first element %llu overflows",
                        (unsigned long long)first);
    if (codec == LOCO_CODEC_TOPK) {
        /* k and the value bits are in the payload: its exact size is
         * checked with them (loco_topk_payload_ok); here the range any k
         * and bits allow */
        if (raw_len <= LOCO_TOPK_HEADER + 1 || raw_len > loco_topk_payload_max(count))
            return LOCO_ERR(LOCO_EPROTO,
                            "chunk: raw payload %llu bytes, topk of %llu needs (%d, %zu]",
                            (unsigned long long)raw_len, (unsigned long long)count,
                            LOCO_TOPK_HEADER + 1, loco_topk_payload_max(count));
    } else if (raw_len != loco_quant_payload_bytes(loco_codec_format((loco_codec_kind)codec), count,
                                                   (int)block)) {
        const uint64_t want =
            loco_quant_payload_bytes(loco_codec_format((loco_codec_kind)codec), count, (int)block);
        return LOCO_ERR(LOCO_EPROTO, "chunk: raw payload %llu bytes, %s of %llu needs %llu",
                        (unsigned long long)raw_len, loco_codec_name((loco_codec_kind)codec),
                        (unsigned long long)count, (unsigned long long)want);
    }
    if ((flags & FLAG_ZSTD) ? (enc_len == 0 || enc_len >= raw_len) : enc_len != raw_len)
        return LOCO_ERR(LOCO_EPROTO, "chunk: encoded payload %llu bytes for %llu raw%s",
                        (unsigned long long)enc_len, (unsigned long long)raw_len,
                        (flags & FLAG_ZSTD) ? " (zstd)" : "");
    *info = (loco_chunk_info){
        .codec = (loco_codec_kind)codec,
        .zstd = flags & FLAG_ZSTD,
        .planes = flags & FLAG_PLANES,
        .block = (int)block,
        .chunk_index = loco_get_le32(h + 12),
        .first = first,
        .count = count,
        .raw_len = raw_len,
        .enc_len = enc_len,
        .total_len = HDR + enc_len,
    };
    return 0;
}

/* Everything about one chunk that needs no decompression: header, exact
 * length, destination range, size limit, payload checksum, and for an
 * uncompressed payload its scales and codes. */
static int check_chunk(const loco_codec *c, size_t dst_n, const void *src, size_t len,
                       loco_chunk_info *info) {
    LOCO_CHECK(loco_chunk_parse(src, len, info));
    if (len != info->total_len)
        return LOCO_ERR(LOCO_EPROTO, "chunk: %zu bytes, header says %llu", len,
                        (unsigned long long)info->total_len);
    if (info->first > dst_n || info->count > dst_n - info->first)
        return LOCO_ERR(LOCO_EPROTO, "chunk: elements [%llu, +%llu) outside a range of %zu",
                        (unsigned long long)info->first, (unsigned long long)info->count, dst_n);
    if (info->count > c->chunk_elems)
        return LOCO_ERR(LOCO_EPROTO, "chunk: %llu elements, this codec's chunks hold %zu",
                        (unsigned long long)info->count, c->chunk_elems);
    const uint8_t *payload = (const uint8_t *)src + HDR;
    if (loco_hash64(payload, info->enc_len) != loco_get_le64((const uint8_t *)src + 48) &&
        CHECKSUMS_ENFORCED)
        return LOCO_ERR(LOCO_EPROTO, "chunk %u: payload checksum mismatch", info->chunk_index);
    if (!info->zstd && !payload_ok(info, payload))
        return LOCO_ERR(LOCO_EREFUSED, "chunk %u: non-finite scale or invalid code%s",
                        info->chunk_index,
                        info->codec == LOCO_CODEC_TOPK ? ", count, index or padding" : "");
    return 0;
}

/* The chunk's quantized payload: in place, or zstd-decompressed into the
 * worker's scratch (one exact frame of the header's size) and checked. */
static int unpack_payload(loco_codec *c, int worker, const void *src,
                          const loco_chunk_info *info, const uint8_t **raw) {
    const uint8_t *payload = (const uint8_t *)src + HDR;
    if (info->zstd) {
        worker_ws *w = &c->ws[worker];
        const unsigned long long fcs = ZSTD_getFrameContentSize(payload, info->enc_len);
        if (fcs != info->raw_len)
            return LOCO_ERR(LOCO_EPROTO, "chunk %u: zstd frame content size %lld, header %llu",
                            info->chunk_index, (long long)fcs, (unsigned long long)info->raw_len);
        const size_t fsz = ZSTD_findFrameCompressedSize(payload, info->enc_len);
        if (ZSTD_isError(fsz) || fsz != info->enc_len)
            return LOCO_ERR(LOCO_EPROTO, "chunk %u: zstd payload is not exactly one frame",
                            info->chunk_index);
        if (info->raw_len > c->raw_cap)
            return LOCO_ERR(LOCO_EPROTO, "chunk %u: raw payload over the scratch buffer",
                            info->chunk_index);
        const size_t got =
            ZSTD_decompressDCtx(w->dctx, w->raw, info->raw_len, payload, info->enc_len);
        if (ZSTD_isError(got) || got != info->raw_len)
            return LOCO_ERR(LOCO_EPROTO, "chunk %u: zstd: %s", info->chunk_index,
                            ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short output");
        payload = w->raw;
        if (!payload_ok(info, payload))
            return LOCO_ERR(LOCO_EREFUSED, "chunk %u: non-finite scale or invalid code%s",
                            info->chunk_index,
                            info->codec == LOCO_CODEC_TOPK ? ", count, index or padding" : "");
    }
    *raw = payload;
    return 0;
}

/* Decompresses (when needed), checks the payload, then accumulates. */
static int apply_chunk(loco_codec *c, int worker, float *dst, float weight, const void *src,
                       const loco_chunk_info *info) {
    const uint8_t *payload = NULL;
    LOCO_CHECK(unpack_payload(c, worker, src, info, &payload));
    if (info->codec == LOCO_CODEC_TOPK) {
        loco_topk_dequant_acc(dst + info->first, payload, info->count, weight);
        return 0;
    }
    loco_dequant_acc(loco_codec_format(info->codec), dst + info->first, payload, info->count,
                     info->block, info->planes, weight);
    return 0;
}

int loco_codec_decode_chunk(loco_codec *c, int worker, float *dst, size_t dst_n, float weight,
                            const void *src, size_t len) {
    if (worker < 0 || worker >= c->n_workers)
        return LOCO_ERR(LOCO_EINVAL, "compress: worker %d outside [0, %d)", worker, c->n_workers);
    if (!isfinite(weight) || (dst_n > 0 && !dst))
        return LOCO_ERR(LOCO_EINVAL, "compress: decode with weight %g into %p", weight,
                        (void *)dst);
    loco_chunk_info info;
    LOCO_CHECK(check_chunk(c, dst_n, src, len, &info));
    LOCO_CHECK(apply_chunk(c, worker, dst, weight, src, &info));
    return 0;
}

typedef struct {
    uint64_t first, end;
    size_t chunk;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return x->first < y->first ? -1 : x->first > y->first;
}

int loco_codec_decode(loco_codec *c, float *dst, size_t dst_n, float weight, const void *base,
                      size_t base_len, const loco_chunk_ref *chunks, size_t n_chunks) {
    if (n_chunks == 0)
        return 0;
    if (!isfinite(weight) || !base || !chunks || (dst_n > 0 && !dst))
        return LOCO_ERR(LOCO_EINVAL, "compress: decode with weight %g, base %p, chunks %p", weight,
                        base, (const void *)chunks);
    for (size_t i = 0; i < n_chunks; i++)
        if (chunks[i].offset > base_len || chunks[i].len > base_len - chunks[i].offset)
            return LOCO_ERR(LOCO_EPROTO, "chunk %zu: [%zu, +%zu) outside %zu bytes", i,
                            chunks[i].offset, chunks[i].len, base_len);
    loco_chunk_info *info = loco_alloc(n_chunks * sizeof *info);
    span *spans = loco_alloc(n_chunks * sizeof *spans);
    int rc = 0;
    if (!info || !spans) {
        rc = LOCO_ERR(LOCO_ENOMEM, "compress: cannot allocate %zu chunk records", n_chunks);
        goto out_free;
    }
    const uint8_t *b = base;
    par_err err = {0};
#pragma omp parallel for num_threads(c->n_workers) schedule(dynamic, 1) if (n_chunks > 1)
    for (size_t i = 0; i < n_chunks; i++) {
        int r = check_chunk(c, dst_n, b + chunks[i].offset, chunks[i].len, &info[i]);
        if (r < 0)
            par_err_note(&err, r, i);
    }
    LOCO_CHECK_GOTO(par_err_raise(&err, "decode"), out_free);
    for (size_t i = 0; i < n_chunks; i++)
        spans[i] = (span){info[i].first, info[i].first + info[i].count, i};
    qsort(spans, n_chunks, sizeof *spans, span_cmp);
    for (size_t i = 1; i < n_chunks; i++)
        if (spans[i].first < spans[i - 1].end) {
            rc = LOCO_ERR(LOCO_EPROTO, "decode: chunks %zu and %zu overlap", spans[i - 1].chunk,
                          spans[i].chunk);
            goto out_free;
        }
#pragma omp parallel for num_threads(c->n_workers) schedule(dynamic, 1) if (n_chunks > 1)
    for (size_t i = 0; i < n_chunks; i++) {
        int r = apply_chunk(c, omp_get_thread_num(), dst, weight, b + chunks[i].offset, &info[i]);
        if (r < 0)
            par_err_note(&err, r, i);
    }
    rc = par_err_raise(&err, "decode");
out_free:
    loco_free(spans);
    loco_free(info);
    return rc;
}

/* ------------------------------------------ payloads quantized elsewhere */

int loco_codec_chunk_quant(const loco_codec *c, const loco_encode_plan *plan, size_t chunk,
                           loco_quant_args *qa, size_t *first, size_t *count, size_t *raw_len) {
    const loco_codec_params *p = &c->p;
    if (chunk >= plan->n_chunks || plan->chunk_elems != c->chunk_elems)
        return LOCO_ERR(LOCO_EINVAL, "compress: chunk %zu of a plan with %zu chunks", chunk,
                        plan->n_chunks);
    *first = chunk * c->chunk_elems;
    *count = plan->n - *first < c->chunk_elems ? plan->n - *first : c->chunk_elems;
    *raw_len = loco_codec_payload_bytes(p, *count);
    *qa = (loco_quant_args){
        .block = p->block,
        .stochastic = p->stochastic,
        .planes = planes_apply(p->codec, plan->zstd),
        .key = chunk_key(p->seed, plan->nonce, plan->state_offset + *first),
    };
    return 0;
}

int loco_codec_frame_chunk(loco_codec *c, int worker, const loco_encode_plan *plan, void *dst,
                           size_t dst_cap, size_t *dst_len, const uint8_t *raw, size_t chunk) {
    const loco_codec_params *p = &c->p;
    *dst_len = 0;
    if (worker < 0 || worker >= c->n_workers)
        return LOCO_ERR(LOCO_EINVAL, "compress: worker %d outside [0, %d)", worker, c->n_workers);
    if (chunk > UINT32_MAX)
        return LOCO_ERR(LOCO_EINVAL, "compress: chunk index %zu exceeds 32 bits", chunk);
    loco_quant_args qa;
    size_t first, count, raw_len;
    LOCO_CHECK(loco_codec_chunk_quant(c, plan, chunk, &qa, &first, &count, &raw_len));
    if (dst_cap < HDR + raw_len)
        return LOCO_ERR(LOCO_EINVAL, "compress: %zu bytes of output for a chunk of up to %zu",
                        dst_cap, HDR + raw_len);
    uint8_t *out = dst, *payload = out + HDR;
    uint32_t flags = qa.planes ? FLAG_PLANES : 0;
    size_t enc_len = raw_len;
    if (plan->zstd) {
        const size_t z = ZSTD_compressCCtx(c->ws[worker].cctx, payload, raw_len - 1, raw, raw_len,
                                           p->zstd_level);
        if (!ZSTD_isError(z)) {
            enc_len = z;
            flags |= FLAG_ZSTD;
        } else if (ZSTD_getErrorCode(z) == ZSTD_error_dstSize_tooSmall) {
            memcpy(payload, raw, raw_len);
        } else {
            return LOCO_ERR(LOCO_EIO, "compress: zstd: %s", ZSTD_getErrorName(z));
        }
    } else {
        memcpy(payload, raw, raw_len);
    }
    write_header(out, p, flags, chunk, first, count, raw_len, enc_len,
                 loco_hash64(payload, enc_len));
    *dst_len = HDR + enc_len;
    return 0;
}

int loco_codec_unframe_chunk(loco_codec *c, int worker, size_t dst_n, const void *src, size_t len,
                             loco_chunk_info *info, const uint8_t **raw) {
    if (worker < 0 || worker >= c->n_workers)
        return LOCO_ERR(LOCO_EINVAL, "compress: worker %d outside [0, %d)", worker, c->n_workers);
    LOCO_CHECK(check_chunk(c, dst_n, src, len, info));
    return unpack_payload(c, worker, src, info, raw);
}
