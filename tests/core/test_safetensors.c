/* safetensors: exact round trips, a header that an independent JSON parse
 * agrees with, a file written by Python read back byte for byte, and every
 * kind of damage refused with LOCO_EPROTO (never a crash). */
#include "core/core.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIXTURE "tests/fixtures/gpt2_tiny.safetensors"

static char *dir;
static char path[512];
static loco_ttable tt;
static float *base;

/* Awkward shapes: odd sizes, unit dims, 1-D and 4-D. */
static const struct {
    const char *name;
    int ndim;
    int64_t shape[4];
} spec[] = {
    {"transformer.wte.weight", 3, {3, 5, 7}},
    {"ln_f.bias", 1, {13}},
    {"odd", 4, {1, 1, 17, 1}},
};
#define N_SPEC (int)(sizeof spec / sizeof spec[0])

static void setup(void) {
    dir = strdup("/tmp/loco-st-XXXXXX");
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    loco_err_clear();
    loco_ttable_init(&tt);
    for (int i = 0; i < N_SPEC; i++)
        cr_assert_eq(loco_ttable_add(&tt, spec[i].name, spec[i].ndim, spec[i].shape, -1, false), 0,
                     "%s", loco_errmsg());
    base = loco_alloc(tt.numel * sizeof *base);
    cr_assert(base);
    loco_rng rng;
    loco_rng_seed(&rng, 5);
    for (size_t i = 0; i < tt.numel; i++)
        base[i] = loco_rng_normal(&rng);
    /* Values whose bits must survive: signed zero, subnormal, huge, inf, NaN. */
    base[0] = -0.0f;
    base[1] = 1e-40f;
    base[2] = 3e38f;
    base[3] = -INFINITY;
    base[4] = NAN;
}

static void teardown(void) {
    loco_alloc_fail_after(0);
    loco_free(base);
    loco_ttable_fini(&tt);
    loco_rmtree(dir);
    free(dir);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

static void assert_has(const char *msg, const char *part) {
    cr_assert(strstr(msg, part), "message lacks \"%s\":\n%s", part, msg);
}

static const char *const meta[] = {"step", "17", "note", "hello \"world\"", NULL};

Test(safetensors, write_then_read_back_exactly) {
    cr_assert_eq(loco_st_write(path, &tt, base, NULL, meta), 0, "%s", loco_errmsg());
    loco_st *st;
    cr_assert_eq(loco_st_open(&st, path), 0, "%s", loco_errmsg());
    for (int i = 0; i < N_SPEC; i++) {
        const float *data;
        int ndim = -1;
        int64_t shape[LOCO_TENSOR_MAX_DIM] = {0};
        cr_assert_eq(loco_st_get(st, spec[i].name, &data, &ndim, shape), 0, "%s", loco_errmsg());
        cr_expect_eq(ndim, spec[i].ndim, "%s", spec[i].name);
        for (int d = 0; d < ndim; d++)
            cr_expect_eq(shape[d], spec[i].shape[d], "%s dim %d", spec[i].name, d);
        const loco_tensor *t = &tt.t[loco_ttable_find(&tt, spec[i].name)];
        cr_expect_eq(memcmp(data, base + t->offset, t->numel * sizeof(float)), 0, "%s",
                     spec[i].name);
    }
    cr_expect_str_eq(loco_st_meta(st, "format"), "pt");
    cr_expect_str_eq(loco_st_meta(st, "step"), "17");
    cr_expect_str_eq(loco_st_meta(st, "note"), "hello \"world\"");
    cr_expect_null(loco_st_meta(st, "absent"));

    float *back = loco_alloc(tt.numel * sizeof *back);
    cr_assert_eq(loco_st_read_into(st, &tt, back, NULL), 0, "%s", loco_errmsg());
    cr_expect_eq(memcmp(back, base, tt.numel * sizeof *back), 0);
    loco_free(back);
    loco_st_close(st);
    loco_st_close(NULL);
}

Test(safetensors, header_agrees_with_an_independent_parse) {
    cr_assert_eq(loco_st_write(path, &tt, base, NULL, meta), 0, "%s", loco_errmsg());
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    unsigned char *raw = malloc((size_t)size);
    cr_assert_eq(fread(raw, 1, (size_t)size, f), (size_t)size);
    fclose(f);

    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)raw[i] << (8 * i);
    cr_assert_leq(8 + hlen, (uint64_t)size);
    cr_expect_eq((8 + hlen) % 8, 0, "data starts 8-byte aligned");
    cJSON *root = cJSON_ParseWithLength((const char *)raw + 8, (size_t)hlen);
    cr_assert(cJSON_IsObject(root), "header is not JSON");
    cr_expect_eq(cJSON_GetArraySize(root), N_SPEC + 1, "tensors + __metadata__");
    cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "format")), "pt");
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "step")), "17");

    const unsigned char *data = raw + 8 + hlen;
    size_t data_len = (size_t)size - 8 - (size_t)hlen;
    double expect_begin = 0;
    for (int i = 0; i < N_SPEC; i++) {
        cJSON *e = cJSON_GetObjectItemCaseSensitive(root, spec[i].name);
        cr_assert(cJSON_IsObject(e), "%s missing", spec[i].name);
        cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "dtype")), "F32");
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cr_assert_eq(cJSON_GetArraySize(sh), spec[i].ndim);
        double numel = 1;
        for (int d = 0; d < spec[i].ndim; d++) {
            cr_expect_eq(cJSON_GetArrayItem(sh, d)->valuedouble, (double)spec[i].shape[d]);
            numel *= (double)spec[i].shape[d];
        }
        cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        cr_assert_eq(cJSON_GetArraySize(off), 2);
        double b = cJSON_GetArrayItem(off, 0)->valuedouble;
        double en = cJSON_GetArrayItem(off, 1)->valuedouble;
        cr_expect_eq(b, expect_begin, "%s: tensors are packed in table order", spec[i].name);
        cr_expect_eq(en - b, numel * 4, "%s", spec[i].name);
        cr_assert_leq(en, (double)data_len);
        const loco_tensor *t = &tt.t[loco_ttable_find(&tt, spec[i].name)];
        cr_expect_eq(memcmp(data + (size_t)b, base + t->offset, (size_t)(en - b)), 0, "%s",
                     spec[i].name);
        expect_begin = en;
    }
    cr_expect_eq(expect_begin, (double)data_len, "no bytes after the last tensor");
    cJSON_Delete(root);
    free(raw);
}

