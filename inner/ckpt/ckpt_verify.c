/* Checkpoints checked whole, without a model to load them into (the
 * model's shape comes from the checkpoint's own config.ini), and the
 * choice of the checkpoint a run resumes from: the newest that verifies,
 * so that one torn checkpoint does not stop every later restart. */
#include "inner/ckpt/internal.h"

#include <dirent.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Every shard of the list, one at a time (a checkpoint may not fit in
 * memory at once): presence, checksum, header, shapes, ranks. */
static int verify_sharded(const char *dir, const cJSON *j, loco_gpt_config mc, int tp, int ep,
                          int pp, const loco_gpt_stage *stages) {
    loco__ckpt_manifest mf = {0};
    int rc = 0;
    size_t *P = loco_alloc((size_t)pp * ep * sizeof *P);
    if (!P)
        return LOCO_ERR(LOCO_ENOMEM, "table of %d pipeline stages", pp);
    mc.tp = tp, mc.ep = ep;
    LOCO_CHECK_GOTO(loco__ckpt_stage_params(&mc, stages, pp, P), out);
    LOCO_CHECK_GOTO(loco__ckpt_parse_manifest(&mf, dir, j, tp, pp, ep, P), out);
    for (int i = 0; i < mf.n; i++) {
        mf.s[i].need = true;
        rc = loco__ckpt_open_shards(&mf);
        loco_st_close(mf.s[i].st);
        mf.s[i].st = NULL;
        mf.s[i].need = false;
        LOCO_CHECK_GOTO(rc, out);
    }
out:
    loco__ckpt_manifest_fini(&mf);
    loco_free(P);
    return rc;
}

/* model.safetensors and, when state.json lists it, optimizer.safetensors:
 * checksums, headers, every tensor of the whole model with its shape. */
static int verify_single(const char *dir, const cJSON *j, loco_gpt_config mc) {
    const cJSON *sums = cJSON_GetObjectItemCaseSensitive(j, "xxh3");
    loco_ttable tt;
    mc.tp = 1, mc.ep = 1;
    LOCO_CHECK(loco_gpt_build_table(&tt, &mc));
    loco__ckpt_single_src s;
    int rc = loco__ckpt_open_single(&s, dir, sums, &tt, cJSON_HasObjectItem(sums, OPTIM_FILE));
    loco__ckpt_close_single(&s);
    loco_ttable_fini(&tt);
    return rc;
}

static int verify(const char *dir) {
    char path[PATH_MAX + 64];
    cJSON *j;
    loco_ckpt_state st;
    int64_t adam_t;
    loco_gpt_stage *stages = NULL;
    int rc, tp, ep, pp;
    LOCO_CHECK(loco__ckpt_read_state(dir, &j, &st, &adam_t));
    loco_config cfg;
    loco_config_defaults(&cfg);
    snprintf(path, sizeof path, "%s/config.ini", dir);
    if ((rc = loco_config_load(&cfg, path)) < 0) {
        rc = LOCO_ERR(LOCO_EPROTO, "checkpoint %s: config.ini is missing or unreadable (%s)", dir,
                      loco_strerror(rc));
        goto out;
    }
    /* config.ini has no checksum: its [model] must be the one state.json
     * was written for, or the shapes below would be checked against
     * another model. */
    if (loco_config_hash(&cfg, loco__ckpt_model_sections) != st.model_hash) {
        rc = LOCO_ERR(LOCO_EPROTO,
                      "checkpoint %s: config.ini's [model] is not the one state.json was written "
                      "for",
                      dir);
        goto out;
    }
    const loco_gpt_config mc = loco_gpt_config_from(&cfg);
    LOCO_CHECK_GOTO(loco__ckpt_parse_layout(dir, j, &mc, &tp, &ep, &pp, &stages), out);
    if (cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(j, "shards")))
        LOCO_CHECK_GOTO(verify_sharded(dir, j, mc, tp, ep, pp, stages), out);
    else
        LOCO_CHECK_GOTO(verify_single(dir, j, mc), out);
out:
    loco_free(stages);
    cJSON_Delete(j);
    return rc;
}

/* This thread's error message without its file:line prefix and
 * breadcrumbs: the reason, for one line of a log. */
