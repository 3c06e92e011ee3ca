/* Fine-tuning from released Hugging Face GPT-2 weights: a directory as
 * GPT2LMHeadModel.save_pretrained writes it (config.json, model.safetensors)
 * into the flat parameters of a model or of one rank's part of it.
 *
 * loco's table already uses Hugging Face's names and layouts (Conv1D
 * weights [in, out], c_attn's columns q | k | v), so the mapping is by
 * name: the file's tensors, with or without the "transformer." prefix, are
 * the tensors of the tp = 1 table; a tp slice or pipeline stage takes its
 * elements by loco_gpt_tp_global. Everything is checked before anything is
 * written: config.json against the model, every tensor's presence, dtype
 * and shape, no unknown tensor, the head tied. */
#include "inner/ckpt/internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>

#define HF_PREFIX "transformer."

void loco__hf_file_close(hf_file *f) {
    cJSON_Delete(f->header);
    loco_free(f->e);
    loco_free(f->file);
}

static int dtype_of(const char *s, size_t *esize) {
    static const struct {
        const char *name;
        int dtype;
        size_t size;
    } k[] = {{"F32", HF_F32, 4},   {"F16", HF_F16, 2},   {"BF16", HF_BF16, 2}, {"F64", HF_OTHER, 8},
             {"I64", HF_OTHER, 8}, {"I32", HF_OTHER, 4}, {"I16", HF_OTHER, 2}, {"U8", HF_OTHER, 1},
             {"I8", HF_OTHER, 1},  {"BOOL", HF_OTHER, 1}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (!strcmp(s, k[i].name)) {
            *esize = k[i].size;
            return k[i].dtype;
        }
    *esize = 0;
    return -1;
}

/* Reads and validates a safetensors file: header length, JSON, dtypes,
 * shapes against byte counts, offsets inside the data (a truncated file is
 * named as such). */
int loco__hf_file_open(hf_file *f, const char *dir) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s/model.safetensors", dir);
    LOCO_CHECK(loco_file_read(f->path, (void **)&f->file, &f->len));
    if (f->len < 8)
        return LOCO_ERR(LOCO_EPROTO, "init_from %s: %zu bytes, too short for a safetensors file",
                        f->path, f->len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | f->file[i];
    if (hlen > f->len - 8)
        return LOCO_ERR(LOCO_EPROTO,
                        "init_from %s: header of %llu bytes but the file has %zu (truncated?)",
                        f->path, (unsigned long long)hlen, f->len);
    f->header = cJSON_ParseWithLength((const char *)f->file + 8, hlen);
    if (!cJSON_IsObject(f->header))
        return LOCO_ERR(LOCO_EPROTO, "init_from %s: the header is not a JSON object", f->path);
    const unsigned char *data = f->file + 8 + hlen;
    const size_t data_len = f->len - 8 - hlen;
    f->e = loco_alloc((size_t)(cJSON_GetArraySize(f->header) + 1) * sizeof *f->e);
    if (!f->e)
        return LOCO_ERR(LOCO_ENOMEM, "safetensors entries");
    cJSON *it;
    cJSON_ArrayForEach(it, f->header) {
        if (!strcmp(it->string, "__metadata__"))
            continue;
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
            cJSON_GetArraySize(off) != 2 || cJSON_GetArraySize(sh) > LOCO_TENSOR_MAX_DIM)
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: tensor '%s' lacks a dtype, shape (at most %d dims) "
                            "or data_offsets",
                            f->path, it->string, LOCO_TENSOR_MAX_DIM);
        hf_entry *e = &f->e[f->n];
        size_t esize;
        e->name = it->string;
        e->dtype_name = dt->valuestring;
        e->dtype = dtype_of(dt->valuestring, &esize);
        if (e->dtype < 0)
            return LOCO_ERR(LOCO_EPROTO, "init_from %s: tensor '%s' has unknown dtype '%s'",
                            f->path, it->string, dt->valuestring);
        e->ndim = cJSON_GetArraySize(sh);
        double numel = 1;
        for (int d = 0; d < e->ndim; d++) {
            const cJSON *x = cJSON_GetArrayItem(sh, d);
            if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e12 ||
                x->valuedouble != floor(x->valuedouble))
                return LOCO_ERR(LOCO_EPROTO, "init_from %s: tensor '%s' has a bad shape", f->path,
                                it->string);
            e->shape[d] = (int64_t)x->valuedouble;
            numel *= x->valuedouble;
        }
        const cJSON *b = cJSON_GetArrayItem(off, 0), *en = cJSON_GetArrayItem(off, 1);
        if (!cJSON_IsNumber(b) || !cJSON_IsNumber(en) || b->valuedouble < 0 ||
            en->valuedouble < b->valuedouble || b->valuedouble != floor(b->valuedouble) ||
            en->valuedouble != floor(en->valuedouble))
            return LOCO_ERR(LOCO_EPROTO, "init_from %s: tensor '%s' has bad data_offsets", f->path,
                            it->string);
        if (en->valuedouble > (double)data_len)
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: tensor '%s' ends at data byte %.0f but the file holds "
                            "%zu data bytes (truncated?)",
                            f->path, it->string, en->valuedouble, data_len);
        if (numel * (double)esize != en->valuedouble - b->valuedouble)
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: tensor '%s' shape needs %.0f bytes, data_offsets "
                            "give %.0f",
                            f->path, it->string, numel * (double)esize,
                            en->valuedouble - b->valuedouble);
        e->data = data + (size_t)b->valuedouble;
        e->numel = (size_t)numel;
        f->n++;
    }
    return 0;
}

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f)
        bits = sign | 0x7f800000u | (man << 13); /* inf, nan */
    else if (exp != 0)
        bits = sign | ((exp + 112) << 23) | (man << 13);
    else if (man == 0)
        bits = sign;
    else { /* subnormal: normalise */
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

/* Element i of a tensor as fp32 (the file's data may be unaligned). */
float loco__hf_elem(const hf_entry *e, size_t i) {
    if (e->dtype == HF_F32) {
        float x;
        memcpy(&x, e->data + 4 * i, 4);
        return x;
    }
    uint16_t h;
    memcpy(&h, e->data + 2 * i, 2);
    if (e->dtype == HF_F16)
        return f16_to_f32(h);
    const uint32_t bits = (uint32_t)h << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

void loco__hf_shape_str(char *out, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap)
        snprintf(out + n, cap - n, "]");
}

/* ----------------------------------------------------------- config.json */

static bool json_int(const cJSON *root, const char *key, long long *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(x))
        return false;
    *out = (long long)x->valuedouble;
    return true;
}

