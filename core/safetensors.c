/* safetensors I/O: 8-byte little-endian header length, a JSON header
 * {name: {dtype, shape, data_offsets}, __metadata__: {..}}, then raw data.
 * Reading validates everything before any tensor is handed out. */
#include "core/core.h"

#include <cjson/cJSON.h>
#include <string.h>

#define ST_HEADER_MAX (100u << 20) /* the format's own limit */

typedef struct {
    char *name;
    char dtype[8];
    int ndim;
    int64_t shape[LOCO_TENSOR_MAX_DIM];
    const unsigned char *data;
    size_t nbytes;
} st_entry;

struct loco_st {
    unsigned char *file;
    size_t file_len;
    st_entry *e;
    int n;
    cJSON *meta; /* detached __metadata__ object, may be NULL */
};

static size_t dtype_size(const char *d) {
    if (!strcmp(d, "F32") || !strcmp(d, "I32") || !strcmp(d, "U32")) return 4;
    if (!strcmp(d, "F16") || !strcmp(d, "BF16") || !strcmp(d, "I16") || !strcmp(d, "U16")) return 2;
    if (!strcmp(d, "F64") || !strcmp(d, "I64") || !strcmp(d, "U64")) return 8;
    if (!strcmp(d, "U8") || !strcmp(d, "I8") || !strcmp(d, "BOOL") || !strcmp(d, "F8_E4M3") ||
        !strcmp(d, "F8_E5M2")) return 1;
    return 0;
}

void loco_st_close(loco_st *st) {
    if (!st)
        return;
    for (int i = 0; i < st->n; i++)
        loco_free(st->e[i].name);
    loco_free(st->e);
    cJSON_Delete(st->meta);
    loco_free(st->file);
    loco_free(st);
}

static int parse_entry(loco_st *st, const char *path, cJSON *it, const unsigned char *data,
                       size_t data_len, st_entry *e) {
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    cJSON *off = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
        cJSON_GetArraySize(off) != 2)
        return LOCO_ERR(LOCO_EPROTO, "%s: tensor '%s' lacks dtype, shape or data_offsets", path,
                        it->string);
    size_t esize = dtype_size(dt->valuestring);
    if (esize == 0)
        return LOCO_ERR(LOCO_EPROTO, "%s: tensor '%s' has unknown dtype '%s'", path, it->string,
                        dt->valuestring);
    snprintf(e->dtype, sizeof e->dtype, "%s", dt->valuestring);
    e->ndim = cJSON_GetArraySize(sh);
    if (e->ndim > LOCO_TENSOR_MAX_DIM)
        return LOCO_ERR(LOCO_EPROTO, "%s: tensor '%s' has %d dims (at most %d)", path, it->string,
                        e->ndim, LOCO_TENSOR_MAX_DIM);
    double numel = 1;
    for (int d = 0; d < e->ndim; d++) {
        cJSON *x = cJSON_GetArrayItem(sh, d);
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 1e15 ||
            x->valuedouble != (double)(int64_t)x->valuedouble)
            return LOCO_ERR(LOCO_EPROTO, "%s: tensor '%s' has a bad shape", path, it->string);
        e->shape[d] = (int64_t)x->valuedouble;
        numel *= x->valuedouble;
    }
    double b = cJSON_GetArrayItem(off, 0)->valuedouble;
    double en = cJSON_GetArrayItem(off, 1)->valuedouble;
    if (!cJSON_IsNumber(cJSON_GetArrayItem(off, 0)) || !cJSON_IsNumber(cJSON_GetArrayItem(off, 1)) ||
        b < 0 || en < b || en > (double)data_len)
        return LOCO_ERR(LOCO_EPROTO,
                        "%s: tensor '%s' data_offsets [%.0f, %.0f] outside the %zu data bytes "
                        "(truncated file?)",
                        path, it->string, b, en, data_len);
    if (b != (double)(size_t)b || en != (double)(size_t)en) /* in range, so the casts are safe */
        return LOCO_ERR(LOCO_EPROTO, "%s: tensor '%s' data_offsets [%g, %g] are not whole bytes",
                        path, it->string, b, en);
    if (numel * (double)esize != en - b)
        return LOCO_ERR(LOCO_EPROTO, "%s: tensor '%s' shape needs %.0f bytes, offsets give %.0f",
                        path, it->string, numel * (double)esize, en - b);
    e->data = data + (size_t)b;
    e->nbytes = (size_t)(en - b);
    size_t nlen = strlen(it->string) + 1;
    e->name = loco_alloc(nlen);
    if (!e->name)
        return LOCO_ERR(LOCO_ENOMEM, "tensor name");
    memcpy(e->name, it->string, nlen);
    (void)st;
    return 0;
}