Test(safetensors, rename_prefix_and_lookup_with_prefix) {
    cr_assert_eq(loco_st_write(path, &tt, base, "model.", NULL), 0, "%s", loco_errmsg());
    loco_st *st;
    cr_assert_eq(loco_st_open(&st, path), 0, "%s", loco_errmsg());
    const float *data;
    cr_expect_eq(loco_st_get(st, "model.ln_f.bias", &data, NULL, NULL), 0, "%s", loco_errmsg());
    cr_expect_eq(data[0], base[tt.t[1].offset]);
    cr_expect_eq(loco_st_get(st, "ln_f.bias", &data, NULL, NULL), LOCO_EINVAL);
    assert_has(loco_errmsg(), "'ln_f.bias'");
    cr_expect_str_eq(loco_st_meta(st, "format"), "pt");

    float *back = loco_alloc(tt.numel * sizeof *back);
    cr_expect_eq(loco_st_read_into(st, &tt, back, NULL), LOCO_EINVAL, "names lack the prefix");
    cr_assert_eq(loco_st_read_into(st, &tt, back, "model."), 0, "%s", loco_errmsg());
    cr_expect_eq(memcmp(back, base, tt.numel * sizeof *back), 0);
    loco_free(back);
    loco_st_close(st);
}

Test(safetensors, read_into_refuses_a_different_shape) {
    cr_assert_eq(loco_st_write(path, &tt, base, NULL, NULL), 0, "%s", loco_errmsg());
    loco_st *st;
    cr_assert_eq(loco_st_open(&st, path), 0, "%s", loco_errmsg());
    loco_ttable other;
    loco_ttable_init(&other);
    const int64_t same_numel[3] = {5, 3, 7}; /* 105 elements, other order */
    cr_assert_eq(loco_ttable_add(&other, "transformer.wte.weight", 3, same_numel, -1, true), 0);
    float *buf = loco_alloc(other.numel * sizeof *buf);
    cr_expect_eq(loco_st_read_into(st, &other, buf, NULL), LOCO_EINVAL);
    assert_has(loco_errmsg(), "transformer.wte.weight");
    assert_has(loco_errmsg(), "shape");
    loco_free(buf);
    loco_ttable_fini(&other);

    const int64_t flat[1] = {17}; /* same numel as "odd", fewer dims */
    cr_assert_eq(loco_ttable_add(&other, "odd", 1, flat, -1, false), 0);
    buf = loco_alloc(other.numel * sizeof *buf);
    cr_expect_eq(loco_st_read_into(st, &other, buf, NULL), LOCO_EINVAL);
    assert_has(loco_errmsg(), "odd");
    loco_free(buf);
    loco_ttable_fini(&other);

    const int64_t one[1] = {1};
    cr_assert_eq(loco_ttable_add(&other, "absent", 1, one, -1, false), 0);
    buf = loco_alloc(sizeof *buf);
    cr_expect_eq(loco_st_read_into(st, &other, buf, NULL), LOCO_EINVAL);
    assert_has(loco_errmsg(), "'absent' not found");
    loco_free(buf);
    loco_ttable_fini(&other);
    loco_st_close(st);
}

