/* The object store: whole objects at plain paths, file:// URLs (POSIX, so
 * that a put is atomic: libcurl's FILE protocol writes in place) and
 * http(s):// URLs through libcurl, with WebDAV's MKCOL where a server wants
 * collections created before a PUT.
 *
 * One file: the three stores (paths, file://, WebDAV over libcurl) share the
 * atomic put, the listing and the retry rules; each is a few functions. */
#include "core/core.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COPY_CHUNK (1 << 20) /* bytes per read/write when copying files */
#define MKCOL_ONCE 1         /* a PUT refused for a missing parent is retried once */

struct loco_store {
    loco_store_opts o;
    CURL *curl;
    char errbuf[CURL_ERROR_SIZE];
};

typedef enum { LOC_PATH, LOC_FILE, LOC_HTTP, LOC_OTHER } loc_kind;

void loco_store_opts_default(loco_store_opts *o) {
    const loco_config *d = loco_config_default();
    memset(o, 0, sizeof *o);
    o->connect_timeout_ms = (long)d->run.ckpt_connect_ms;
    o->stall_timeout_s = (long)d->run.ckpt_stall_s;
}

void loco_store_opts_from_config(loco_store_opts *o, const loco_config *cfg) {
    loco_store_opts_default(o);
    snprintf(o->ca, sizeof o->ca, "%s", cfg->net.ca);
    snprintf(o->cert, sizeof o->cert, "%s", cfg->net.cert);
    snprintf(o->key, sizeof o->key, "%s", cfg->net.key);
    o->connect_timeout_ms = (long)cfg->run.ckpt_connect_ms;
    o->stall_timeout_s = (long)cfg->run.ckpt_stall_s;
}

/* Length of "scheme://" at the start of loc, or 0. */
static size_t scheme_len(const char *loc) {
    size_t i = 0;
    while ((loc[i] >= 'a' && loc[i] <= 'z') || (loc[i] >= 'A' && loc[i] <= 'Z') ||
           (i > 0 && ((loc[i] >= '0' && loc[i] <= '9') || strchr("+-.", loc[i]))))
        i++;
    return i > 0 && !strncmp(loc + i, "://", 3) ? i + 3 : 0;
}

bool loco_store_is_url(const char *loc) {
    return loc && scheme_len(loc) > 0;
}

static loc_kind kind_of(const char *loc) {
    size_t n = scheme_len(loc);
    if (n == 0)
        return LOC_PATH;
    if (n == 7 && !strncasecmp(loc, "file://", 7))
        return LOC_FILE;
    if ((n == 7 && !strncasecmp(loc, "http://", 7)) || (n == 8 && !strncasecmp(loc, "https://", 8)))
        return LOC_HTTP;
    return LOC_OTHER;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The local path of a plain path or file:// URL (file:///p or
 * file://localhost/p, percent-escapes decoded). */
static int local_path(const char *loc, char *out, size_t cap) {
    const char *p = loc;
    if (kind_of(loc) == LOC_FILE) {
        p = loc + 7;
        if (!strncasecmp(p, "localhost/", 10))
            p += 9;
        if (*p != '/')
            return LOCO_ERR(LOCO_EINVAL, "%s: a file:// URL needs an absolute path (file:///...)",
                            loc);
    }
    const bool decode = p != loc;
    size_t n = 0;
    for (; *p; p++) {
        char c = *p;
        if (decode && c == '%' && hexval(p[1]) >= 0 && hexval(p[2]) >= 0) {
            c = (char)(hexval(p[1]) * 16 + hexval(p[2]));
            p += 2;
        }
        if (n + 1 >= cap)
            return LOCO_ERR(LOCO_EINVAL, "%s: path too long", loc);
        out[n++] = c;
    }
    out[n] = '\0';
    if (n == 0)
        return LOCO_ERR(LOCO_EINVAL, "empty location");
    return 0;
}

int loco_store_join(char *dst, size_t cap, const char *base, const char *name) {
    size_t b = strlen(base);
    while (*name == '/')
        name++;
    const char *sep = b > 0 && base[b - 1] == '/' ? "" : "/";
    if (snprintf(dst, cap, "%s%s%s", base, sep, name) >= (int)cap)
        return LOCO_ERR(LOCO_EINVAL, "location too long: %s%s%s", base, sep, name);
    return 0;
}

/* ------------------------------------------------------------ local files */

static void parent_of(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash == out)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(out, cap, ".");
}

