/* Checkpoints at a URL: a checkpoint directory written locally as usual is
 * uploaded under a fresh prefix, then a small pointer object (LATEST) is
 * put last; publishing the pointer is the atomic commit. Readers fetch the
 * pointer, download and verify every file it lists, and fall back to the
 * previous checkpoint the pointer remembers when the newest is torn. */
#include "inner/ckpt/internal.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define POINTER_NAME "LATEST"
#define POINTER_FORMAT "loco-checkpoint-pointer"
#define POINTER_VERSION 1
#define POINTER_MAX (1 << 20) /* bytes: a pointer lists a few files */
#define MAX_FILES 4096        /* files per checkpoint a pointer may list */
/* Earlier checkpoints a pointer names besides the newest, to fall back on
 * when it is torn; a few, since a torn one may itself have been the
 * "previous" of the next save (a run resumed from its predecessor). */
#define HISTORY 3

int loco_ckpt_stage_dir(const loco_config *cfg, int64_t step, char *out, size_t cap) {
    if (snprintf(out, cap, "%s/ckpt_stage/ckpt_%08lld", cfg->run.dir, (long long)step) >= (int)cap)
        return LOCO_ERR(LOCO_EINVAL, "run.dir too long for a staging path: %s", cfg->run.dir);
    return 0;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The regular files of dir, sorted (caller frees each and the array). */
static int list_files(const char *dir, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d)
        return LOCO_ERR(LOCO_EIO, "%s: cannot list: %s", dir, strerror(errno));
    int cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (e->d_name[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **p = realloc(*names, (size_t)cap * sizeof *p);
            if (!p) {
                rc = LOCO_ERR(LOCO_ENOMEM, "file list");
                break;
            }
            *names = p;
        }
        if (!((*names)[*n] = strdup(e->d_name))) {
            rc = LOCO_ERR(LOCO_ENOMEM, "file list");
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (rc == 0 && *n > 0)
        qsort(*names, (size_t)*n, sizeof **names, cmp_names);
    return rc;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* An identifier no other upload of this series shares: published objects
 * are never overwritten, even by a later save of the same step. */
static void upload_prefix(int64_t step, char *out, size_t cap) {
    struct {
        double t;
        pid_t pid;
        int64_t step;
        const void *stack;
    } seed = {loco_wall_time(), getpid(), step, &seed};
    char h[17];
    loco_hash_hex(loco_hash64(&seed, sizeof seed), h);
    snprintf(out, cap, "ckpt_%08lld_%.8s", (long long)step, h);
}

/* The first line of this thread's error message, without the breadcrumbs
 * and the "file.c:LINE: " it starts with. */
static void first_line(char *buf, size_t cap) {
    const char *m = loco_errmsg();
    const char *colon = strchr(m, ':');
    if (colon && isdigit((unsigned char)colon[1])) {
        const char *p = colon + 1;
        while (isdigit((unsigned char)*p))
            p++;
        if (p[0] == ':' && p[1] == ' ')
            m = p + 2;
    }
    size_t n = strcspn(m, "\n");
    snprintf(buf, cap, "%.*s", (int)n, m);
}

static void hex_item(cJSON *obj, const char *key, uint64_t v) {
    char h[17];
    loco_hash_hex(v, h);
    cJSON_AddStringToObject(obj, key, h);
}

static cJSON *current_pointer(loco_store *s, const char *ptr);

/* The history the next pointer carries: the entry of the pointer now at
 * url/LATEST followed by the first HISTORY - 1 of its own history, newest
 * first (an array, perhaps empty; NULL only when out of memory). A missing
 * or unreadable pointer gives an empty history (a warning when unreadable). */
static cJSON *next_history(loco_store *s, const char *ptr) {
    cJSON *hist = cJSON_CreateArray();
    cJSON *cur = current_pointer(s, ptr);
    if (!hist || !cur) {
        cJSON_Delete(cur);
        return hist;
    }
    cJSON *older = cJSON_DetachItemFromObjectCaseSensitive(cur, "previous");
    cJSON_AddItemToArray(hist, cur);
    for (int i = 0; cJSON_IsArray(older) && i < HISTORY - 1 && cJSON_GetArraySize(older) > 0; i++)
        cJSON_AddItemToArray(hist, cJSON_DetachItemFromArray(older, 0));
    cJSON_Delete(older);
    return hist;
}

/* The pointer now at url/LATEST, or NULL when there is none or it cannot
 * be read (a warning then). */
static cJSON *current_pointer(loco_store *s, const char *ptr) {
    bool exists = false;
    void *text;
    size_t len;
    int rc = loco_store_exists(s, ptr, &exists);
    if (rc == 0 && !exists)
        return NULL;
    if (rc < 0 || loco_store_get(s, ptr, POINTER_MAX, &text, &len) < 0) {
        char why[512];
        first_line(why, sizeof why);
        loco_warn("checkpoint pointer %s is unreadable (%s); the new one names no previous", ptr,
                  why);
        return NULL;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    loco_free(text);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, POINTER_FORMAT)) {
        loco_warn("%s is not a loco checkpoint pointer; the new one names no previous", ptr);
        cJSON_Delete(j);
        return NULL;
    }
    return j;
}

int loco_ckpt_upload(const char *dir, const char *url, const loco_config *cfg, int64_t step) {
    loco_store_opts o;
    loco_store_opts_from_config(&o, cfg);
    loco_store *s = NULL;
    char **names = NULL;
    int n = 0, rc;
    cJSON *ptr = NULL;
    char *json = NULL;
    LOCO_CHECK(loco_store_create(&s, &o));
    LOCO_CHECK_GOTO(list_files(dir, &names, &n), out);
    if (n == 0) {
        rc = LOCO_ERR(LOCO_EINVAL, "checkpoint %s holds no files to upload", dir);
        goto out;
    }
    char prefix[64], loc[PATH_MAX * 2], ptr_loc[PATH_MAX * 2], rel[PATH_MAX];
    upload_prefix(step, prefix, sizeof prefix);
    LOCO_CHECK_GOTO(loco_store_join(ptr_loc, sizeof ptr_loc, url, POINTER_NAME), out);
    ptr = cJSON_CreateObject();
    cJSON_AddStringToObject(ptr, "format", POINTER_FORMAT);
    cJSON_AddNumberToObject(ptr, "version", POINTER_VERSION);
    cJSON_AddNumberToObject(ptr, "step", (double)step);
    cJSON_AddStringToObject(ptr, "prefix", prefix);
    cJSON_AddNumberToObject(ptr, "written", loco_wall_time());
    cJSON *files = cJSON_AddArrayToObject(ptr, "files");
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX + 256];
        void *data;
        size_t len;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        LOCO_CHECK_GOTO(loco_file_read(path, &data, &len), out);
        uint64_t h = loco_hash64(data, len);
        snprintf(rel, sizeof rel, "%s/%s", prefix, names[i]);
        rc = loco_store_join(loc, sizeof loc, url, rel);
        if (rc == 0)
            rc = loco_store_put(s, loc, data, len);
        loco_free(data);
        if (rc < 0) {
            loco__err_trace(__FILE__, __LINE__, "loco_store_put(s, loc, data, len)");
            goto out;
        }
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", names[i]);
        cJSON_AddNumberToObject(e, "size", (double)len);
        hex_item(e, "xxh3", h);
        cJSON_AddItemToArray(files, e);
    }
    /* Every object is in place: only now does the pointer name them. */
    cJSON *hist = next_history(s, ptr_loc);
    if (hist)
        cJSON_AddItemToObject(ptr, "previous", hist);
    json = cJSON_Print(ptr);
    if (!json) {
        rc = LOCO_ERR(LOCO_ENOMEM, "checkpoint pointer");
        goto out;
    }
    LOCO_CHECK_GOTO(loco_store_put(s, ptr_loc, json, strlen(json)), out);
    loco_debug("checkpoint step %lld published at %s/%s", (long long)step, url, prefix);
out:
    cJSON_free(json);
    cJSON_Delete(ptr);
    free_names(names, n);
    loco_store_destroy(s);
    return rc;
}

