/* The object store: plain paths and file:// URLs (atomic puts, no partial
 * files), and https:// against a real nginx with WebDAV over TLS: round
 * trips, MKCOL for missing collections, HTTP errors, a server signed by
 * another CA refused, an unreachable URL named in the error. */
#include "core/core.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "tests/webdav.h"

static char *dir;
static t_dav dav;

static void setup(void) {
    dir = strdup("/tmp/loco-store-XXXXXX");
    cr_assert(mkdtemp(dir));
    loco_log_set_level(LOCO_LOG_ERROR);
}

static void teardown(void) {
    t_dav_stop(&dav);
    loco_rmtree(dir);
    free(dir);
}

TestSuite(store, .init = setup, .fini = teardown);

/* Number of entries of a directory whose name contains ".tmp". */
static int temp_files(const char *path) {
    DIR *d = opendir(path);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strstr(e->d_name, ".tmp") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* put, get, get_file, exists, delete at base/name; base is a path or URL
 * of directory `local` (for the temporary-file check). */
static void round_trip(loco_store *s, const char *base, const char *local) {
    char loc[512], file[512];
    const char text[] = "checkpoint bytes\n";
    cr_assert_eq(loco_store_join(loc, sizeof loc, base, "a/b/obj.bin"), 0);
    bool ex = true;
    cr_assert_eq(loco_store_exists(s, loc, &ex), 0, "%s", loco_errmsg());
    cr_expect(!ex);
    cr_assert_eq(loco_store_put(s, loc, text, sizeof text - 1), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_store_exists(s, loc, &ex), 0, "%s", loco_errmsg());
    cr_expect(ex);
    void *data;
    size_t len;
    cr_assert_eq(loco_store_get(s, loc, 1024, &data, &len), 0, "%s", loco_errmsg());
    cr_expect_eq(len, sizeof text - 1);
    cr_expect_eq(memcmp(data, text, len), 0);
    loco_free(data);
    cr_expect_eq(loco_store_get(s, loc, 4, &data, &len), LOCO_EPROTO, "size limit");

    /* A replaced object reads as the new one. */
    cr_assert_eq(loco_store_put(s, loc, "x", 1), 0, "%s", loco_errmsg());
    snprintf(file, sizeof file, "%s/down/load.bin", dir);
    cr_assert_eq(loco_store_get_file(s, loc, file), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_file_read(file, &data, &len), 0);
    cr_expect(len == 1 && ((char *)data)[0] == 'x');
    loco_free(data);

    /* put_file of a few MiB streams from the file. */
    const size_t big = 3u << 20;
    uint8_t *buf = loco_alloc(big);
    loco_rng rng;
    loco_rng_seed(&rng, 5);
    for (size_t i = 0; i < big; i++)
        buf[i] = (uint8_t)loco_rng_u64(&rng);
    char src[512], big_loc[512];
    snprintf(src, sizeof src, "%s/big.src", dir);
    cr_assert_eq(loco_file_write_sync(src, buf, big), 0);
    cr_assert_eq(loco_store_join(big_loc, sizeof big_loc, base, "a/c/big.bin"), 0);
    cr_assert_eq(loco_store_put_file(s, big_loc, src), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_store_get_file(s, big_loc, file), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_file_read(file, &data, &len), 0);
    cr_expect(len == big && memcmp(data, buf, big) == 0, "big object differs after round trip");
    loco_free(data);
    loco_free(buf);

    cr_assert_eq(loco_store_delete(s, loc), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_store_exists(s, loc, &ex), 0, "%s", loco_errmsg());
    cr_expect(!ex);
    cr_expect_eq(loco_store_delete(s, loc), 0, "deleting a missing object is fine");
    cr_expect_eq(loco_store_delete(s, big_loc), 0, "%s", loco_errmsg());

    /* A failed download leaves neither the file nor a temporary. */
    snprintf(file, sizeof file, "%s/down/missing.bin", dir);
    int rc = loco_store_get_file(s, loc, file);
    cr_expect_eq(rc, LOCO_EIO, "%s", loco_errmsg());
    cr_expect(strstr(loco_errmsg(), "obj.bin"), "message names the object: %s", loco_errmsg());
    cr_expect_neq(access(file, F_OK), 0);
    char down[512], sub[512];
    snprintf(down, sizeof down, "%s/down", dir);
    cr_expect_eq(temp_files(down), 0, "temporary files left in %s", down);
    if (local) {
        snprintf(sub, sizeof sub, "%s/a/b", local);
        cr_expect_eq(temp_files(sub), 0, "temporary files left in %s", sub);
    }
}

Test(store, plain_paths) {
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, NULL), 0);
    char base[512];
    snprintf(base, sizeof base, "%s/objects", dir);
    round_trip(s, base, base);
    loco_store_destroy(s);
}

