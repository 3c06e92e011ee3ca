/* Codec parameters: defaults, the [compress] config section, checks, names,
 * and the chunking arithmetic every size bound follows from. */
#include "compress/compress.h"

#include <math.h>
#include <string.h>
#include <zstd.h>

static const char *const codec_names[LOCO_CODEC_COUNT] = {
    [LOCO_CODEC_NONE] = "none", [LOCO_CODEC_BF16] = "bf16", [LOCO_CODEC_INT8] = "int8",
    [LOCO_CODEC_INT4] = "int4", [LOCO_CODEC_FP8] = "fp8",   [LOCO_CODEC_FP4] = "fp4",
    [LOCO_CODEC_TOPK] = "topk",
};

const char *loco_codec_name(loco_codec_kind k) {
    return (unsigned)k < LOCO_CODEC_COUNT ? codec_names[k] : "?";
}

loco_quant_format loco_codec_format(loco_codec_kind k) {
    switch (k) {
    case LOCO_CODEC_NONE: return LOCO_QFMT_NONE;
    case LOCO_CODEC_BF16: return LOCO_QFMT_BF16;
    case LOCO_CODEC_INT8: return LOCO_QFMT_INT8;
    case LOCO_CODEC_INT4: return LOCO_QFMT_INT4;
    case LOCO_CODEC_FP8: return LOCO_QFMT_FP8;
    case LOCO_CODEC_FP4: return LOCO_QFMT_FP4;
    default: return LOCO_QFMT_COUNT;
    }
}

int loco_codec_parse(const char *name, loco_codec_kind *out) {
    for (int k = 0; k < LOCO_CODEC_COUNT; k++)
        if (name && !strcmp(name, codec_names[k])) {
            *out = (loco_codec_kind)k;
            return 0;
        }
    return LOCO_ERR(LOCO_EINVAL, "unknown codec '%s' (none|bf16|int8|int4|fp8|fp4|topk)",
                    name ? name : "(null)");
}

/* The [compress] section, run.threads and train.seed into p, unchecked. */
static int fill(loco_codec_params *p, const loco_config *cfg) {
    *p = (loco_codec_params){0};
    LOCO_CHECK(loco_codec_parse(cfg->compress.codec, &p->codec));
    p->block = (int)cfg->compress.block;
    p->stochastic = !strcmp(cfg->compress.rounding, "stochastic");
    p->error_feedback = cfg->compress.error_feedback;
    if (!strcmp(cfg->compress.zstd, "on"))
        p->zstd = LOCO_ZSTD_ON;
    else if (!strcmp(cfg->compress.zstd, "off"))
        p->zstd = LOCO_ZSTD_OFF;
    else
        p->zstd = LOCO_ZSTD_AUTO;
    p->zstd_level = (int)cfg->compress.zstd_level;
    p->chunk_bytes = (size_t)cfg->compress.chunk_mb << 20;
    p->auto_min_ratio = cfg->compress.auto_min_ratio;
    p->link_gbps = cfg->compress.link_gbps;
    p->threads = (int)(cfg->compress.threads > 0 ? cfg->compress.threads : cfg->run.threads);
    p->seed = (uint64_t)cfg->train.seed;
    p->topk = cfg->compress.topk;
    p->topk_bits = (int)cfg->compress.topk_bits;
    return 0;
}

void loco_codec_params_default(loco_codec_params *p) {
    int rc = fill(p, loco_config_default());
    (void)rc; /* cannot fail: the key's choices are codec_names */
    p->seed = 0; /* callers without a config draw from seed 0, as they always did */
}

int loco_codec_params_from_config(loco_codec_params *p, const loco_config *cfg) {
    LOCO_CHECK(fill(p, cfg));
    LOCO_CHECK(loco_codec_params_check(p));
    return 0;
}

