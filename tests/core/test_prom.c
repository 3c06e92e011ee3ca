/* The live-metrics registry (core/prom.c): the exposition text against
 * the Prometheus format written out by hand (escaping of label values and
 * help, NaN and infinities, types), values that read back exactly, and the
 * registry's contract (bad and repeated names, undeclared names, label
 * mismatch, set_only, a NULL registry). */
#include "core/core.h"

#include "tests/prom_check.h"

#include <math.h>

static void setup(void) {
    loco_log_set_level(LOCO_LOG_ERROR);
}

TestSuite(prom, .init = setup);

Test(prom, renders_the_exposition_format) {
    loco_prom *p;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_assert_eq(loco_prom_declare(p, "t_gauge", LOCO_PROM_GAUGE, NULL, "a plain gauge"), 0);
    cr_assert_eq(loco_prom_declare(p, "t_labelled", LOCO_PROM_GAUGE, "site",
                                   "help with a \\ backslash\nand a newline"),
                 0);
    cr_assert_eq(loco_prom_declare(p, "t_total", LOCO_PROM_COUNTER, NULL, "a counter"), 0);
    cr_assert_eq(loco_prom_declare(p, "t_unset", LOCO_PROM_GAUGE, NULL, "never set"), 0);
    loco_prom_set(p, "t_gauge", NULL, 42);
    loco_prom_set(p, "t_labelled", "plain", 0.5);
    loco_prom_set(p, "t_labelled", "q\"uo\\te\nnl", NAN);
    loco_prom_set(p, "t_labelled", "up", INFINITY);
    loco_prom_set(p, "t_labelled", "down", -INFINITY);
    loco_prom_add(p, "t_total", NULL, 2);
    loco_prom_add(p, "t_total", NULL, 3);
    loco_prom_set(p, "t_gauge", NULL, 0.1); /* replaces 42 */
    char *text;
    size_t len;
    cr_assert_eq(loco_prom_render(p, &text, &len), 0);
    static const char want[] = "# HELP t_gauge a plain gauge\n"
                               "# TYPE t_gauge gauge\n"
                               "t_gauge 0.1\n"
                               "# HELP t_labelled help with a \\\\ backslash\\nand a newline\n"
                               "# TYPE t_labelled gauge\n"
                               "t_labelled{site=\"plain\"} 0.5\n"
                               "t_labelled{site=\"q\\\"uo\\\\te\\nnl\"} NaN\n"
                               "t_labelled{site=\"up\"} +Inf\n"
                               "t_labelled{site=\"down\"} -Inf\n"
                               "# HELP t_total a counter\n"
                               "# TYPE t_total counter\n"
                               "t_total 5\n";
    cr_expect_str_eq(text, want);
    cr_expect_eq(len, strlen(want));
    char why[1200];
    why[0] = 0;
    const int n = prom_check_text(text, why, sizeof why);
    cr_expect_eq(n, 6, "%d samples: %s", n, why);
    loco_free(text);
    loco_prom_destroy(p);
}

Test(prom, values_read_back_exactly) {
    const double vals[] = {0,         1,
                           -1,        0.1,
                           1.0 / 3,   1e300,
                           -2.5e-308, 123456789012345678.0,
                           4.9e-324,  9007199254740993.0};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) {
        char s[LOCO_PROM_VALUE_MAX];
        loco_prom_format_value(vals[i], s);
        cr_expect_eq(strtod(s, NULL), vals[i], "%.17g written as %s", vals[i], s);
        cr_expect(!strchr(s, ' ') && !strchr(s, ','), "%s", s);
    }
    char s[LOCO_PROM_VALUE_MAX];
    loco_prom_format_value(3, s);
    cr_expect_str_eq(s, "3");
    loco_prom_format_value(-NAN, s);
    cr_expect_str_eq(s, "NaN");
}

Test(prom, registry_contract) {
    loco_prom *p;
    cr_assert_eq(loco_prom_create(&p), 0);
    cr_expect_eq(loco_prom_declare(p, "9bad", LOCO_PROM_GAUGE, NULL, "x"), LOCO_EINVAL);
    cr_expect_eq(loco_prom_declare(p, "bad-name", LOCO_PROM_GAUGE, NULL, "x"), LOCO_EINVAL);
    cr_expect_eq(loco_prom_declare(p, "ok", LOCO_PROM_GAUGE, "has:colon", "x"), LOCO_EINVAL);
    cr_expect_eq(loco_prom_declare(p, "ok", LOCO_PROM_GAUGE, "__reserved", "x"), LOCO_EINVAL);
    cr_assert_eq(loco_prom_declare(p, "ok:name", LOCO_PROM_GAUGE, "l", "x"), 0);
    cr_expect_eq(loco_prom_declare(p, "ok:name", LOCO_PROM_GAUGE, NULL, "x"), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "declared twice"), "%s", loco_errmsg());
    loco_prom_set(p, "undeclared", NULL, 1); /* ignored */
    loco_prom_set(p, "ok:name", NULL, 1);    /* no label: the declaration has one */
    loco_prom_set(p, "ok:name", "a", 1);
    loco_prom_set_only(p, "ok:name", "b", 2); /* a is forgotten */
    char *text;
    size_t len;
    cr_assert_eq(loco_prom_render(p, &text, &len), 0);
    cr_expect_str_eq(text, "# HELP ok:name x\n# TYPE ok:name gauge\nok:name{l=\"b\"} 2\n");
    loco_free(text);
    loco_prom_set(NULL, "ok:name", "a", 1); /* metrics off */
    loco_prom_destroy(p);
    loco_prom_destroy(NULL);
}
