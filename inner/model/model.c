/* The model over flat buffers (llm.c's structure, Hugging Face's names and
 * layouts), on one rank or on a tensor-parallel slice: its units, views,
 * lifecycle and initialisation. The description and the table it makes
 * are model_desc.c; the passes are model_pass.c; model_tp.c
 * holds the tp pieces, model_stage.c the pipeline stages, model_acts.c
 * the activation slab. Every loop lives in kernels/. */
#include "inner/comm/comm.h"
#include "inner/model/internal.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* The unit a tensor of the (whole or stage) table belongs to: 0 for wte
 * and wpe, l + 1 for block l, L + 1 for ln_f and a wte that follows it. */
int loco__gpt_unit_of(const loco_tensor *t, int L, bool after_lnf) {
    int l;
    if (sscanf(t->name, "transformer.h.%d.", &l) == 1)
        return l + 1;
    if (strstr(t->name, ".ln_f.") || !strcmp(t->name, "lm_head.weight") || after_lnf)
        return L + 1;
    return 0;
}

/* Fills unit_t0 / unit_t1 from the table: the tensors of each unit. */
static void index_units(loco_gpt *m) {
    const int L = m->cfg.n_layer;
    for (int u = 0; u < L + 2; u++)
        m->unit_t0[u] = m->unit_t1[u] = 0;
    bool after_lnf = false;
    for (int i = 0; i < m->tt.n; i++) {
        const int u = loco__gpt_unit_of(&m->tt.t[i], L, after_lnf);
        after_lnf |= u == L + 1;
        if (m->unit_t1[u] == m->unit_t0[u])
            m->unit_t0[u] = i;
        m->unit_t1[u] = i + 1;
    }
}

int loco_gpt_num_units(const loco_gpt *m) {
    return m->cfg.n_layer + 2;
}

bool loco_gpt_holds_unit(const loco_gpt *m, int unit) {
    return unit >= 0 && unit < m->cfg.n_layer + 2 && m->unit_t1[unit] > m->unit_t0[unit];
}

/* Tensor indices [*first, *last) of a unit in the table. */
static void unit_tensors(const loco_gpt *m, int unit, int *first, int *last) {
    *first = m->unit_t0[unit];
    *last = m->unit_t1[unit];
}

void loco_gpt_unit_range(const loco_gpt *m, int unit, size_t *lo, size_t *hi) {
    int first, last;
    unit_tensors(m, unit, &first, &last);
    if (first == last) { /* not held */
        *lo = *hi = 0;
        return;
    }
    *lo = m->tt.t[first].offset;
    *hi = m->tt.t[last - 1].offset + m->tt.t[last - 1].numel;
}

/* Points one unit's views of `v` at base, which holds the unit's range. */
static void bind_views(loco_gpt *m, loco_gpt_tensors *v, int unit, float *base) {
    int i, last;
    unit_tensors(m, unit, &i, &last);
    const size_t lo = m->tt.t[i].offset;
#define NEXT (base + (m->tt.t[i++].offset - lo))
    if (i == last)
        return; /* not held */
    if (unit == 0) {
        v->wte = NEXT;
        if (m->cfg.pos == LOCO_POS_LEARNED)
            v->wpe = NEXT;
    } else if (unit <= m->cfg.n_layer) {
        loco_gpt_block *b = &v->h[unit - 1];
        loco__gpt_block_tensor bt[LOCO__GPT_BLOCK_TENSORS_MAX];
        const int nb = loco__gpt_block_tensors(&m->cfg, unit - 1, bt);
        for (int k = 0; k < nb; k++)
            *(float **)((char *)b + bt[k].field) = NEXT;
        if (loco_gpt_is_moe(&m->cfg, unit - 1)) { /* the experts follow back to back */
            const int per = m->cfg.no_bias ? 2 : 4; /* tensors of one expert */
            b->shared = NULL;
            if (m->cfg.n_shared_experts > 0) {
                b->shared = NEXT;
                i += per * m->cfg.n_shared_experts - 1;
            }
            b->experts = NEXT;
        }
    } else {
        v->lnfw = NEXT;
        if (m->cfg.norm == LOCO_NORM_LAYERNORM)
            v->lnfb = NEXT;
        if (i < last && m->cfg.untied)
            v->lm_head = NEXT;
        else if (i < last) /* the tied head's own wte (a stage without the embeddings) */
            v->wte = NEXT;
    }
#undef NEXT
}

