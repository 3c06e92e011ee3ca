/* Streaming DiLoCo's fragments (Douillard et al. 2025): the owned range of
 * the flat parameter buffer split into F groups of transformer blocks,
 * strided through depth (block l in fragment l % F), so each outer step
 * can exchange one fragment while the others keep training. The map is a
 * list of intervals of the owned range; a fragment's elements travel as
 * one packed vector, in buffer order. */
#include "outer/outer.h"

#include <stdio.h>
#include <string.h>

static int check_count(int F, int n_layer) {
    if (F < 1 || F > LOCO_MAX_FRAGMENTS || F > n_layer)
        return LOCO_ERR(LOCO_EINVAL, "%d fragments of %d blocks (1..min(%d, blocks) allowed)", F,
                        n_layer, LOCO_MAX_FRAGMENTS);
    return 0;
}

/* Fragment of a tensor name; `after_last` says a tensor of the last block
 * or ln_f came before it in the buffer (a head without a block index then
 * follows the last block). */
static int fragment_of(const char *name, int F, int n_layer, bool after_last) {
    LOCO_CHECK(check_count(F, n_layer));
    const int last = (n_layer - 1) % F;
    int l;
    if (sscanf(name, "transformer.h.%d.", &l) == 1) {
        if (l < 0 || l >= n_layer)
            return LOCO_ERR(LOCO_EINVAL, "tensor %s: block %d of a %d-block model", name, l,
                            n_layer);
        return l % F;
    }
    /* The embeddings, the tied head's copy of wte on a last pipeline stage
     * included: both copies then move in the same outer step. */
    if (!strncmp(name, "transformer.wte.", 16) || !strncmp(name, "transformer.wpe.", 16))
        return 0;
    if (after_last || !strncmp(name, "transformer.ln_f.", 17) || !strncmp(name, "lm_head.", 8))
        return last;
    return 0;
}

int loco_fragment_of(const char *tensor_name, int F, int n_layer) {
    return fragment_of(tensor_name, F, n_layer, false);
}

int loco_fragments_plan(loco_fragments *fr, int F, int n_layer, const loco_ttable *tt, size_t lo,
                        size_t hi) {
    memset(fr, 0, sizeof *fr);
    LOCO_CHECK(check_count(F, n_layer));
    if (lo > hi || hi > tt->numel)
        return LOCO_ERR(LOCO_EINVAL, "owned range [%zu, %zu) outside a buffer of %zu elements", lo,
                        hi, tt->numel);
    /* At most one interval per tensor. */
    loco_frag_interval *iv = loco_alloc((size_t)(tt->n > 0 ? tt->n : 1) * sizeof *iv);
    if (!iv)
        return LOCO_ERR(LOCO_ENOMEM, "fragment map of %d tensors", tt->n);
    fr->F = F;
    fr->n = hi - lo;
    fr->iv = iv;
    bool after_last = false;
    char last_block[32];
    snprintf(last_block, sizeof last_block, "transformer.h.%d.", n_layer - 1);
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        const int f = fragment_of(t->name, F, n_layer, after_last);
        if (f < 0) {
            loco_fragments_fini(fr);
            return f;
        }
        after_last |= !strncmp(t->name, last_block, strlen(last_block)) ||
                      !strncmp(t->name, "transformer.ln_f.", 17);
        const size_t a = t->offset > lo ? t->offset : lo;
        const size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b)
            continue;
        loco_frag_interval *prev = fr->n_iv ? &iv[fr->n_iv - 1] : NULL;
        if (prev && prev->frag == f && prev->lo + prev->len == a - lo)
            prev->len += b - a;
        else
            iv[fr->n_iv++] = (loco_frag_interval){a - lo, b - a, fr->n_f[f], f};
        fr->n_f[f] += b - a;
    }
    return 0;
}

void loco_fragments_fini(loco_fragments *fr) {
    loco_free(fr->iv);
    memset(fr, 0, sizeof *fr);
}

void loco_fragments_gather(const loco_fragments *fr, int f, const float *own, float *packed) {
    for (int i = 0; i < fr->n_iv; i++) {
        const loco_frag_interval *v = &fr->iv[i];
        if (v->frag == f)
            memcpy(packed + v->packed, own + v->lo, v->len * sizeof(float));
    }
}

void loco_fragments_merge(const loco_fragments *fr, int f, const float *packed, float *own,
                          float alpha) {
    for (int i = 0; i < fr->n_iv; i++) {
        const loco_frag_interval *v = &fr->iv[i];
        if (v->frag != f)
            continue;
        float *dst = own + v->lo;
        const float *src = packed + v->packed;
        if (alpha == 0.0f) { /* a copy, not 0*own + src: -0.0 and NaNs in own stay out */
            memcpy(dst, src, v->len * sizeof(float));
            continue;
        }
        for (size_t j = 0; j < v->len; j++)
            dst[j] = alpha * dst[j] + (1.0f - alpha) * src[j];
    }
}

bool loco_fragments_contiguous(const loco_fragments *fr, int f, size_t *lo) {
    int found = 0;
    *lo = 0;
    for (int i = 0; i < fr->n_iv && found < 2; i++)
        if (fr->iv[i].frag == f && found++ == 0)
            *lo = fr->iv[i].lo;
    return found <= 1;
}
