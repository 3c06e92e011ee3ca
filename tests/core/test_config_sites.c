/* [site.NAME] keys: what one island of a multi-site run sets for itself,
 * applied by that island alone, dumped and loaded back; and what a site may
 * not set, refused naming where it was given. */
#include "tests/core/config_test.h"

#include <glob.h>

TestSuite(config_sites, .init = setup, .fini = teardown);

/* [site.NAME] keys: kept for that site's island, applied by it alone, in
 * the order given (a --set after the file wins), dumped and loaded back. */
Test(config_sites, sections_set_keys_for_one_island) {
    char path[512];
    write_ini(path, "sites.ini",
              "[outer]\nsites = big,small\n[train]\nbatch_size = 8\n"
              "[site.small]\ntrain.batch_size = 2\ntrain.grad_accum = 3\nrun.threads = 1\n"
              "[site.big]\nparallel.backend = self\n");
    loco_config c;
    loco_config_defaults(&c);
    cr_assert_eq(loco_config_load(&c, path), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_config_set(&c, "site.small.train.batch_size=4"), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_config_validate(&c), 0, "%s", loco_errmsg());
    cr_expect_eq(c.train.batch_size, 8, "the run's value stays until a site is chosen");
    loco_config small = c, big = c;
    cr_assert_eq(loco_config_for_site(&small, "small"), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_config_for_site(&big, "big"), 0, "%s", loco_errmsg());
    cr_expect_eq(small.train.batch_size, 4);
    cr_expect_eq(small.train.grad_accum, 3);
    cr_expect_eq(small.run.threads, 1);
    cr_expect_str_eq(small.parallel.backend, "auto");
    cr_expect_eq(big.train.batch_size, 8);
    cr_expect_str_eq(big.parallel.backend, "self");
    /* the dump carries the sections; it loads back to the same dump */
    char *text = dump_text(&c);
    assert_has(text, "[site.small]\ntrain.batch_size = 4\ntrain.grad_accum = 3\nrun.threads = 1\n");
    write_ini(path, "dump.ini", text);
    loco_config back;
    loco_config_defaults(&back);
    cr_assert_eq(loco_config_load(&back, path), 0, "%s", loco_errmsg());
    char *again = dump_text(&back);
    cr_expect_str_eq(again, text);
    free(text);
    free(again);
}

/* What a site may not set, and a site's key that is no key, no site of
 * the run, or a mesh of its own, is refused naming where it was given. */
Test(config_sites, keys_that_cannot_be_per_island_are_refused) {
    static const struct {
        const char *ini, *where, *what;
    } cases[] = {
        {"[site.a]\nmodel.n_layer = 4\n", ":2", "same for every island"},
        {"[site.a]\nouter.H = 4\n", ":2", "same for every island"},
        {"[site.a]\ntrain.batch_size = lots\n", ":2", "expected an integer"},
        {"[site.a]\ntrain.nope = 1\n", ":2", "unknown key 'train.nope'"},
        {"[site.a]\nbatch_size = 1\n", ":2", "expected section.key"},
        {"[site.a b]\ntrain.batch_size = 1\n", ":2", "expected a site name"},
        {"[outer]\nsites = a,b\n[site.c]\ntrain.batch_size = 2\n", ":4", "no such site"},
        {"[outer]\nsites = a,b\n[site.b]\nparallel.tp = 2\n", ":4", "share one mesh"},
        {"[outer]\nsites = a,b\n[site.b]\nparallel.pp_schedule = gpipe\n", ":4", "share one mesh"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512];
        write_ini(path, "bad.ini", cases[i].ini);
        loco_config c;
        loco_config_defaults(&c);
        int rc = loco_config_load(&c, path);
        if (rc == 0)
            rc = loco_config_validate(&c);
        cr_expect_eq(rc, LOCO_EINVAL, "case %zu loaded", i);
        char where[600];
        snprintf(where, sizeof where, "%s%s", path, cases[i].where);
        cr_expect(strstr(loco_errmsg(), where), "case %zu: no %s in: %s", i, where,
                  loco_errmsg());
        cr_expect(strstr(loco_errmsg(), cases[i].what), "case %zu: no '%s' in: %s", i,
                  cases[i].what, loco_errmsg());
    }
    /* the same mesh key at the run's value is no difference; --set names itself */
    loco_config c;
    loco_config_defaults(&c);
    cr_expect_eq(loco_config_set(&c, "site.a.parallel.dp=1"), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_config_validate(&c), 0, "%s", loco_errmsg());
    /* a ZeRO stage and sequence parallelism of its own: the same owned range */
    cr_expect_eq(loco_config_set(&c, "site.a.parallel.zero_stage=3"), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_config_set(&c, "site.a.parallel.sp=true"), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_config_validate(&c), 0, "%s", loco_errmsg());
    /* outer.layout = whole: a mesh of its own, which the site's config gets */
    cr_expect_eq(loco_config_set(&c, "site.a.parallel.tp=2"), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_config_validate(&c), LOCO_EINVAL);
    assert_has(loco_errmsg(), "outer.layout = whole lets them differ");
    cr_expect_eq(loco_config_set(&c, "outer.layout=whole"), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_config_set(&c, "site.a.parallel.pp=2"), 0, "%s", loco_errmsg());
    cr_expect_eq(loco_config_validate(&c), 0, "%s", loco_errmsg());
    loco_config site = c;
    cr_expect_eq(loco_config_for_site(&site, "a"), 0, "%s", loco_errmsg());
    cr_expect(site.parallel.tp == 2 && site.parallel.pp == 2 && c.parallel.tp == 1,
              "site a: tp %lld pp %lld", (long long)site.parallel.tp, (long long)site.parallel.pp);
    cr_expect_eq(loco_config_set(&c, "site.a.model.seq_len=4"), LOCO_EINVAL);
    assert_has(loco_errmsg(), "--set site.a.model.seq_len=4");
    cr_expect_eq(loco_config_set(&c, "site.a=4"), LOCO_EINVAL);
    assert_has(loco_errmsg(), "expected site.NAME.section.key=value");
}

/* Every config the project ships loads and validates, for every site its
 * [site.NAME] keys name (the multi-site examples included). */
Test(config_sites, the_shipped_configs_load_and_validate_for_every_site) {
    glob_t g;
    cr_assert_eq(glob("configs/*.ini", 0, NULL, &g), 0, "no configs/*.ini");
    int with_sites = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        loco_config c;
        loco_config_defaults(&c);
        cr_assert_eq(loco_config_load(&c, g.gl_pathv[i]), 0, "%s", loco_errmsg());
        cr_assert_eq(loco_config_validate(&c), 0, "%s", loco_errmsg());
        with_sites += c.n_site_sets > 0;
        for (int k = 0; k < c.n_site_sets; k++) {
            loco_config site = c;
            cr_assert_eq(loco_config_for_site(&site, c.site_set[k].site), 0, "%s: %s",
                         g.gl_pathv[i], loco_errmsg());
            cr_assert_eq(loco_config_validate(&site), 0, "%s: %s", g.gl_pathv[i], loco_errmsg());
        }
    }
    globfree(&g);
    cr_expect_geq(with_sites, 1, "configs/multisite-mixed.ini has [site.NAME] sections");
}