void loco_gpt_bind_unit(loco_gpt *m, int unit, float *params, float *grads) {
    bind_views(m, &m->p, unit, params);
    if (grads)
        bind_views(m, &m->g, unit, grads);
}

void loco_gpt_set_hooks(loco_gpt *m, const loco_gpt_hooks *hooks) {
    if (hooks)
        m->hooks = *hooks;
    else
        memset(&m->hooks, 0, sizeof m->hooks);
}

loco__gpt_shape loco__gpt_shape_of(const loco_gpt *m, int B, int T) {
    loco__gpt_shape d;
    d.t = loco__gpt_tp_of(&m->cfg);
    d.k = m->tp_rank;
    d.sp = m->par.sp;
    d.N = (size_t)B * (size_t)T;
    d.R = d.sp ? d.N / (size_t)d.t : d.N;
    d.row0 = d.sp ? d.R * (size_t)d.k : 0;
    d.C = m->cfg.n_embd;
    d.Cl = d.C / d.t;
    d.NHl = m->cfg.n_head / d.t;
    d.hs = loco_gpt_head_size(&m->cfg);
    d.NKVl = loco__gpt_kv_local(&m->cfg);
    d.Wl = loco__gpt_qkv_local(&m->cfg);
    d.Fl = loco_gpt_fc_width(&m->cfg) / d.t;
    d.Hl = loco_gpt_ffn(&m->cfg) / d.t;
    d.Wa = d.Wl;
    if (m->cp && m->cp->algo == LOCO_CP_ULYSSES && m->cp->c * m->cp->wu > d.Wl)
        d.Wa = m->cp->c * m->cp->wu;
    d.Vl = loco_gpt_vocab_padded(&m->cfg) / d.t;
    d.v_lo = d.k * d.Vl;
    int valid = m->cfg.vocab_size - d.v_lo;
    d.v_valid = valid < 0 ? 0 : valid > d.Vl ? d.Vl : valid;
    return d;
}

/* Whether block l (0-based) reruns its forward in its backward. */
bool loco__gpt_full_recompute(const loco_gpt *m, int l) {
    return m->par.recompute == LOCO_RECOMPUTE_FULL &&
           (m->par.recompute_layers <= 0 || l < m->par.recompute_layers);
}

bool loco_gpt_tensor_replicated(const loco_gpt *m, int i) {
    return m->tt.t[i].split_dim < 0;
}

/* The parallel settings against the model's shape and the group. */
static int check_parallel(const loco_gpt_config *cfg, int B, int T, const loco_gpt_parallel *par) {
    const int t = loco__gpt_tp_of(cfg);
    if (par->sp && t < 2)
        return LOCO_ERR(LOCO_EINVAL, "parallel.sp = true needs parallel.tp > 1 (sequence "
                                     "parallelism splits the tensor-parallel group's work)");
    if (t > 1 && (!par->tp || loco_comm_size(par->tp) != t))
        return LOCO_ERR(LOCO_EINVAL, "model split over tp = %d ranks needs a group of %d ranks", t,
                        t);
    if (par->sp && ((size_t)B * (size_t)T) % (size_t)t)
        return LOCO_ERR(LOCO_EINVAL,
                        "parallel.sp: the %d x %d tokens of a micro-batch do not split evenly "
                        "over tp = %d ranks (train.batch_size x model.seq_len must divide by tp)",
                        B, T, t);
    LOCO_CHECK(loco__gpt_cp_check(cfg, B, T, par));
    LOCO_CHECK(loco__gpt_moe_check(cfg, par));
    if (par->recompute_layers < 0 || par->recompute_layers > cfg->n_layer)
        return LOCO_ERR(LOCO_EINVAL, "train.recompute_layers = %d: the model has %d blocks",
                        par->recompute_layers, cfg->n_layer);
    return 0;
}

static void gpt_fini(loco_gpt *m);