static int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "%s: open: %s", dir, strerror(errno));
    int rc = fsync(fd) == 0 || errno == EINVAL
                 ? 0
                 : LOCO_ERR(LOCO_EIO, "%s: fsync: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

/* A temporary file beside path (parents created): *fd open for writing,
 * tmp its name. */
static int open_temp(const char *path, char *tmp, size_t cap, int *fd) {
    char parent[PATH_MAX];
    parent_of(path, parent, sizeof parent);
    LOCO_CHECK(loco_mkdirs(parent));
    if (snprintf(tmp, cap, "%s.tmp.XXXXXX", path) >= (int)cap)
        return LOCO_ERR(LOCO_EINVAL, "%s: path too long", path);
    *fd = mkostemp(tmp, O_CLOEXEC);
    if (*fd < 0)
        return LOCO_ERR(LOCO_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    fchmod(*fd, 0644);
    return 0;
}

static int write_all(int fd, const char *name, const void *data, size_t len) {
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return LOCO_ERR(LOCO_EIO, "%s: write failed: %s", name, strerror(errno));
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fsyncs and closes fd, renames tmp to path and fsyncs the directory; on
 * any failure (rc < 0 on entry included) the temporary is removed. */
static int publish_temp(int rc, int fd, const char *tmp, const char *path) {
    if (rc == 0 && fsync(fd) != 0)
        rc = LOCO_ERR(LOCO_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = LOCO_ERR(LOCO_EIO, "%s: close failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = LOCO_ERR(LOCO_EIO, "rename %s -> %s: %s", tmp, path, strerror(errno));
    if (rc < 0) {
        unlink(tmp);
        return rc;
    }
    char parent[PATH_MAX];
    parent_of(path, parent, sizeof parent);
    return fsync_dir(parent);
}

/* Atomically writes a buffer (src == NULL) or a copy of file src to path. */
static int local_put(const char *path, const void *data, size_t len, const char *src) {
    char tmp[PATH_MAX + 16];
    int fd, rc = 0;
    LOCO_CHECK(open_temp(path, tmp, sizeof tmp, &fd));
    if (!src) {
        rc = write_all(fd, tmp, data, len);
        return publish_temp(rc, fd, tmp, path);
    }
    int in = open(src, O_RDONLY | O_CLOEXEC);
    char *buf = loco_alloc(COPY_CHUNK);
    if (in < 0)
        rc = LOCO_ERR(LOCO_EIO, "%s: cannot open: %s", src, strerror(errno));
    else if (!buf)
        rc = LOCO_ERR(LOCO_ENOMEM, "copy buffer");
    while (rc == 0) {
        ssize_t r = read(in, buf, COPY_CHUNK);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            rc = LOCO_ERR(LOCO_EIO, "%s: read failed: %s", src, strerror(errno));
        if (r <= 0)
            break;
        rc = write_all(fd, tmp, buf, (size_t)r);
    }
    loco_free(buf);
    if (in >= 0)
        close(in);
    return publish_temp(rc, fd, tmp, path);
}

/* ------------------------------------------------------------------ HTTP */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int loco_store_create(loco_store **out, const loco_store_opts *o) {
    *out = NULL;
    loco_store *s = loco_alloc(sizeof *s);
    if (!s)
        return LOCO_ERR(LOCO_ENOMEM, "store handle");
    if (o)
        s->o = *o;
    else
        loco_store_opts_default(&s->o);
    *out = s;
    return 0;
}

void loco_store_destroy(loco_store *s) {
    if (!s)
        return;
    if (s->curl)
        curl_easy_cleanup(s->curl);
    loco_free(s);
}

/* The easy handle, reset to the options every request shares. */
static int http_prepare(loco_store *s, const char *url) {
    if (!s->curl) {
        pthread_once(&curl_once, curl_init);
        if (curl_init_rc != CURLE_OK)
            return LOCO_ERR(LOCO_EIO, "libcurl initialisation failed: %s",
                            curl_easy_strerror(curl_init_rc));
        s->curl = curl_easy_init();
        if (!s->curl)
            return LOCO_ERR(LOCO_ENOMEM, "libcurl handle");
    }
    CURL *c = s->curl;
    curl_easy_reset(c); /* keeps the connection and TLS session caches */
    s->errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, s->errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, s->o.connect_timeout_ms);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, s->o.stall_timeout_s);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (s->o.ca[0])
        curl_easy_setopt(c, CURLOPT_CAINFO, s->o.ca);
    if (s->o.cert[0])
        curl_easy_setopt(c, CURLOPT_SSLCERT, s->o.cert);
    if (s->o.key[0])
        curl_easy_setopt(c, CURLOPT_SSLKEY, s->o.key);
    return 0;
}

/* An error naming the request and why it failed. */
static int http_error(loco_store *s, const char *method, const char *url, CURLcode cc, long code) {
    if (cc == CURLE_OK || cc == CURLE_HTTP_RETURNED_ERROR) {
        int rc = code == 401 || code == 403 ? LOCO_EAUTH : code == 404 ? LOCO_EIO : LOCO_EPEER;
        return LOCO_ERR(rc, "%s %s: HTTP %ld%s", method, url, code,
                        code == 404 ? " (not found)" : "");
    }
    int rc = LOCO_EIO;
    switch (cc) {
    case CURLE_OPERATION_TIMEDOUT: rc = LOCO_ETIMEDOUT; break;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH: rc = LOCO_EAUTH; break;
    case CURLE_UNSUPPORTED_PROTOCOL: rc = LOCO_ENOTSUP; break;
    default: break;
    }
    return LOCO_ERR(rc, "%s %s: curl error %d: %s", method, url, (int)cc,
                    s->errbuf[0] ? s->errbuf : curl_easy_strerror(cc));
}

static size_t sink(char *p, size_t size, size_t n, void *user) {
    (void)p, (void)user;
    return size * n;
}

/* Runs the prepared request; *code receives the HTTP status. */
static CURLcode http_perform(loco_store *s, long *code) {
    CURLcode cc = curl_easy_perform(s->curl);
    *code = 0;
    curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, code);
    return cc;
}

/* Where a PUT's bytes come from: a buffer or an open file. */
typedef struct {
    const char *p;
    size_t left;
    FILE *f;
} upload_src;

static size_t read_src(char *dst, size_t size, size_t n, void *user) {
    upload_src *u = user;
    size_t want = size * n;
    if (u->f) {
        size_t r = fread(dst, 1, want, u->f);
        return r == 0 && ferror(u->f) ? CURL_READFUNC_ABORT : r;
    }
    if (want > u->left)
        want = u->left;
    memcpy(dst, u->p, want);
    u->p += want;
    u->left -= want;
    return want;
}

/* MKCOL every collection above the object at url, top down. Answers are
 * not errors here (405 = exists; anything else shows in the PUT's). */
static void http_mkcols(loco_store *s, const char *url) {
    const char *host = strstr(url, "://") + 3;
    const char *path = strchr(host, '/');
    const char *last = strrchr(url, '/');
    if (!path)
        return;
    for (const char *p = strchr(path + 1, '/'); p && p <= last; p = strchr(p + 1, '/')) {
        char col[PATH_MAX * 2];
        int n = (int)(p - url) + 1;
        if (n >= (int)sizeof col)
            return;
        snprintf(col, (size_t)n + 1, "%s", url);
        if (http_prepare(s, col) < 0)
            return;
        curl_easy_setopt(s->curl, CURLOPT_CUSTOMREQUEST, "MKCOL");
        curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, sink);
        long code;
        CURLcode cc = http_perform(s, &code);
        loco_debug("MKCOL %s: %s, HTTP %ld", col, curl_easy_strerror(cc), code);
    }
}

static int http_put(loco_store *s, const char *url, const void *data, size_t len,
                    const char *path) {
    FILE *f = NULL;
    if (path) {
        f = fopen(path, "rb");
        struct stat st;
        if (!f || fstat(fileno(f), &st) != 0) {
            int rc = LOCO_ERR(LOCO_EIO, "%s: cannot open: %s", path, strerror(errno));
            if (f)
                fclose(f);
            return rc;
        }
        len = (size_t)st.st_size;
    }
    int rc = 0;
    for (int attempt = 0; attempt <= MKCOL_ONCE; attempt++) {
        upload_src u = {.p = data, .left = len, .f = f};
        if (f)
            rewind(f);
        LOCO_CHECK_GOTO(http_prepare(s, url), out);
        curl_easy_setopt(s->curl, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(s->curl, CURLOPT_READFUNCTION, read_src);
        curl_easy_setopt(s->curl, CURLOPT_READDATA, &u);
        curl_easy_setopt(s->curl, CURLOPT_INFILESIZE_LARGE, (curl_off_t)len);
        curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, sink);
        long code;
        CURLcode cc = http_perform(s, &code);
        if (cc == CURLE_OK && code >= 200 && code < 300)
            goto out;
        /* RFC 4918 answers 409 for a missing collection; nginx 500 (and
         * some servers 404): create the collections and try once more. */
        if (cc == CURLE_OK && (code == 409 || code == 404 || code == 500) && attempt < MKCOL_ONCE) {
            http_mkcols(s, url);
            continue;
        }
        rc = http_error(s, "PUT", url, cc, code);
        goto out;
    }
out:
    if (f)
        fclose(f);
    return rc;
}

/* Growing download buffer with a size limit. */
typedef struct {
    char *p;
    size_t len, cap, max;
    bool too_big;
} mem_sink;

static size_t write_mem(char *src, size_t size, size_t n, void *user) {
    mem_sink *m = user;
    size_t add = size * n;
    if (m->len + add > m->max) {
        m->too_big = true;
        return 0;
    }
    if (m->len + add + 1 > m->cap) {
        size_t cap = m->cap ? m->cap : 4096;
        while (cap < m->len + add + 1)
            cap *= 2;
        char *p = loco_alloc(cap);
        if (!p)
            return 0;
        if (m->len)
            memcpy(p, m->p, m->len);
        loco_free(m->p);
        m->p = p;
        m->cap = cap;
    }
    memcpy(m->p + m->len, src, add);
    m->len += add;
    m->p[m->len] = '\0';
    return add;
}

static int http_get(loco_store *s, const char *url, size_t max_len, void **data, size_t *len) {
    mem_sink m = {.max = max_len};
    LOCO_CHECK(http_prepare(s, url));
    curl_easy_setopt(s->curl, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, write_mem);
    curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, &m);
    long code;
    CURLcode cc = http_perform(s, &code);
    int rc = 0;
    if (m.too_big)
        rc = LOCO_ERR(LOCO_EPROTO, "GET %s: object larger than %zu bytes", url, max_len);
    else if (cc != CURLE_OK)
        rc = http_error(s, "GET", url, cc, code);
    else if (!m.p && !(m.p = loco_alloc(1)))
        rc = LOCO_ERR(LOCO_ENOMEM, "GET %s: buffer", url);
    if (rc < 0) {
        loco_free(m.p);
        return rc;
    }
    *data = m.p;
    *len = m.len;
    return 0;
}

