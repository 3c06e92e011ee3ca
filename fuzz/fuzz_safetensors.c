/* libFuzzer target: the safetensors reader (loco_st_open: header length,
 * JSON header, dtypes, shapes, offsets) on arbitrary bytes as a file.
 * Whatever the bytes: 0 or LOCO_EPROTO, nothing read out of bounds (ASan:
 * every tensor handed out is read whole), nothing leaked. A file holding
 * the table the seeds were written from (tensors "a" [3,5] and "b.w" [7])
 * round-trips: read into it, written back with loco_st_write and read
 * again, the values are the same bits. Seeds: fuzz/corpus/safetensors,
 * written by gen_corpus. */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static loco_ttable tt;

/* Every byte of an F32 tensor name's data, or nothing when absent. */
static void touch(const loco_st *st, const char *name) {
    const float *p;
    int ndim;
    int64_t shape[LOCO_TENSOR_MAX_DIM];
    if (loco_st_get(st, name, &p, &ndim, shape) != 0)
        return;
    size_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= (size_t)shape[d];
    volatile unsigned char sum = 0;
    for (size_t i = 0; i < n * sizeof(float); i++)
        sum += ((const unsigned char *)p)[i];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tt.n) {
        loco_ttable_init(&tt);
        const int64_t s1[] = {3, 5}, s2[] = {7};
        if (loco_ttable_add(&tt, "a", 2, s1, -1, true) ||
            loco_ttable_add(&tt, "b.w", 1, s2, -1, false))
            abort();
    }
    char path[128];
    fuzz_write(NULL, "in.safetensors", data, size, path, sizeof path);
    loco_st *st;
    int rc = loco_st_open(&st, path);
    if (rc != 0 && rc != LOCO_EPROTO)
        abort();
    if (rc == 0) {
        touch(st, "a");
        touch(st, "b.w");
        (void)loco_st_meta(st, "format");
        float x[32], y[32];
        if (loco_st_read_into(st, &tt, x, NULL) == 0) {
            fuzz_write(NULL, "out.safetensors", "", 0, path, sizeof path);
            loco_st *back;
            if (loco_st_write(path, &tt, x, NULL, NULL) != 0 || loco_st_open(&back, path) != 0 ||
                loco_st_read_into(back, &tt, y, NULL) != 0)
                abort(); /* what was read cannot be written and read back */
            if (memcmp(x, y, tt.numel * sizeof(float)))
                abort();
            loco_st_close(back);
        }
        loco_st_close(st);
    }
    loco_err_clear();
    return 0;
}