int loco_st_open(loco_st **out, const char *path) {
    *out = NULL;
    int rc;
    loco_st *st = loco_alloc(sizeof *st);
    if (!st)
        return LOCO_ERR(LOCO_ENOMEM, "safetensors handle");
    cJSON *root = NULL;
    LOCO_CHECK_GOTO(loco_file_read(path, (void **)&st->file, &st->file_len), out_fail);
    if (st->file_len < 8) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: %zu bytes, too short for a safetensors header", path,
                      st->file_len);
        goto out_fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | st->file[i];
    if (hlen > ST_HEADER_MAX || hlen > st->file_len - 8) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: header length %llu exceeds the file (%zu bytes)", path,
                      (unsigned long long)hlen, st->file_len);
        goto out_fail;
    }
    root = cJSON_ParseWithLength((const char *)st->file + 8, hlen);
    if (!cJSON_IsObject(root)) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: header is not a JSON object", path);
        goto out_fail;
    }
    const unsigned char *data = st->file + 8 + hlen;
    size_t data_len = st->file_len - 8 - hlen;
    int count = cJSON_GetArraySize(root);
    st->e = loco_alloc((size_t)(count > 0 ? count : 1) * sizeof *st->e);
    if (!st->e) {
        rc = LOCO_ERR(LOCO_ENOMEM, "safetensors entries");
        goto out_fail;
    }
    cJSON *it;
    cJSON_ArrayForEach(it, root) {
        if (!strcmp(it->string, "__metadata__"))
            continue;
        if (!cJSON_IsObject(it)) {
            rc = LOCO_ERR(LOCO_EPROTO, "%s: entry '%s' is not an object", path, it->string);
            goto out_fail;
        }
        LOCO_CHECK_GOTO(parse_entry(st, path, it, data, data_len, &st->e[st->n]), out_fail);
        st->n++;
    }
    st->meta = cJSON_DetachItemFromObjectCaseSensitive(root, "__metadata__");
    cJSON_Delete(root);
    *out = st;
    return 0;
out_fail:
    cJSON_Delete(root);
    loco_st_close(st);
    return rc;
}

int loco_st_get(const loco_st *st, const char *name, const float **data, int *ndim,
                int64_t shape[LOCO_TENSOR_MAX_DIM]) {
    for (int i = 0; i < st->n; i++) {
        const st_entry *e = &st->e[i];
        if (strcmp(e->name, name) != 0)
            continue;
        if (strcmp(e->dtype, "F32") != 0)
            return LOCO_ERR(LOCO_EINVAL, "tensor '%s' is %s, expected F32", name, e->dtype);
        if ((uintptr_t)e->data % _Alignof(float) != 0)
            return LOCO_ERR(LOCO_EPROTO, "tensor '%s' data is not 4-byte aligned in the file",
                            name);
        *data = (const float *)e->data;
        if (ndim)
            *ndim = e->ndim;
        if (shape)
            for (int d = 0; d < e->ndim; d++)
                shape[d] = e->shape[d];
        return 0;
    }
    return LOCO_ERR(LOCO_EINVAL, "tensor '%s' not found", name);
}

const char *loco_st_meta(const loco_st *st, const char *key) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(st->meta, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int loco_st_read_into(const loco_st *st, const loco_ttable *tt, float *base, const char *prefix) {
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        char name[LOCO_TENSOR_NAME_MAX + 64];
        snprintf(name, sizeof name, "%s%s", prefix ? prefix : "", t->name);
        const float *src;
        int ndim;
        int64_t shape[LOCO_TENSOR_MAX_DIM];
        LOCO_CHECK(loco_st_get(st, name, &src, &ndim, shape));
        bool same = ndim == t->ndim;
        for (int d = 0; same && d < ndim; d++)
            same = shape[d] == t->shape[d];
        if (!same)
            return LOCO_ERR(LOCO_EINVAL, "tensor '%s' has a different shape than the model expects",
                            name);
        memcpy(base + t->offset, src, t->numel * sizeof(float));
    }
    return 0;
}

int loco_st_write(const char *path, const loco_ttable *tt, const float *base,
                  const char *rename_prefix, const char *const *meta_kv) {
    int rc = 0;
    char *json = NULL;
    unsigned char *buf = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return LOCO_ERR(LOCO_ENOMEM, "safetensors header");
    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    for (int i = 0; meta_kv && meta_kv[i] && meta_kv[i + 1]; i += 2)
        cJSON_AddStringToObject(meta, meta_kv[i], meta_kv[i + 1]);
    size_t off = 0;
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        char name[LOCO_TENSOR_NAME_MAX + 64];
        snprintf(name, sizeof name, "%s%s", rename_prefix ? rename_prefix : "", t->name);
        cJSON *e = cJSON_AddObjectToObject(root, name);
        cJSON_AddStringToObject(e, "dtype", "F32");
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        off += t->numel * sizeof(float);
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
    }
    json = cJSON_PrintUnformatted(root);
    if (!json) {
        rc = LOCO_ERR(LOCO_ENOMEM, "safetensors header text");
        goto out;
    }
    size_t hlen = strlen(json);
    size_t padded = (hlen + 7) & ~(size_t)7; /* data starts 8-byte aligned */
    size_t total = 8 + padded + off;
    buf = loco_alloc(total);
    if (!buf) {
        rc = LOCO_ERR(LOCO_ENOMEM, "safetensors file of %zu bytes", total);
        goto out;
    }
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    unsigned char *d = buf + 8 + padded;
    for (int i = 0; i < tt->n; i++) {
        const loco_tensor *t = &tt->t[i];
        memcpy(d, base + t->offset, t->numel * sizeof(float));
        d += t->numel * sizeof(float);
    }
    LOCO_CHECK_GOTO(loco_file_write_sync(path, buf, total), out);
out:
    loco_free(buf);
    cJSON_free(json);
    cJSON_Delete(root);
    return rc;
}