/* Download target: a descriptor, and whether a write failed. */
typedef struct {
    int fd;
    int err; /* errno of the failed write, 0 if none */
} fd_sink;

static size_t write_fd(char *src, size_t size, size_t n, void *user) {
    fd_sink *d = user;
    size_t left = size * n;
    while (left > 0) {
        ssize_t w = write(d->fd, src, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            d->err = errno;
            return 0;
        }
        src += w;
        left -= (size_t)w;
    }
    return size * n;
}

static int http_get_file(loco_store *s, const char *url, const char *path) {
    char tmp[PATH_MAX + 16];
    fd_sink d = {.fd = -1};
    LOCO_CHECK(open_temp(path, tmp, sizeof tmp, &d.fd));
    int rc = http_prepare(s, url);
    if (rc == 0) {
        curl_easy_setopt(s->curl, CURLOPT_FAILONERROR, 1L);
        curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, write_fd);
        curl_easy_setopt(s->curl, CURLOPT_WRITEDATA, &d);
        long code;
        CURLcode cc = http_perform(s, &code);
        if (d.err)
            rc = LOCO_ERR(LOCO_EIO, "GET %s: writing %s failed: %s", url, tmp, strerror(d.err));
        else if (cc != CURLE_OK)
            rc = http_error(s, "GET", url, cc, code);
    }
    return publish_temp(rc, d.fd, tmp, path);
}

