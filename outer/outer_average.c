/* The average of the islands' contributions to an outer step: their
 * weights, the decoding of each chunk into the sum (whole, chunk by chunk,
 * or from a reducer's bytes), and the checks that refuse a bad one before
 * anything of it is applied. */
#include "outer/outer_internal.h"

#include <math.h>

static void zero_chunk(loco_outer *o, float *buf, unsigned char *zeroed, size_t c) {
    if (zeroed[c])
        return;
    size_t lo, hi;
    loco__outer_chunk_range(o, c, &lo, &hi);
    memset(buf + lo, 0, (hi - lo) * sizeof(float));
    zeroed[c] = 1;
}

void loco_outer_begin_average(loco_outer *o, int n_islands) {
    o->refused = -1;
    o->worst_ratio = 0;
    memset(o->avg_zeroed, 0, o->refs_cap);
    memset(o->chunk_next, 0, o->refs_cap * sizeof *o->chunk_next);
    memset(o->applied, 0, o->refs_cap);
    o->expect = n_islands;
    for (int k = 0; k < LOCO_MAX_PEERS; k++) {
        o->scale[k] = 1.0f / (float)(n_islands > 0 ? n_islands : 1);
        o->unscale[k] = (double)n_islands;
    }
    o->added = 0;
    o->chunks_done = 0;
    o->use_avg2 = false;
}

int loco_outer_set_weights(loco_outer *o, const double *tokens) {
    if (!tokens || o->expect < 1)
        return 0;
    double sum = 0;
    bool equal = true;
    for (int k = 0; k < o->expect; k++) {
        if (!(tokens[k] >= 1 && tokens[k] <= LOCO_OUTER_TOKENS_MAX))
            return LOCO_ERR(LOCO_EPROTO, "outer: island %d trained on %g tokens, expected 1 to %g",
                            k, tokens[k], LOCO_OUTER_TOKENS_MAX);
        sum += tokens[k];
        equal &= tokens[k] == tokens[0];
    }
    if (equal) /* 1/K as before: equal islands keep the bits of uniform weights */
        return 0;
    for (int k = 0; k < o->expect; k++) {
        o->scale[k] = (float)(tokens[k] / sum);
        o->unscale[k] = sum / tokens[k];
    }
    return 0;
}

float loco_outer_weight(const loco_outer *o, int island) {
    return island >= 0 && island < o->expect ? o->scale[island] : 0;
}

int loco_outer_rs_plan(loco_outer *o, int64_t step) {
    LOCO_CHECK(loco__outer_host_only(o, "reduce-scatter + all-gather"));
    /* zstd=auto samples the whole avg: chunks reduced elsewhere read as 0. */
    const size_t chunks = loco_compress_chunk_count(o->n, loco_codec_get_params(o->codec));
    for (size_t c = 0; c < chunks; c++)
        zero_chunk(o, o->avg, o->avg_zeroed, c);
    memset(o->avg2_zeroed, 0, o->refs_cap);
    memset(o->final_have, 0, o->refs_cap);
    o->final_done = 0;
    o->use_avg2 = true;
    return loco_codec_plan(o->codec2, &o->plan2, o->avg, o->n, 0, (uint64_t)step);
}

int loco_outer_rs_encode_chunk(loco_outer *o, int worker, size_t chunk, const void **bytes,
                               size_t *len) {
    LOCO_CHECK(loco__outer_host_only(o, "reduce-scatter + all-gather"));
    if (chunk >= o->plan2.n_chunks)
        return LOCO_ERR(LOCO_EINVAL, "outer: chunk %zu of %zu", chunk, o->plan2.n_chunks);
    if (o->chunk_next[chunk] != o->expect)
        return LOCO_ERR(LOCO_EINVAL, "outer: chunk %zu is not reduced yet", chunk);
    unsigned char *slot = o->enc2 + chunk * o->plan2.slot_bytes;
    LOCO_CHECK(loco_codec_encode_chunk(o->codec2, worker, &o->plan2, slot, o->plan2.slot_bytes,
                                       len, o->avg, chunk));
    *bytes = slot;
    return 0;
}