/* Fills the zeroed *m; on failure finalises it. */
static int gpt_init(loco_gpt *m, const loco_gpt_config *cfg, int B, int T, unsigned flags,
                    const loco_gpt_parallel *par) {
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd % cfg->n_head || cfg->vocab_size < 2 ||
        T < 1 || T > cfg->seq_len || B < 1)
        return LOCO_ERR(LOCO_EINVAL, "bad model shape: L=%d NH=%d C=%d V=%d maxT=%d for B=%d T=%d",
                        cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->seq_len, B,
                        T);
    static const loco_gpt_parallel none = {0};
    if (!par)
        par = &none;
    LOCO_CHECK(loco__gpt_check_description(cfg));
    LOCO_CHECK(check_parallel(cfg, B, T, par));
    m->cfg = *cfg;
    m->cfg.tp = loco__gpt_tp_of(cfg);
    m->par = *par;
    if (m->cfg.tp == 1)
        m->par.tp = NULL;
    m->tp_rank = m->par.tp ? loco_comm_rank(m->par.tp) : 0;
    m->B = B;
    m->T = T;
    m->par.stage = NULL;
    if (par->stage) { /* kept by value: the caller's may go */
        m->stage = *par->stage;
        m->staged = true;
    }
    int rc;
    if (m->staged)
        LOCO_CHECK_GOTO(loco_gpt_build_stage_table(&m->tt, &m->cfg, &m->stage), out_fail);
    else
        LOCO_CHECK_GOTO(loco_gpt_build_table(&m->tt, &m->cfg), out_fail);
    m->n_params = m->tt.numel;
    const int L = cfg->n_layer, slots = m->staged ? m->stage.slots : 1;
    m->unit_t0 = loco_alloc((size_t)(L + 2) * 2 * sizeof(int));
    if (!m->unit_t0) {
        rc = LOCO_ERR(LOCO_ENOMEM, "unit table");
        goto out_fail;
    }
    m->unit_t1 = m->unit_t0 + L + 2;
    index_units(m);
    m->embed = loco_gpt_holds_unit(m, 0);
    m->head = loco_gpt_holds_unit(m, L + 1);
    bool want_p = !(flags & LOCO_GPT_NO_PARAMS), want_g = !(flags & LOCO_GPT_NO_GRADS);
    if (want_p)
        m->params = loco_alloc(m->n_params * sizeof(float));
    if (want_g)
        m->grads = loco_alloc(m->n_params * sizeof(float));
    m->p.h = loco_alloc((size_t)L * sizeof(loco_gpt_block));
    m->g.h = loco_alloc((size_t)L * sizeof(loco_gpt_block));
    m->slot_acts = loco_alloc((size_t)slots * sizeof(loco_gpt_acts));
    loco_gpt_layer_acts *layers = loco_alloc((size_t)slots * L * sizeof(loco_gpt_layer_acts));
    if (m->slot_acts && layers)
        for (int k = 0; k < slots; k++)
            m->slot_acts[k].layer = layers + (size_t)k * L;
    else
        loco_free(layers);
    m->tp_counts = loco_alloc((size_t)m->cfg.tp * sizeof(size_t));
    const bool want_a = !(flags & LOCO_GPT_NO_ACTS);
    /* Counted always (block_act_bytes tells what a block would keep), held
     * only when wanted. */
    LOCO_CHECK_GOTO(loco__gpt_cp_init(m, B, T), out_fail);
    LOCO_CHECK_GOTO(loco__gpt_moe_init(m), out_fail);
    size_t n_act = loco__gpt_carve_acts(m, NULL);
    if (!want_a)
        n_act = 0;
    m->act_bytes = n_act * sizeof(float) + (m->cp ? m->cp->bytes_held : 0);
    if (want_a)
        m->act_slab = loco_alloc(n_act * sizeof(float));
    if ((want_p && !m->params) || (want_g && !m->grads) || !m->p.h || !m->g.h || !m->slot_acts ||
        !m->slot_acts[0].layer || !m->tp_counts || (want_a && !m->act_slab)) {
        rc = LOCO_ERR(LOCO_ENOMEM, "model of %zu parameters and %zu activation floats", m->n_params,
                      n_act);
        goto out_fail;
    }
    m->a = m->slot_acts[0];
    if (want_a)
        loco__gpt_carve_acts(m, m->act_slab);
    if (m->cfg.tp > 1 && loco__gpt_kv_rep(&m->cfg) > 1) {
        const size_t hs = (size_t)loco_gpt_head_size(cfg), C = (size_t)cfg->n_embd;
        const size_t keep = (C + 1) * 2 * hs, all = keep * (size_t)loco_gpt_kv_heads(cfg);
        m->kv_keep = loco_alloc((keep + all) * sizeof(float));
        if (!m->kv_keep) {
            rc = LOCO_ERR(LOCO_ENOMEM, "replicated key/value gradients");
            goto out_fail;
        }
        m->kv_all = m->kv_keep + keep;
    }
    if (cfg->pos == LOCO_POS_ROPE) {
        const int hs = loco_gpt_head_size(cfg);
        const size_t n = (size_t)cfg->seq_len * (size_t)(hs / 2);
        m->rope_cos = loco_alloc(2 * n * sizeof(float));
        if (!m->rope_cos) {
            rc = LOCO_ERR(LOCO_ENOMEM, "RoPE tables of %zu floats", 2 * n);
            goto out_fail;
        }
        m->rope_sin = m->rope_cos + n;
        const loco_rope_scaling sc = {cfg->rope_factor, cfg->rope_low_freq, cfg->rope_high_freq,
                                      cfg->rope_original_max_pos};
        loco_rope_tables(m->rope_cos, m->rope_sin, cfg->seq_len, hs,
                         cfg->rope_theta > 0 ? cfg->rope_theta : 10000.0f, &sc);
    }
    for (int u = 0; u < loco_gpt_num_units(m); u++) {
        size_t lo, hi;
        loco_gpt_unit_range(m, u, &lo, &hi);
        if (m->params)
            bind_views(m, &m->p, u, m->params + lo);
        if (m->grads)
            bind_views(m, &m->g, u, m->grads + lo);
    }
    return 0;