static int http_head(loco_store *s, const char *url, bool *exists) {
    LOCO_CHECK(http_prepare(s, url));
    curl_easy_setopt(s->curl, CURLOPT_NOBODY, 1L);
    long code;
    CURLcode cc = http_perform(s, &code);
    if (cc == CURLE_OK && code >= 200 && code < 300) {
        *exists = true;
        return 0;
    }
    if (cc == CURLE_OK && (code == 404 || code == 410)) {
        *exists = false;
        return 0;
    }
    return http_error(s, "HEAD", url, cc, code);
}

static int http_delete(loco_store *s, const char *url) {
    LOCO_CHECK(http_prepare(s, url));
    curl_easy_setopt(s->curl, CURLOPT_CUSTOMREQUEST, "DELETE");
    curl_easy_setopt(s->curl, CURLOPT_WRITEFUNCTION, sink);
    long code;
    CURLcode cc = http_perform(s, &code);
    if (cc == CURLE_OK && ((code >= 200 && code < 300) || code == 404 || code == 410))
        return 0;
    return http_error(s, "DELETE", url, cc, code);
}

/* ------------------------------------------------------------ the calls */

/* Resolves loc: LOC_HTTP, or a local path in buf. */
static int resolve(const char *loc, char *buf, size_t cap, loc_kind *kind) {
    if (!loc || !*loc)
        return LOCO_ERR(LOCO_EINVAL, "empty location");
    *kind = kind_of(loc);
    if (*kind == LOC_OTHER)
        return LOCO_ERR(LOCO_ENOTSUP, "%s: unsupported scheme (file://, http://, https://)", loc);
    if (*kind == LOC_HTTP) {
        if (strchr(loc, '?') || strchr(loc, '#'))
            return LOCO_ERR(LOCO_EINVAL, "%s: store URLs take no query or fragment", loc);
        return 0;
    }
    return local_path(loc, buf, cap);
}

