/* Helpers shared by the checkpoint tests that cut a whole model into tp
 * slices and pipeline stages (test_ckpt_tp.c, test_ckpt_pp.c). */
#ifndef LOCO_TESTS_CKPT_TEST_H
#define LOCO_TESTS_CKPT_TEST_H

#include "inner/ckpt/ckpt.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* What a view's buffers hold before a load: a refused load leaves it. */
#define CKPT_TEST_UNSET 42.0f

/* n floats (at least one allocated) equal to value; free() them. */
static inline float *ckpt_test_floats(size_t n, float value) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    cr_assert(x);
    for (size_t i = 0; i < n; i++)
        x[i] = value;
    return x;
}

/* Loads ck into v, whose three buffers b of n floats hold CKPT_TEST_UNSET
 * and whose adam_t is 5: the load must fail with want_rc and a message
 * holding needle and naming ck, and leave the view untouched. */
static inline void ckpt_test_expect_refused(const char *ck, const loco_config *cfg,
                                            loco_ckpt_view *v, float *const *b, size_t n,
                                            int want_rc, const char *needle) {
    v->adam_t = 5;
    int rc = loco_ckpt_load_view(ck, cfg, v, NULL);
    cr_expect_eq(rc, want_rc, "rc %d (%s): %s", rc, loco_strerror(rc), loco_errmsg());
    cr_expect(strstr(loco_errmsg(), needle) != NULL, "message lacks '%s': %s", needle,
              loco_errmsg());
    cr_expect(strstr(loco_errmsg(), ck) != NULL, "message does not name %s: %s", ck, loco_errmsg());
    bool untouched = v->adam_t == 5;
    for (int a = 0; a < 3; a++)
        for (size_t i = 0; i < n; i++)
            untouched &= b[a][i] == CKPT_TEST_UNSET;
    cr_expect(untouched, "a refused checkpoint changed the view");
}

#endif