Test(safetensors, get_missing_name_is_einval) {
    cr_assert_eq(loco_st_write(path, &tt, base, NULL, NULL), 0, "%s", loco_errmsg());
    loco_st *st;
    cr_assert_eq(loco_st_open(&st, path), 0, "%s", loco_errmsg());
    const float *data = NULL;
    cr_expect_eq(loco_st_get(st, "nope", &data, NULL, NULL), LOCO_EINVAL);
    cr_expect_null(data);
    assert_has(loco_errmsg(), "'nope'");
    cr_expect_eq(loco_st_get(st, "", &data, NULL, NULL), LOCO_EINVAL);
    cr_expect_eq(loco_st_get(st, "__metadata__", &data, NULL, NULL), LOCO_EINVAL);
    loco_st_close(st);
}

/* A tensor table written by Python (tests/fixtures/make_fixtures.py) reads
 * back byte for byte against our own parse of its header. */
Test(safetensors, reads_a_file_written_by_python) {
    void *raw;
    size_t size;
    cr_assert_eq(loco_file_read(FIXTURE, &raw, &size), 0, "%s", loco_errmsg());
    const unsigned char *b = raw;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)b[i] << (8 * i);
    cJSON *root = cJSON_ParseWithLength((const char *)b + 8, (size_t)hlen);
    cr_assert(cJSON_IsObject(root));
    loco_st *st;
    cr_assert_eq(loco_st_open(&st, FIXTURE), 0, "%s", loco_errmsg());
    int n = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (!strcmp(e->string, "__metadata__"))
            continue;
        const float *data;
        int ndim;
        int64_t shape[LOCO_TENSOR_MAX_DIM];
        cr_assert_eq(loco_st_get(st, e->string, &data, &ndim, shape), 0, "%s", loco_errmsg());
        cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
        cr_assert_eq(ndim, cJSON_GetArraySize(sh), "%s", e->string);
        for (int d = 0; d < ndim; d++)
            cr_expect_eq((double)shape[d], cJSON_GetArrayItem(sh, d)->valuedouble);
        cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        size_t start = (size_t)cJSON_GetArrayItem(off, 0)->valuedouble;
        size_t end = (size_t)cJSON_GetArrayItem(off, 1)->valuedouble;
        cr_expect_eq(memcmp(data, b + 8 + hlen + start, end - start), 0, "%s", e->string);
        n++;
    }
    cr_expect_gt(n, 10);
    cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
    cr_expect_str_eq(loco_st_meta(st, "generator"),
                     cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "generator")));
    loco_st_close(st);
    cJSON_Delete(root);
    loco_free(raw);
}

/* ------------------------------------------------------ hand-made files */

/* Writes an 8-byte little-endian header length (`hlen`), the header text and
 * the data. */
static void write_raw(uint64_t hlen, const char *header, const void *data, size_t dlen) {
    size_t n = strlen(header);
    unsigned char *buf = malloc(8 + n + dlen + 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, n);
    if (dlen)
        memcpy(buf + 8 + n, data, dlen);
    cr_assert_eq(loco_file_write_sync(path, buf, 8 + n + dlen), 0);
    free(buf);
}