Test(store, file_urls) {
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, NULL), 0);
    char base[512], local[512];
    snprintf(base, sizeof base, "file://%s/with%%20space", dir);
    snprintf(local, sizeof local, "%s/with space", dir);
    round_trip(s, base, local);
    /* The escape was decoded: the objects live under "with space". */
    char loc[600];
    snprintf(loc, sizeof loc, "file://localhost%s/with%%20space/x", dir);
    cr_assert_eq(loco_store_put(s, loc, "y", 1), 0, "%s", loco_errmsg());
    snprintf(loc, sizeof loc, "%s/x", local);
    cr_expect_eq(access(loc, F_OK), 0, "file://localhost/... wrote %s", loc);
    cr_expect_eq(loco_store_put(s, "file://relative/x", "y", 1), LOCO_EINVAL);
    loco_store_destroy(s);
}

Test(store, names_and_schemes) {
    char out[64];
    cr_expect_eq(loco_store_join(out, sizeof out, "https://h/a/", "/b"), 0);
    cr_expect_str_eq(out, "https://h/a/b");
    cr_expect_eq(loco_store_join(out, sizeof out, "/x", "y"), 0);
    cr_expect_str_eq(out, "/x/y");
    cr_expect_eq(loco_store_join(out, 8, "/long/path", "y"), LOCO_EINVAL);
    cr_expect(loco_store_is_url("https://h/x") && loco_store_is_url("file:///x"));
    cr_expect(loco_store_is_url("s3://b/k"), "any scheme is a URL, refused below");
    cr_expect(!loco_store_is_url("runs/x") && !loco_store_is_url("/abs/x"));
    cr_expect(!loco_store_is_url("dir:with:colons/x"));
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, NULL), 0);
    cr_expect_eq(loco_store_put(s, "s3://bucket/key", "x", 1), LOCO_ENOTSUP);
    cr_expect(strstr(loco_errmsg(), "s3://bucket/key"), "%s", loco_errmsg());
    cr_expect_eq(loco_store_put(s, "https://h/x?sig=1", "x", 1), LOCO_EINVAL);
    cr_expect_eq(loco_store_put(s, "", "x", 1), LOCO_EINVAL);
    loco_store_destroy(s);
}

Test(store, unreachable_url_named_in_the_error, .timeout = 30) {
    loco_store_opts o;
    loco_store_opts_default(&o);
    o.connect_timeout_ms = 2000;
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, &o), 0);
    char url[128];
    snprintf(url, sizeof url, "https://127.0.0.1:%d/ckpt/LATEST", t_free_port());
    void *data;
    size_t len;
    int rc = loco_store_get(s, url, 1024, &data, &len);
    cr_expect_eq(rc, LOCO_EIO, "rc %d: %s", rc, loco_errmsg());
    cr_expect(strstr(loco_errmsg(), url) && strstr(loco_errmsg(), "curl error"),
              "message names the URL and the curl error: %s", loco_errmsg());
    loco_store_destroy(s);
}