int loco_store_put(loco_store *s, const char *loc, const void *data, size_t len) {
    char path[PATH_MAX];
    loc_kind k;
    LOCO_CHECK(resolve(loc, path, sizeof path, &k));
    if (k == LOC_HTTP)
        return http_put(s, loc, data, len, NULL);
    return local_put(path, data, len, NULL);
}

int loco_store_put_file(loco_store *s, const char *loc, const char *src) {
    char path[PATH_MAX];
    loc_kind k;
    LOCO_CHECK(resolve(loc, path, sizeof path, &k));
    if (k == LOC_HTTP)
        return http_put(s, loc, NULL, 0, src);
    return local_put(path, NULL, 0, src);
}

int loco_store_get(loco_store *s, const char *loc, size_t max_len, void **data, size_t *len) {
    char path[PATH_MAX];
    loc_kind k;
    *data = NULL;
    *len = 0;
    LOCO_CHECK(resolve(loc, path, sizeof path, &k));
    if (k == LOC_HTTP)
        return http_get(s, loc, max_len, data, len);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size > max_len)
        return LOCO_ERR(LOCO_EPROTO, "%s: object larger than %zu bytes", loc, max_len);
    return loco_file_read(path, data, len);
}

int loco_store_get_file(loco_store *s, const char *loc, const char *dst) {
    char path[PATH_MAX];
    loc_kind k;
    LOCO_CHECK(resolve(loc, path, sizeof path, &k));
    if (k == LOC_HTTP)
        return http_get_file(s, loc, dst);
    return local_put(dst, NULL, 0, path);
}

int loco_store_exists(loco_store *s, const char *loc, bool *exists) {
    char path[PATH_MAX];
    loc_kind k;
    *exists = false;
    LOCO_CHECK(resolve(loc, path, sizeof path, &k));
    if (k == LOC_HTTP)
        return http_head(s, loc, exists);
    struct stat st;
    if (stat(path, &st) == 0) {
        *exists = S_ISREG(st.st_mode);
        return 0;
    }
    if (errno == ENOENT || errno == ENOTDIR)
        return 0;
    return LOCO_ERR(LOCO_EIO, "%s: stat: %s", loc, strerror(errno));
}

int loco_store_delete(loco_store *s, const char *loc) {
    char path[PATH_MAX];
    loc_kind k;
    LOCO_CHECK(resolve(loc, path, sizeof path, &k));
    if (k == LOC_HTTP)
        return http_delete(s, loc);
    if (unlink(path) != 0 && errno != ENOENT)
        return LOCO_ERR(LOCO_EIO, "%s: delete: %s", loc, strerror(errno));
    return 0;
}