static void write_st(const char *header, const void *data, size_t dlen) {
    write_raw(strlen(header), header, data, dlen);
}

static void expect_proto(const char *why, const char *phrase) {
    loco_st *st = (loco_st *)1;
    loco_err_clear();
    int rc = loco_st_open(&st, path);
    cr_expect_eq(rc, LOCO_EPROTO, "%s: got %s (%s)", why, loco_strerror(rc), loco_errmsg());
    cr_expect_null(st, "%s: handle on failure", why);
    if (rc == 0)
        loco_st_close(st);
    cr_expect(strstr(loco_errmsg(), path), "%s: message lacks the path: %s", why, loco_errmsg());
    if (phrase)
        cr_expect(strstr(loco_errmsg(), phrase), "%s: message lacks \"%s\": %s", why, phrase,
                  loco_errmsg());
}

static const float four[4] = {1, 2, 3, 4};

Test(safetensors, a_hand_made_file_opens) {
    /* The helpers themselves produce a readable file; the cases below each
     * break one thing of it. Scalars and empty tensors are legal. */
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
             "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[16,16]},"
             "\"i\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
             four, sizeof four);
    loco_st *st;
    cr_assert_eq(loco_st_open(&st, path), 0, "%s", loco_errmsg());
    const float *d;
    int ndim;
    int64_t shape[4];
    cr_expect_eq(loco_st_get(st, "a", &d, &ndim, shape), 0);
    cr_expect(ndim == 2 && shape[0] == 2 && shape[1] == 2 && d[3] == 4.0f);
    cr_expect_eq(loco_st_get(st, "s", &d, &ndim, shape), 0);
    cr_expect(ndim == 0 && d[0] == 2.0f);
    cr_expect_eq(loco_st_get(st, "z", &d, &ndim, shape), 0);
    cr_expect(ndim == 2 && shape[0] == 0 && shape[1] == 3);
    cr_expect_eq(loco_st_get(st, "i", &d, &ndim, shape), LOCO_EINVAL, "not F32");
    assert_has(loco_errmsg(), "I32");
    cr_expect_null(loco_st_meta(st, "format"), "no __metadata__");
    loco_st_close(st);
}

Test(safetensors, shorter_than_8_bytes) {
    cr_assert_eq(loco_file_write_sync(path, "\x02\0\0\0\0", 5), 0);
    expect_proto("5 bytes", "too short");
    cr_assert_eq(loco_file_write_sync(path, "", 0), 0);
    expect_proto("empty file", "too short");
}

Test(safetensors, header_length_beyond_the_file) {
    write_raw(1000, "{}", NULL, 0);
    expect_proto("hlen 1000 in a 10-byte file", "header length");
    write_raw(UINT64_MAX, "{}", NULL, 0);
    expect_proto("hlen 2^64-1", "header length");
    write_raw(UINT64_MAX - 5, "{}", NULL, 0); /* 8 + hlen wraps to 2 */
    expect_proto("hlen that wraps", "header length");
}

Test(safetensors, header_not_json) {
    write_st("this is not json", NULL, 0);
    expect_proto("text", "JSON");
    write_st("[1, 2, 3]", NULL, 0);
    expect_proto("an array", "JSON");
    write_st("{\"a\": {\"dtype\": \"F32\"", NULL, 0);
    expect_proto("cut short", "JSON");
    write_st("{\"a\": 5}", NULL, 0);
    expect_proto("entry not an object", "'a'");
}

Test(safetensors, tensor_missing_a_field) {
    write_st("{\"a\":{\"shape\":[4],\"data_offsets\":[0,16]}}", four, sizeof four);
    expect_proto("no dtype", "'a' lacks dtype");
    write_st("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,16]}}", four, sizeof four);
    expect_proto("no shape", "'a' lacks");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", four, sizeof four);
    expect_proto("no data_offsets", "'a' lacks");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8,16]}}", four,
             sizeof four);
    expect_proto("three offsets", "'a' lacks");
    write_st("{\"a\":{\"dtype\":7,\"shape\":[4],\"data_offsets\":[0,16]}}", four, sizeof four);
    expect_proto("dtype not a string", "'a' lacks");
}