/* Appends one complaint to why[cap], "; "-separated. */
void loco__hf_complain(char *why, size_t cap, const char *fmt, ...) {
    size_t n = strlen(why);
    if (n && n + 2 < cap) {
        memcpy(why + n, "; ", 3);
        n += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why + n, cap - n, fmt, ap);
    va_end(ap);
}

#define complain loco__hf_complain

/* "key = X but model.mkey = Y" appended to why. */
static void mismatch(char *why, size_t cap, const char *key, long long file, const char *mkey,
                     long long model) {
    complain(why, cap, "%s = %lld but model.%s = %lld", key, file, mkey, model);
}

/* Checks DIR/config.json against the model; *n_positions receives the
 * position rows the file holds. Every mismatch is named in one message. */
static int check_config(const char *dir, const loco_gpt_config *mc, int64_t *n_positions,
                        bool *tied) {
    char path[LOCO_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    size_t len;
    LOCO_CHECK(loco_file_read(path, (void **)&text, &len));
    cJSON *root = cJSON_ParseWithLength(text, len);
    loco_free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return LOCO_ERR(LOCO_EPROTO, "init_from %s: not a JSON object", path);
    }
    char why[2048] = "";
    long long v;
    static const char *const need[] = {"n_layer", "n_head", "n_embd", "vocab_size"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!json_int(root, need[i], &v))
            complain(why, sizeof why, "%s missing (a number)", need[i]);
    if (json_int(root, "n_layer", &v) && v != mc->n_layer)
        mismatch(why, sizeof why, "n_layer", v, "n_layer", mc->n_layer);
    if (json_int(root, "n_head", &v) && v != mc->n_head)
        mismatch(why, sizeof why, "n_head", v, "n_head", mc->n_head);
    if (json_int(root, "n_embd", &v) && v != mc->n_embd)
        mismatch(why, sizeof why, "n_embd", v, "n_embd", mc->n_embd);
    if (json_int(root, "vocab_size", &v) && v != mc->vocab_size)
        mismatch(why, sizeof why, "vocab_size", v, "vocab_size", mc->vocab_size);
    *n_positions = 0;
    if (json_int(root, "n_positions", &v) || json_int(root, "n_ctx", &v)) {
        *n_positions = v;
        if (v < mc->seq_len)
            complain(why, sizeof why,
                     "n_positions = %lld but model.seq_len = %d (at most "
                     "n_positions)",
                     v, mc->seq_len);
    } else
        complain(why, sizeof why, "n_positions (or n_ctx) missing");
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, "n_inner");
    if (cJSON_IsNumber(x) && (long long)x->valuedouble != 4LL * mc->n_embd)
        mismatch(why, sizeof why, "n_inner", (long long)x->valuedouble, "n_embd x 4",
                 4LL * mc->n_embd);
    x = cJSON_GetObjectItemCaseSensitive(root, "layer_norm_epsilon");
    if (cJSON_IsNumber(x) && fabs(x->valuedouble - 1e-5) > 1e-12)
        complain(why, sizeof why, "layer_norm_epsilon = %g but loco's LayerNorm uses 1e-05",
                 x->valuedouble);
    x = cJSON_GetObjectItemCaseSensitive(root, "activation_function");
    if (cJSON_IsString(x) && strcmp(x->valuestring, "gelu_new") &&
        strcmp(x->valuestring, "gelu_pytorch_tanh") && strcmp(x->valuestring, "gelu_fast"))
        complain(why, sizeof why,
                 "activation_function = %s but loco's GPT-2 uses the tanh GELU (gelu_new)",
                 x->valuestring);
    x = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(x) && strcmp(x->valuestring, "gpt2"))
        complain(why, sizeof why, "model_type = %s, not gpt2", x->valuestring);
    x = cJSON_GetObjectItemCaseSensitive(root, "scale_attn_weights");
    if (cJSON_IsBool(x) && !cJSON_IsTrue(x))
        complain(why, sizeof why, "scale_attn_weights = false but loco scales by 1/sqrt(head)");
    x = cJSON_GetObjectItemCaseSensitive(root, "scale_attn_by_inverse_layer_idx");
    if (cJSON_IsTrue(x))
        complain(why, sizeof why, "scale_attn_by_inverse_layer_idx = true: loco does not");
    x = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    *tied = !cJSON_IsBool(x) || cJSON_IsTrue(x);
    if (mc->n_experts > 0)
        complain(why, sizeof why,
                 "model.n_experts > 0 but a Hugging Face GPT-2 has dense MLPs only");
    cJSON_Delete(root);
    if (why[0])
        return LOCO_ERR(LOCO_EINVAL, "init_from %s: %s", path, why);
    return 0;
}