int loco_outer_rs_add(loco_outer *o, int worker, size_t chunk, const void *bytes, size_t len) {
    LOCO_CHECK(loco__outer_host_only(o, "reduce-scatter + all-gather"));
    loco_chunk_info info;
    LOCO_CHECK(loco_chunk_parse(bytes, len, &info));
    const size_t per = loco_compress_chunk_elems(loco_codec_get_params(o->codec2));
    if (info.first != (uint64_t)chunk * per || chunk >= o->refs_cap || o->final_have[chunk])
        return LOCO_ERR(LOCO_EPROTO, "outer: reduced chunk %zu is not the one expected (element "
                                     "%llu) or came twice",
                        chunk, (unsigned long long)info.first);
    zero_chunk(o, o->avg2, o->avg2_zeroed, chunk);
    LOCO_CHECK(loco_codec_decode_chunk(o->codec2, worker, o->avg2, o->n, 1.0f, bytes, len));
    /* A reducer's average has nothing beside it to compare a norm with:
     * only NaN and Inf are refused here (the reducer checked the shares). */
    const size_t lo = info.first, hi = lo + per < o->n ? lo + per : o->n;
    for (size_t i = lo; i < hi; i++)
        if (!isfinite(o->avg2[i])) {
            return LOCO_ERR(LOCO_EREFUSED, "outer: refused reduced chunk %zu: NaN or Inf", chunk);
        }
    o->final_have[chunk] = 1;
    o->final_done++;
    return 0;
}

/* What island's decoded values added to avg[first, first + n) (chunk_prev
 * holds it before them): their sum of squares, and whether all of them,
 * and the sum, stayed finite. In a fixed order (loco_share_sumsq, whose
 * CUDA twin the device mode runs), so every island computes the same bits. */
static void measure_share(loco_outer *o, int island, const float *now, size_t n) {
    bool bad = false;
    o->sumsq[island] = loco_share_sumsq(now, o->chunk_prev, n, o->unscale[island], &bad);
    o->nonfinite[island] = bad;
}

/* Median of the norms of every island but `skip`. */
static double median_of_others(const loco_outer *o, int skip) {
    double v[LOCO_MAX_PEERS];
    int m = 0;
    for (int k = 0; k < o->expect; k++)
        if (k != skip)
            v[m++] = sqrt(o->sumsq[k]);
    for (int i = 1; i < m; i++) /* insertion sort: at most 63 values */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return m == 0 ? 0 : m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
}

/* Chunk c has every contribution: refuse it before anything of it is
 * applied if one island's share holds NaN or Inf (the first such island:
 * a later one only inherited it), else if one island's norm is over
 * max_delta_ratio times the median of the others' (the worst such). The
 * median of the others, not of all: with two islands the honest one's
 * norm alone is the yardstick. A median of 0 (the others sent nothing in
 * this chunk) gives no yardstick, and nothing is refused on it. */
static int check_chunk(loco_outer *o, size_t c) {
    o->refused = -1;
    for (int k = 0; k < o->expect; k++)
        if (o->nonfinite[k]) {
            o->refused = k;
            return LOCO_ERR(LOCO_EREFUSED,
                            "outer: refused the contribution of island %d: chunk %zu decodes to "
                            "NaN or Inf", k, c);
        }
    const double r = o->p.max_delta_ratio;
    if (o->expect < 2)
        return 0;
    double worst = 0, norm = 0, med = 0;
    for (int k = 0; k < o->expect; k++) {
        const double m = median_of_others(o, k), n = sqrt(o->sumsq[k]);
        if (m > 0 && n / m > o->worst_ratio)
            o->worst_ratio = n / m;
        if (r > 0 && m > 0 && n > r * m && n / m > worst) {
            worst = n / m;
            o->refused = k;
            norm = n;
            med = m;
        }
    }
    if (o->refused < 0)
        return 0;
    return LOCO_ERR(LOCO_EREFUSED,
                    "outer: refused the contribution of island %d: chunk %zu has norm %.3g, %.3g "
                    "times the median %.3g of the others' (outer.max_delta_ratio %g)",
                    o->refused, c, norm, worst, med, r);
}