static int get_count(const cJSON *obj, const char *key, int64_t *out) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9e15)
        return -1;
    *out = (int64_t)x->valuedouble;
    return 0;
}

static bool safe_name(const char *s) {
    return *s && strcmp(s, ".") && strcmp(s, "..") && !strchr(s, '/') && strlen(s) < 200;
}

/* Downloads and verifies one pointer entry's files into dir (replaced). */
static int fetch_entry(loco_store *s, const char *url, const cJSON *e, const char *dir) {
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(e, "prefix");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(e, "files");
    const int n = cJSON_GetArraySize(files);
    if (!cJSON_IsString(prefix) || !safe_name(prefix->valuestring) || !cJSON_IsArray(files) ||
        n < 1 || n > MAX_FILES)
        return LOCO_ERR(LOCO_EPROTO, "%s/%s: malformed entry (prefix or file list)", url,
                        POINTER_NAME);
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", dir) >= (int)sizeof tmp)
        return LOCO_ERR(LOCO_EINVAL, "path too long: %s", dir);
    int rc = 0;
    LOCO_CHECK(loco_rmtree(tmp));
    LOCO_CHECK(loco_mkdirs(tmp));
    for (int i = 0; i < n; i++) {
        const cJSON *f = cJSON_GetArrayItem(files, i);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *hx = cJSON_GetObjectItemCaseSensitive(f, "xxh3");
        int64_t size;
        if (!cJSON_IsString(name) || !safe_name(name->valuestring) || get_count(f, "size", &size) ||
            !cJSON_IsString(hx) || strlen(hx->valuestring) != 16) {
            rc = LOCO_ERR(LOCO_EPROTO, "%s/%s: file %d of the entry is malformed", url,
                          POINTER_NAME, i);
            goto out;
        }
        char rel[PATH_MAX], loc[PATH_MAX * 2], path[PATH_MAX + 256];
        snprintf(rel, sizeof rel, "%s/%s", prefix->valuestring, name->valuestring);
        LOCO_CHECK_GOTO(loco_store_join(loc, sizeof loc, url, rel), out);
        snprintf(path, sizeof path, "%s/%s", tmp, name->valuestring);
        LOCO_CHECK_GOTO(loco_store_get_file(s, loc, path), out);
        void *data;
        size_t len;
        LOCO_CHECK_GOTO(loco_file_read(path, &data, &len), out);
        char got[17];
        loco_hash_hex(loco_hash64(data, len), got);
        loco_free(data);
        if ((int64_t)len != size || strcmp(got, hx->valuestring)) {
            rc = LOCO_ERR(LOCO_EPROTO,
                          "%s is torn: %lld bytes with xxh3 %s, the pointer says %lld bytes "
                          "with %s",
                          loc, (long long)len, got, (long long)size, hx->valuestring);
            goto out;
        }
    }
    LOCO_CHECK_GOTO(loco_dir_commit(tmp, dir), out);
out:
    if (rc < 0)
        loco_rmtree(tmp);
    return rc;
}