/* ------------------------------------------------------------ the tensors */

/* The file's entry for a table name ("transformer.X"), looked up as
 * "transformer.X" or "X"; NULL when absent. Both at once is an error. */
static int find_entry(const hf_file *f, const char *name, const hf_entry **out) {
    *out = NULL;
    const char *bare =
        !strncmp(name, HF_PREFIX, strlen(HF_PREFIX)) ? name + strlen(HF_PREFIX) : name;
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, name) || !strcmp(f->e[i].name, bare)) {
            if (*out)
                return LOCO_ERR(LOCO_EPROTO,
                                "init_from %s: tensor '%s' appears as both '%s' and "
                                "'%s'",
                                f->path, bare, (*out)->name, f->e[i].name);
            *out = &f->e[i];
        }
    return 0;
}

/* The attention-mask buffers some files carry: not parameters, ignored. */
static bool is_mask_buffer(const char *name) {
    if (!strncmp(name, HF_PREFIX, strlen(HF_PREFIX)))
        name += strlen(HF_PREFIX);
    int l, end = 0;
    if (sscanf(name, "h.%d.attn.%n", &l, &end) != 1 || end == 0)
        return false;
    return !strcmp(name + end, "bias") || !strcmp(name + end, "masked_bias");
}

/* Checks every tensor of the file against the whole (tp = 1) table. */
static int check_tensors(const hf_file *f, const loco_ttable *whole, const loco_gpt_config *mc,
                         int64_t n_positions, bool tied, const hf_entry **found) {
    for (int i = 0; i < f->n; i++) {
        const hf_entry *e = &f->e[i];
        const char *bare =
            !strncmp(e->name, HF_PREFIX, strlen(HF_PREFIX)) ? e->name + strlen(HF_PREFIX) : e->name;
        char full[LOCO_TENSOR_NAME_MAX + 16];
        snprintf(full, sizeof full, HF_PREFIX "%s", bare);
        if (loco_ttable_find(whole, full) < 0 && !is_mask_buffer(e->name) &&
            strcmp(e->name, "lm_head.weight"))
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: unknown tensor '%s' (not a parameter of a GPT-2 with "
                            "n_layer = %d)",
                            f->path, e->name, mc->n_layer);
    }
    const int64_t C = mc->n_embd;
    for (int i = 0; i < whole->n; i++) {
        const loco_tensor *t = &whole->t[i];
        LOCO_CHECK(find_entry(f, t->name, &found[i]));
        const hf_entry *e = found[i];
        if (!e)
            return LOCO_ERR(LOCO_EPROTO, "init_from %s: tensor '%s' (or '%s') is missing", f->path,
                            t->name + strlen(HF_PREFIX), t->name);
        char want[96], got[96];
        int64_t shape[LOCO_TENSOR_MAX_DIM];
        memcpy(shape, t->shape, sizeof shape);
        const bool is_wte = !strcmp(t->name, HF_PREFIX "wte.weight");
        if (!strcmp(t->name, HF_PREFIX "wpe.weight"))
            shape[0] = n_positions; /* rows beyond model.seq_len are not used */
        loco__hf_shape_str(want, sizeof want, t->ndim, shape);
        loco__hf_shape_str(got, sizeof got, e->ndim, e->shape);
        if (e->dtype == HF_OTHER)
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: tensor '%s' is %s, expected F32, F16 or "
                            "BF16",
                            f->path, e->name, e->dtype_name);
        bool same = e->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++)
            same = e->shape[d] == shape[d] || (is_wte && d == 0 && e->shape[0] > shape[0]);
        if (!same)
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: tensor '%s' has shape %s, expected %s (model n_layer "
                            "%d, n_head %d, n_embd %lld, vocab_size %d, n_positions %lld)",
                            f->path, e->name, got, want, mc->n_layer, mc->n_head, (long long)C,
                            mc->vocab_size, (long long)n_positions);
        if (is_wte && e->shape[0] > shape[0])
            loco_info("init_from %s: '%s' has %lld rows, config.json's vocab_size is %lld: rows "
                      "from %lld on are vocabulary padding and are not loaded",
                      f->path, e->name, (long long)e->shape[0], (long long)shape[0],
                      (long long)shape[0]);
    }
    /* The head: loco ties it to wte. */
    const hf_entry *head = NULL, *wte = found[loco_ttable_find(whole, HF_PREFIX "wte.weight")];
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].name, "lm_head.weight"))
            head = &f->e[i];
    if (!head) {
        if (!tied)
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: config.json says tie_word_embeddings = false but the "
                            "file has no lm_head.weight",
                            f->path);
        return 0;
    }
    if (head->ndim != 2 || head->shape[1] != C || head->shape[0] < mc->vocab_size) {
        char got[96];
        loco__hf_shape_str(got, sizeof got, head->ndim, head->shape);
        return LOCO_ERR(LOCO_EPROTO,
                        "init_from %s: tensor 'lm_head.weight' has shape %s, expected "
                        "[%d, %lld]",
                        f->path, got, mc->vocab_size, (long long)C);
    }
    const size_t n = (size_t)mc->vocab_size * (size_t)C;
    for (size_t k = 0; k < n; k++) {
        const float a = loco__hf_elem(head, k), b = loco__hf_elem(wte, k);
        if (a != b && !(isnan(a) && isnan(b)))
            return LOCO_ERR(LOCO_EPROTO,
                            "init_from %s: lm_head.weight differs from %s (row %zu, column %zu: "
                            "%g vs %g): loco ties the output head to the token embeddings and "
                            "cannot hold an untied head",
                            f->path, wte->name, k / (size_t)C, k % (size_t)C, (double)a, (double)b);
    }
    return 0;
}