int loco_codec_params_check(const loco_codec_params *p) {
    if ((unsigned)p->codec >= LOCO_CODEC_COUNT)
        return LOCO_ERR(LOCO_EINVAL, "compress: unknown codec %d", (int)p->codec);
    if (p->block < LOCO_COMPRESS_BLOCK_MIN || p->block > LOCO_COMPRESS_BLOCK_MAX ||
        p->block % 8 != 0)
        return LOCO_ERR(LOCO_EINVAL, "compress.block = %d: expected a multiple of 8 in [%d, %d]",
                        p->block, LOCO_COMPRESS_BLOCK_MIN, LOCO_COMPRESS_BLOCK_MAX);
    if (p->chunk_bytes < 4 * (size_t)p->block || p->chunk_bytes > LOCO_COMPRESS_CHUNK_MAX)
        return LOCO_ERR(LOCO_EINVAL,
                        "compress: chunk of %zu bytes: expected one block (%d bytes) "
                        "to %zu bytes",
                        p->chunk_bytes, 4 * p->block, LOCO_COMPRESS_CHUNK_MAX);
    if ((unsigned)p->zstd > LOCO_ZSTD_AUTO)
        return LOCO_ERR(LOCO_EINVAL, "compress: unknown zstd mode %d", (int)p->zstd);
    if (p->zstd_level < ZSTD_minCLevel() || p->zstd_level > ZSTD_maxCLevel())
        return LOCO_ERR(LOCO_EINVAL, "compress.zstd_level = %d: expected [%d, %d]", p->zstd_level,
                        ZSTD_minCLevel(), ZSTD_maxCLevel());
    if (!(p->auto_min_ratio >= 0) || !isfinite(p->auto_min_ratio))
        return LOCO_ERR(LOCO_EINVAL, "compress.auto_min_ratio = %g: expected >= 0",
                        p->auto_min_ratio);
    if (!(p->link_gbps >= 0) || !isfinite(p->link_gbps))
        return LOCO_ERR(LOCO_EINVAL, "compress.link_gbps = %g: expected >= 0", p->link_gbps);
    if (p->codec == LOCO_CODEC_TOPK && p->stochastic)
        return LOCO_ERR(LOCO_EINVAL,
                        "compress.rounding = stochastic: topk rounds its values to nearest "
                        "(expected rounding = nearest)");
    if (!(p->topk > 0 && p->topk <= 1))
        return LOCO_ERR(LOCO_EINVAL, "compress.topk = %g: expected a kept fraction in (0, 1]",
                        p->topk);
    if (p->topk_bits != 2 && p->topk_bits != 4 && p->topk_bits != 8)
        return LOCO_ERR(LOCO_EINVAL, "compress.topk_bits = %d: expected 2, 4 or 8", p->topk_bits);
    if (p->threads < 0 || p->threads > 4096)
        return LOCO_ERR(LOCO_EINVAL, "compress.threads = %d: expected [0, 4096]", p->threads);
    return 0;
}

size_t loco_codec_topk_k(const loco_codec_params *p, size_t count) {
    if (count == 0)
        return 0;
    const double want = p->topk * (double)count + 0.5;
    const size_t k = want >= (double)count ? count : (size_t)want;
    return k > 0 ? k : 1;
}

size_t loco_codec_payload_bytes(const loco_codec_params *p, size_t count) {
    if (p->codec == LOCO_CODEC_TOPK)
        return loco_topk_payload_bytes(count, loco_codec_topk_k(p, count), p->topk_bits);
    return loco_quant_payload_bytes(loco_codec_format(p->codec), count, p->block);
}

size_t loco_compress_chunk_elems(const loco_codec_params *p) {
    const size_t B = (size_t)p->block;
    size_t blocks = p->chunk_bytes / 4 / B;
    return (blocks ? blocks : 1) * B;
}

size_t loco_compress_chunk_count(size_t n, const loco_codec_params *p) {
    const size_t ce = loco_compress_chunk_elems(p);
    return n / ce + (n % ce != 0);
}

size_t loco_compress_slot_bytes(const loco_codec_params *p) {
    const size_t raw = loco_codec_payload_bytes(p, loco_compress_chunk_elems(p));
    return (LOCO_CHUNK_HEADER_BYTES + raw + 63) & ~(size_t)63;
}

size_t loco_compress_bound(size_t n, const loco_codec_params *p) {
    return loco_compress_chunk_count(n, p) * loco_compress_slot_bytes(p);
}