int loco_ckpt_fetch(const char *url, const loco_config *cfg, const char *dir, int64_t *step) {
    loco_store_opts o;
    loco_store_opts_from_config(&o, cfg);
    loco_store *s = NULL;
    void *text = NULL;
    size_t len;
    cJSON *j = NULL;
    int rc;
    char ptr_loc[PATH_MAX * 2];
    LOCO_CHECK(loco_store_join(ptr_loc, sizeof ptr_loc, url, POINTER_NAME));
    LOCO_CHECK(loco_store_create(&s, &o));
    rc = loco_store_get(s, ptr_loc, POINTER_MAX, &text, &len);
    if (rc < 0) {
        char why[1024];
        first_line(why, sizeof why);
        rc = LOCO_ERR(rc, "no checkpoint at %s: cannot read its pointer (%s)", url, why);
        goto out;
    }
    j = cJSON_ParseWithLength(text, len);
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    int64_t version;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, POINTER_FORMAT) ||
        get_count(j, "version", &version)) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s is not a loco checkpoint pointer", ptr_loc);
        goto out;
    }
    if (version != POINTER_VERSION) {
        rc = LOCO_ERR(LOCO_EPROTO, "%s: pointer version %lld, this build reads %d", ptr_loc,
                      (long long)version, POINTER_VERSION);
        goto out;
    }
    /* The newest checkpoint, then the earlier ones, newest first. */
    const cJSON *hist = cJSON_GetObjectItemCaseSensitive(j, "previous");
    int n = 1 + (cJSON_IsArray(hist) ? cJSON_GetArraySize(hist) : 0);
    if (n > 1 + HISTORY)
        n = 1 + HISTORY;
    char why[1024] = "", one[512];
    int first_rc = 0;
    for (int k = 0; k < n; k++) {
        const cJSON *e = k == 0 ? j : cJSON_GetArrayItem(hist, k - 1);
        int64_t step_k = -1;
        if (get_count(e, "step", &step_k))
            rc = LOCO_ERR(LOCO_EPROTO, "%s: an entry has no step", ptr_loc);
        else
            rc = fetch_entry(s, url, e, dir);
        if (rc == 0) {
            if (k > 0)
                loco_warn("torn checkpoints at %s (%s); using the newest complete one, step "
                          "%lld",
                          url, why, (long long)step_k);
            if (step)
                *step = step_k;
            goto out;
        }
        first_line(one, sizeof one);
        size_t used = strlen(why);
        snprintf(why + used, sizeof why - used, "%sstep %lld: %s", k ? "; " : "", (long long)step_k,
                 one);
        if (k == 0)
            first_rc = rc;
    }
    /* Objects missing or damaged make a torn checkpoint (LOCO_EPROTO);
     * other failures (authentication, timeouts) keep their own code. */
    if (first_rc == LOCO_EIO)
        first_rc = LOCO_EPROTO;
    rc = LOCO_ERR(first_rc, "no complete checkpoint at %s: %d listed, every one torn (%s)", url, n,
                  why);
out:
    cJSON_Delete(j);
    loco_free(text);
    loco_store_destroy(s);
    return rc;
}