int loco_hf_import_view(const char *dir, const loco_ckpt_view *v) {
    if (!loco_gpt_is_gpt2(&v->model)) /* LlamaForCausalLM */
        return loco__hf_llama_import_view(dir, v);
    loco_gpt_config whole_cfg = v->model;
    whole_cfg.tp = 1;
    whole_cfg.ep = 1;
    whole_cfg.ep_rank = 0;
    int64_t n_positions = 0;
    bool tied = true;
    LOCO_CHECK(check_config(dir, &v->model, &n_positions, &tied));
    loco_ttable whole;
    LOCO_CHECK(loco_gpt_build_table(&whole, &whole_cfg));
    hf_file f;
    const hf_entry **found = loco_alloc((size_t)whole.n * sizeof *found);
    int rc = found ? 0 : LOCO_ERR(LOCO_ENOMEM, "tensor map");
    if (rc < 0)
        goto out_table;
    LOCO_CHECK_GOTO(loco__hf_file_open(&f, dir), out_file);
    LOCO_CHECK_GOTO(check_tensors(&f, &whole, &v->model, n_positions, tied, found), out_file);
    const int t = v->model.tp > 1 ? v->model.tp : 1;
    for (int i = 0; i < v->tt->n; i++) {
        const loco_tensor *lt = &v->tt->t[i];
        const int w = loco_ttable_find(&whole, lt->name);
        if (w < 0) {
            rc = LOCO_ERR(LOCO_EINVAL,
                          "init_from: the model's tensor '%s' is not a GPT-2 "
                          "parameter",
                          lt->name);
            goto out_file;
        }
        const size_t lo = lt->offset > v->p_lo ? lt->offset : v->p_lo;
        const size_t hi = lt->offset + lt->numel < v->p_hi ? lt->offset + lt->numel : v->p_hi;
        for (size_t x = lo; x < hi; x++) {
            size_t g;
            const bool real = loco_gpt_tp_global(&whole.t[w], t, v->tp_rank, x - lt->offset, &g);
            v->params[x - v->p_lo] = real ? loco__hf_elem(found[w], g) : 0.0f;
        }
    }
    loco_info("init_from %s: %d tensors loaded (%s)", dir, whole.n,
              t > 1 ? "this rank's tp slice" : "fp32");
out_file:
    loco__hf_file_close(&f);
out_table:
    loco_free(found);
    loco_ttable_fini(&whole);
    return rc;
}

int loco_hf_import(const char *dir, loco_gpt *m) {
    if (!loco_gpt_params(m) || loco_gpt_cfg(m)->tp > 1 || loco_gpt_stage_of(m))
        return LOCO_ERR(LOCO_EINVAL, "loco_hf_import: a whole model with its parameters "
                                     "(use loco_hf_import_view for a tp slice, stage or shard)");
    const loco_ckpt_view v = {
        .tt = loco_gpt_table(m), .model = *loco_gpt_cfg(m), .params = loco_gpt_params(m),
        .p_lo = 0, .p_hi = loco_gpt_num_params(m)};
    return loco_hf_import_view(dir, &v);
}
