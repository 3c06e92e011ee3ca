/* loco_net_pick_run_id: the precedence of `loco certs` (--run-id, then
 * net.run_id, then DIR/run_id, then a new random id), each source named,
 * and invalid ids refused. */
#include "net/net.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *dir;

static void setup(void) {
    dir = strdup("/tmp/loco-runid-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) {
    cr_assert_eq(loco_rmtree(dir), 0, "%s", loco_errmsg());
    free(dir);
}

TestSuite(run_id, .init = setup, .fini = teardown);

static void write_run_id(const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/run_id", dir);
    cr_assert_eq(loco_file_write_sync(path, text, strlen(text)), 0);
}

static void expect_pick(const char *opt, const char *cfg_id, const char *want,
                        const char *want_from) {
    char id[LOCO_NET_RUN_ID_MAX];
    const char *from = NULL;
    cr_assert_eq(loco_net_pick_run_id(id, &from, opt, cfg_id, dir), 0, "%s", loco_errmsg());
    cr_expect_str_eq(id, want);
    cr_expect_str_eq(from, want_from);
}

Test(run_id, precedence) {
    write_run_id("kept-1\n");
    expect_pick("opt.2", "cfg_3", "opt.2", "from --run-id");
    expect_pick(NULL, "cfg_3", "cfg_3", "from net.run_id");
    expect_pick(NULL, "", "kept-1", "kept from DIR/run_id");
    expect_pick(NULL, NULL, "kept-1", "kept from DIR/run_id");
}

Test(run_id, new_random_when_nothing_names_one) {
    char a[LOCO_NET_RUN_ID_MAX], b[LOCO_NET_RUN_ID_MAX];
    const char *from = NULL;
    cr_assert_eq(loco_net_pick_run_id(a, &from, NULL, NULL, dir), 0, "%s", loco_errmsg());
    cr_expect_str_eq(from, "new, random");
    cr_expect_eq(strlen(a), 16, "%s", a);
    cr_expect_eq(strspn(a, "0123456789abcdef"), 16, "%s", a);
    cr_assert_eq(loco_net_pick_run_id(b, &from, NULL, "", dir), 0);
    cr_expect_str_neq(a, b, "two new ids are the same");
}

Test(run_id, invalid_ids_are_refused) {
    char id[LOCO_NET_RUN_ID_MAX];
    const char *from = NULL;
    cr_expect_eq(loco_net_pick_run_id(id, &from, "no spaces", NULL, dir), LOCO_EINVAL);
    cr_expect_eq(loco_net_pick_run_id(id, &from, NULL, "bad/id", dir), LOCO_EINVAL);
    /* --run-id wins before a bad net.run_id is looked at */
    cr_expect_eq(loco_net_pick_run_id(id, &from, "ok", "bad/id", dir), 0);
    write_run_id("not an id\n");
    cr_expect_eq(loco_net_pick_run_id(id, &from, NULL, NULL, dir), LOCO_EINVAL);
    cr_expect(strstr(loco_errmsg(), "/run_id does not hold a run id"), "%s", loco_errmsg());
    cr_expect_str_eq(id, "");
}