int loco_outer_refused(const loco_outer *o) { return o->refused; }

double loco_outer_delta_ratio(const loco_outer *o) { return o->worst_ratio; }

void loco_outer_poison_next(loco_outer *o, float factor) { o->poison_next = factor; }

int loco_outer_add_chunk(loco_outer *o, int worker, int island, const void *bytes, size_t len) {
    loco_chunk_info info;
    LOCO_CHECK(loco_chunk_parse(bytes, len, &info));
    const size_t per = loco_compress_chunk_elems(loco_codec_get_params(o->codec));
    const size_t total = loco_compress_chunk_count(o->n, loco_codec_get_params(o->codec));
    const size_t c = (size_t)(info.first / per);
    const size_t want = o->n - info.first < per ? o->n - info.first : per;
    if (info.first % per || c >= total || info.first >= o->n || info.count != want)
        return LOCO_ERR(LOCO_EPROTO, "outer: island %d sent a chunk at element %llu that is no "
                                     "chunk of this range",
                        island, (unsigned long long)info.first);
    if (o->chunk_next[c] != island)
        return LOCO_ERR(LOCO_EPROTO, "outer: chunk %zu from island %d out of order (expected %d)",
                        c, island, o->chunk_next[c]);
    if (island < 0 || island >= LOCO_MAX_PEERS)
        return LOCO_ERR(LOCO_EINVAL, "outer: island %d", island);
#ifdef LOCO_HAVE_CUDA
    if (o->on_dev) {
        LOCO_CHECK(loco__outer_dev_add_chunk(o, worker, island, c, bytes, len));
        if (++o->chunk_next[c] < o->expect)
            return 0;
        o->chunks_done++;
        return check_chunk(o, c);
    }
#endif
    zero_chunk(o, o->avg, o->avg_zeroed, c);
    float *now = o->avg + info.first;
    memcpy(o->chunk_prev, now, want * sizeof(float));
    int rc = loco_codec_decode_chunk(o->codec, worker, o->avg, o->n, o->scale[island], bytes,
                                     len);
    if (rc == LOCO_EREFUSED) /* well-formed, but NaN or Inf where a scale or value is */
        o->refused = island;
    LOCO_CHECK(rc);
    measure_share(o, island, now, want);
    if (++o->chunk_next[c] < o->expect)
        return 0;
    o->chunks_done++;
    return check_chunk(o, c);
}

int loco_outer_add(loco_outer *o, const void *bytes, size_t len) {
    LOCO_CHECK(loco__outer_host_only(o, "the whole-range add"));
    if (o->added >= o->expect)
        return LOCO_ERR(LOCO_EINVAL, "outer: more contributions than the %d announced", o->expect);
    /* Walk the chunk headers: they must tile the message and cover the range
     * exactly once, in order. */
    const unsigned char *b = bytes;
    size_t off = 0, covered = 0, k = 0;
    while (off < len) {
        loco_chunk_info info;
        LOCO_CHECK(loco_chunk_parse(b + off, len - off, &info));
        if (info.total_len > len - off || info.first != covered || k + 1 >= o->refs_cap)
            return LOCO_ERR(LOCO_EPROTO,
                            "outer: chunk %zu at byte %zu does not continue the range (first %llu, "
                            "expected %zu)",
                            k, off, (unsigned long long)info.first, covered);
        o->refs[k].offset = off;
        o->refs[k].len = (size_t)info.total_len;
        covered += (size_t)info.count;
        off += (size_t)info.total_len;
        k++;
    }
    if (covered != o->n)
        return LOCO_ERR(LOCO_EPROTO, "outer: contribution covers %zu of %zu elements", covered,
                        o->n);
    for (size_t c = 0; c < k; c++)
        zero_chunk(o, o->avg, o->avg_zeroed, c);
    LOCO_CHECK(loco_codec_decode(o->codec, o->avg, o->n, o->scale[o->added], bytes, len,
                                 o->refs, k));
    o->added++;
    return 0;
}

/* The outer optimizer on [lo, hi): element by element, so the bits depend
 * neither on the thread count nor on how the range is cut. */