Test(store, webdav_over_tls, .timeout = 60) {
    t_dav_start(&dav);
    loco_store_opts o;
    t_dav_opts(&dav, &o);
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, &o), 0);
    char base[128], local[256];
    snprintf(base, sizeof base, "%s/full/run1", dav.url);
    snprintf(local, sizeof local, "%s/full/run1", dav.www);
    round_trip(s, base, local);
    /* What the server holds is what was put. */
    char loc[256], path[256];
    snprintf(loc, sizeof loc, "%s/full/run1/k/v", dav.url);
    cr_assert_eq(loco_store_put(s, loc, "value", 5), 0, "%s", loco_errmsg());
    snprintf(path, sizeof path, "%s/full/run1/k/v", dav.www);
    void *data;
    size_t len;
    cr_assert_eq(loco_file_read(path, &data, &len), 0);
    cr_expect(len == 5 && !memcmp(data, "value", 5));
    loco_free(data);
    loco_store_destroy(s);
}

Test(store, webdav_collections_made_with_mkcol, .timeout = 60) {
    t_dav_start(&dav);
    loco_store_opts o;
    t_dav_opts(&dav, &o);
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, &o), 0);
    char loc[256], path[256];
    snprintf(loc, sizeof loc, "%s/dav/x/y/z/obj", dav.url);
    cr_assert_eq(loco_store_put(s, loc, "abc", 3), 0, "%s", loco_errmsg());
    snprintf(path, sizeof path, "%s/dav/x/y/z/obj", dav.www);
    cr_expect_eq(access(path, F_OK), 0, "%s not written", path);
    /* Existing collections are fine on the next put. */
    snprintf(loc, sizeof loc, "%s/dav/x/y/w/obj", dav.url);
    cr_assert_eq(loco_store_put(s, loc, "abc", 3), 0, "%s", loco_errmsg());
    loco_store_destroy(s);
}

Test(store, http_error_status_named, .timeout = 60) {
    t_dav_start(&dav);
    loco_store_opts o;
    t_dav_opts(&dav, &o);
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, &o), 0);
    char loc[256];
    snprintf(loc, sizeof loc, "%s/ro/obj", dav.url);
    int rc = loco_store_put(s, loc, "abc", 3);
    cr_expect_eq(rc, LOCO_EPEER, "rc %d: %s", rc, loco_errmsg());
    cr_expect(strstr(loco_errmsg(), loc) && strstr(loco_errmsg(), "HTTP 405"),
              "message names the URL and the status: %s", loco_errmsg());
    void *data;
    size_t len;
    snprintf(loc, sizeof loc, "%s/full/none", dav.url);
    cr_expect_eq(loco_store_get(s, loc, 100, &data, &len), LOCO_EIO);
    cr_expect(strstr(loco_errmsg(), "HTTP 404"), "%s", loco_errmsg());
    loco_store_destroy(s);
}

Test(store, server_of_another_ca_refused, .timeout = 60) {
    t_dav_start(&dav);
    char other[480];
    snprintf(other, sizeof other, "%s/other", dir);
    const char *names[] = {"someone"};
    cr_assert_eq(loco_net_make_certs(other, names, 1, 1), 0, "%s", loco_errmsg());
    loco_store_opts o;
    t_dav_opts(&dav, &o);
    snprintf(o.ca, sizeof o.ca, "%s/ca.pem", other);
    loco_store *s;
    cr_assert_eq(loco_store_create(&s, &o), 0);
    char loc[256], path[256];
    snprintf(loc, sizeof loc, "%s/full/obj", dav.url);
    int rc = loco_store_put(s, loc, "abc", 3);
    cr_expect_eq(rc, LOCO_EAUTH, "rc %d: %s", rc, loco_errmsg());
    cr_expect(strstr(loco_errmsg(), loc) && strstr(loco_errmsg(), "certificate"),
              "message names the URL and the certificate problem: %s", loco_errmsg());
    snprintf(path, sizeof path, "%s/full/obj", dav.www);
    cr_expect_neq(access(path, F_OK), 0, "nothing reached the server");
    loco_store_destroy(s);
}