Test(safetensors, unknown_dtype) {
    write_st("{\"a\":{\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("F33", "unknown dtype 'F33'");
    write_st("{\"a\":{\"dtype\":\"\",\"shape\":[4],\"data_offsets\":[0,16]}}", four, sizeof four);
    expect_proto("empty dtype", "unknown dtype");
}

Test(safetensors, data_offsets_beyond_the_data_truncated_file) {
    cr_assert_eq(loco_st_write(path, &tt, base, NULL, NULL), 0, "%s", loco_errmsg());
    void *raw;
    size_t size;
    cr_assert_eq(loco_file_read(path, &raw, &size), 0);
    cr_assert_eq(truncate(path, (off_t)size - 4), 0);
    loco_free(raw);
    expect_proto("truncated by 4 bytes", "truncated file?");
}

Test(safetensors, bad_offsets) {
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,20]}}", four,
             sizeof four);
    expect_proto("end past the data", "outside");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", four, sizeof four);
    expect_proto("end before begin", "outside");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", four,
             sizeof four);
    expect_proto("negative begin", "outside");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[\"0\",\"4\"]}}", four,
             sizeof four);
    expect_proto("offsets as strings", "'a'");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}", four,
             sizeof four);
    expect_proto("fractional offsets", "'a'");
}

Test(safetensors, shape_and_offsets_disagree) {
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("3 floats in 16 bytes", "shape needs 12 bytes, offsets give 16");
    write_st("{\"a\":{\"dtype\":\"F64\",\"shape\":[4],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("4 doubles in 16 bytes", "shape needs 32 bytes");
}

Test(safetensors, bad_shapes) {
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("negative dim", "bad shape");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2,-2],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("two negative dims multiplying to 4", "bad shape");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,6]}}", four,
             sizeof four);
    expect_proto("fractional dim", "bad shape");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("dim as a string", "bad shape");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("five dims", "5 dims");
    write_st("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,16]}}", four,
             sizeof four);
    expect_proto("huge dim", "bad shape");
}

Test(safetensors, missing_file_is_eio) {
    loco_st *st = (loco_st *)1;
    cr_expect_eq(loco_st_open(&st, path), LOCO_EIO);
    cr_expect_null(st);
    assert_has(loco_errmsg(), path);
}

Test(safetensors, write_into_missing_dir_is_eio) {
    char bad[600];
    snprintf(bad, sizeof bad, "%s/no/such/x.safetensors", dir);
    cr_expect_eq(loco_st_write(bad, &tt, base, NULL, NULL), LOCO_EIO);
    assert_has(loco_errmsg(), bad);
}

/* Failing each allocation in turn: open and write return LOCO_ENOMEM (or
 * succeed once n passes the last allocation), never crash. */
Test(safetensors, every_failed_allocation_is_enomem) {
    cr_assert_eq(loco_st_write(path, &tt, base, NULL, meta), 0, "%s", loco_errmsg());
    int opened = 0;
    for (long n = 1; n < 64 && !opened; n++) {
        loco_st *st;
        loco_alloc_fail_after(n);
        int rc = loco_st_open(&st, path);
        loco_alloc_fail_after(0);
        if (rc == 0) {
            opened = 1;
            cr_expect_gt(n, 3, "handle, file, entries and names all allocate");
            loco_st_close(st);
        } else {
            cr_expect_eq(rc, LOCO_ENOMEM, "n=%ld: %s", n, loco_errmsg());
            cr_expect_null(st);
        }
    }
    cr_expect(opened);

    char out[600];
    snprintf(out, sizeof out, "%s/w.safetensors", dir);
    int written = 0;
    for (long n = 1; n < 16 && !written; n++) {
        loco_alloc_fail_after(n);
        int rc = loco_st_write(out, &tt, base, NULL, meta);
        loco_alloc_fail_after(0);
        if (rc == 0)
            written = 1;
        else
            cr_expect_eq(rc, LOCO_ENOMEM, "n=%ld: %s", n, loco_errmsg());
    }
    cr_expect(written);
    loco_st *st;
    cr_assert_eq(loco_st_open(&st, out), 0, "%s", loco_errmsg());
    loco_st_close(st);
}