out_fail:
    gpt_fini(m);
    return rc;
}

static void gpt_fini(loco_gpt *m) {
    loco_ttable_fini(&m->tt);
    loco_free(m->params);
    loco_free(m->grads);
    loco_free(m->p.h);
    loco_free(m->g.h);
    if (m->slot_acts)
        loco_free(m->slot_acts[0].layer);
    loco_free(m->slot_acts);
    loco_free(m->unit_t0);
    loco_free(m->tp_counts);
    loco_free(m->act_slab);
    loco_free(m->rope_cos);
    loco_free(m->kv_keep);
    loco__gpt_cp_fini(m);
    loco__gpt_moe_fini(m);
    memset(m, 0, sizeof *m);
}

int loco_gpt_create(loco_gpt **out, const loco_gpt_config *cfg, int B, int T) {
    return loco_gpt_create_par(out, cfg, B, T, 0, NULL);
}

int loco_gpt_create_ex(loco_gpt **out, const loco_gpt_config *cfg, int B, int T, unsigned flags) {
    return loco_gpt_create_par(out, cfg, B, T, flags, NULL);
}

int loco_gpt_create_par(loco_gpt **out, const loco_gpt_config *cfg, int B, int T, unsigned flags,
                        const loco_gpt_parallel *par) {
    *out = NULL;
    loco_gpt *m = loco_alloc(sizeof *m);
    if (!m)
        return LOCO_ERR(LOCO_ENOMEM, "model");
    memset(m, 0, sizeof *m);
    int rc = gpt_init(m, cfg, B, T, flags, par);
    if (rc < 0) {
        loco_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void loco_gpt_destroy(loco_gpt *m) {
    if (!m)
        return;
    gpt_fini(m);
    loco_free(m);
}

const loco_gpt_config *loco_gpt_cfg(const loco_gpt *m) {
    return &m->cfg;
}

const loco_ttable *loco_gpt_table(const loco_gpt *m) {
    return &m->tt;
}

size_t loco_gpt_num_params(const loco_gpt *m) {
    return m->n_params;
}

float *loco_gpt_params(const loco_gpt *m) {
    return m->params;
}

float *loco_gpt_grads(const loco_gpt *m) {
    return m->grads;
}

const loco_gpt_tensors *loco_gpt_param_views(const loco_gpt *m) {
    return &m->p;
}

const loco_gpt_tensors *loco_gpt_grad_views(const loco_gpt *m) {
    return &m->g;
}

void loco_gpt_capacity(const loco_gpt *m, int *B, int *T) {
    *B = m->B;
    *T = m->T;
}

const loco_gpt_parallel *loco_gpt_parallel_of(const loco_gpt *m) {
    return &m->par;
}

int loco_gpt_tp_rank(const loco_gpt *m) {
    return m->tp_rank;
}

const loco_gpt_stage *loco_gpt_stage_of(const loco_gpt *m) {
    return m->staged ? &m->stage : NULL;
}

const float *loco_gpt_logits(const loco_gpt *m) {
    return m->a.logits;
}

size_t loco_gpt_act_bytes(const loco_gpt *m) {
    return m->act_bytes;
}

size_t loco_gpt_block_act_bytes(const loco_gpt *m) {
    return m->block_act_bytes;
}

loco_gpt_comm_stats loco_gpt_tp_comm_stats(const loco_gpt *m) {
    return m->comm;
}

/* The value GPT-2's initialisation draws for every element of the whole
 * model, in order, whatever slice this rank holds; `keep` stores it. */
void loco_gpt_init_weights_range(const loco_gpt *m, loco_rng *rng, float *dst, size_t lo,
                                 size_t hi) {
    const float std = 0.02f;
    const float proj_std = std / sqrtf(2.0f * (float)m->cfg.n_layer);
    const int t = m->cfg.tp > 1 ? m->cfg.tp : 1;
    /* The whole model's tensors in order; each one's place in this rank's
     * table (a tp slice, a pipeline stage) is found by name. */
    loco_ttable whole;
    const loco_ttable *tt = &m->tt;
    const bool ep = m->cfg.ep > 1;
    if (t > 1 || m->staged || ep) {
        loco_gpt_config one = m->cfg;
        one.tp = 1;
        one.ep = 1, one.ep_rank = 0; /* every expert */
        if (loco_gpt_build_table(&whole, &one) < 0)
            return; /* the sliced table of the same shapes was built */
        tt = &whole;
    }
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t_whole = &tt->t[i];
        const int mine = m->staged || ep ? loco_ttable_find(&m->tt, t_whole->name) : i;
        const loco_tensor *t_mine = mine >= 0 ? &m->tt.t[mine] : NULL;
        const char *name = t_whole->name;
        size_t len = strlen(name);
        bool is_weight = len > 7 && !strcmp(name + len - 7, ".weight");
        bool is_ln = strstr(name, ".ln_") != NULL;
        for (size_t g = 0; g < t_whole->numel; g++) {
            float v;
            if (t_whole->ndim == 2) /* every 2-D tensor draws, kept or not */
                v = (strstr(name, "c_proj.weight") ? proj_std : std) * loco_rng_normal(rng);
            else
                v = (is_ln && is_weight) ? 1.0f : 0.0f;
            if (!t_mine)
                continue; /* drawn all the same: the stream is the whole model's */
            int rank = 0;
            size_t j = g;
            if (t > 1) {
                loco_gpt_tp_locate(t_whole, t, g, &rank, &j);
                const int reps = (int)loco_gpt_tp_replicas(t_whole, t, g);
                if (rank >= 0 && (m->tp_rank < rank || m->tp_rank >= rank + reps))
                    continue;
            }
            size_t k = t_mine->offset + j;
            if (k >= lo && k < hi)
                dst[k - lo] = v;
        }
    }
    /* Vocabulary padding rows are zero. */
    const int wte_at = loco_ttable_find(&m->tt, "transformer.wte.weight");
    if (t > 1 && wte_at >= 0) {
        const loco_tensor *wte = &m->tt.t[wte_at];
        for (size_t j = 0; j < wte->numel; j++) {
            size_t g, k = wte->offset + j;
            if (!loco_gpt_tp_global(&tt->t[0], t, m->tp_rank, j, &g) && k >= lo && k < hi)
                dst[k - lo] = 0.0f;
        }
    }
    if (tt != &m->tt)
        loco_ttable_fini(&whole);
}

void loco_gpt_init_weights(loco_gpt *m, loco_rng *rng) {
    loco_gpt_init_weights_range(m, rng, m->params, 0, m->n_params);
}

void loco_gpt_zero_grad(loco_gpt *m) {
    if (m->grads)
        memset(m->grads, 0, m->n_params * sizeof(float));
}