static void reason(char *why, size_t cap) {
    const char *m = loco_errmsg(), *s = strstr(m, ": ");
    m = s ? s + 2 : m;
    snprintf(why, cap, "%.*s", (int)strcspn(m, "\n"), m);
}

int loco_ckpt_verify(const char *dir, char *why, size_t cap) {
    const int rc = verify(dir);
    if (why && cap) {
        why[0] = '\0';
        if (rc < 0)
            reason(why, cap);
    }
    return rc;
}

/* ------------------------------------------------------------- resuming */

/* N of a directory named ckpt_N; -1 for any other name (ckpt_N.tmp,
 * ckpt_N.old, ckpt_stage). */
static int64_t ckpt_step(const char *name) {
    long long step;
    char tail;
    return sscanf(name, "ckpt_%lld%c", &step, &tail) == 1 && step >= 0 ? step : -1;
}

/* The newest ckpt_N of run with N < below, its name into name[cap]; -1
 * when there is none. */
static int64_t newest_below(const char *run, int64_t below, char *name, size_t cap) {
    DIR *d = opendir(run);
    int64_t best = -1;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));) {
        const int64_t s = ckpt_step(e->d_name);
        if (s > best && s < below && strlen(e->d_name) < cap) {
            best = s;
            snprintf(name, cap, "%s", e->d_name);
        }
    }
    closedir(d);
    return best;
}

/* Verifies one candidate: 1 when it is good, 0 when it is not (logged,
 * and its reason appended to tried[cap]), < 0 when verifying failed for
 * another cause than the checkpoint (memory). */
static int try_ckpt(const char *path, char *tried, size_t cap) {
    char why[1024];
    const int rc = loco_ckpt_verify(path, why, sizeof why);
    if (rc == LOCO_ENOMEM)
        return rc;
    if (rc == 0)
        return 1;
    loco_warn("resume: skipping %s: %s", path, why);
    const size_t n = strlen(tried);
    snprintf(tried + n, cap - n, "%s%s", n ? "; " : "", why);
    return 0;
}

static int chosen(const char *path, char *out, size_t cap) {
    if (snprintf(out, cap, "%s", path) >= (int)cap) {
        out[0] = '\0';
        return LOCO_ERR(LOCO_EINVAL, "checkpoint path too long: %s", path);
    }
    return 0;
}

int loco_ckpt_pick_resume(const char *from, char *out, size_t cap) {
    char run[PATH_MAX], base[PATH_MAX], name[256], path[PATH_MAX + 300], tried[2048] = "";
    int ok;
    out[0] = '\0';
    if (loco_store_is_url(from))
        return chosen(from, out, cap);
    if (snprintf(run, sizeof run, "%s", from) >= (int)sizeof run ||
        snprintf(base, sizeof base, "%s", from) >= (int)sizeof base)
        return LOCO_ERR(LOCO_EINVAL, "checkpoint path too long: %s", from);
    /* One checkpoint named (ckpt_N, or any directory with a state.json, or
     * nothing there): it, else an older ckpt_N beside it. Otherwise a run
     * directory: its newest ckpt_N. */
    const int64_t named = ckpt_step(basename(base));
    struct stat sb;
    snprintf(path, sizeof path, "%s/" STATE_FILE, from);
    int64_t below = INT64_MAX;
    if (named >= 0 || access(path, F_OK) == 0 || stat(from, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        if ((ok = try_ckpt(from, tried, sizeof tried)) != 0)
            return ok < 0 ? ok : chosen(from, out, cap);
        if (named < 0)
            return LOCO_ERR(LOCO_EPROTO, "cannot resume: %s", tried);
        snprintf(run, sizeof run, "%s", dirname(base));
        below = named;
    }
    for (int64_t s; (s = newest_below(run, below, name, sizeof name)) >= 0; below = s) {
        snprintf(path, sizeof path, "%s/%s", run, name);
        if ((ok = try_ckpt(path, tried, sizeof tried)) < 0)
            return ok;
        if (ok && tried[0])
            loco_warn("resume: using %s, the newest earlier checkpoint that verifies", path);
        if (ok)
            return chosen(path, out, cap);
    }
    if (tried[0])
        return LOCO_ERR(LOCO_EPROTO, "no checkpoint to resume from in %s verifies: %s", run, tried);
    return LOCO_ERR(LOCO_EPROTO, "no checkpoint to resume from in %s (no ckpt_N directory)", run);
}
