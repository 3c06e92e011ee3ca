/* Checkpoints under crashes: a writer process SIGKILLed at random points of
 * loco_ckpt_save (during the safetensors writes, the fsyncs, the rename, the
 * removal of the old directory), 20 times, must always leave a loadable,
 * self-consistent newest checkpoint that never goes back in time, and no
 * leftover that makes the next save fail. Two layouts of the run directory:
 * one name replaced in place (DIR/ckpt) and one directory per generation
 * (DIR/ckpt_<g>, as the trainer names them). */
#include "inner/ckpt/ckpt.h"
#include "inner/model/model.h"
#include "inner/optim/optim.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KILLS 20
#define KILL_SEED 20240601u /* the kill points, reproducible */
#define SAVES_BEFORE 3      /* a kill lets the writer begin 0 .. 2 saves first */
#define SPREAD 1.5          /* then lands 0 .. 1.5 save times into the next */
#define WAIT_LIMIT_S 10.0   /* a writer that makes no progress fails the test */
#define CHILD_ESAVE 3       /* writer exit code: a save failed */
#define CHILD_ENAME 4       /* writer exit code: checkpoint path too long */
#define POISON 1e30f        /* in the parent's buffers before every load */

/* What the writer leaves for the parent: it survives the kill. */
typedef struct {
    _Atomic int64_t started; /* generation being saved (or the last saved) */
    _Atomic int64_t done;    /* last generation whose save returned 0; a kill
                              * after the rename, before this store, leaves
                              * a newer one published */
    int rc;                  /* the failing save's code */
    char msg[1024];          /* and its message */
} writer_log;

static char *root;
static loco_config cfg;
static loco_gpt *model = NULL;
static loco_adamw opt;
static uint64_t model_hash;
static writer_log *wlog;

/* The contents of generation g: the same function fills and checks, so the
 * comparison is exact. Values of neighbouring generations differ by >= 0.5. */
__attribute__((noinline)) static float gen_value(int64_t g, size_t i, int which) {
    const float i6 = (float)i * 1e-6f;
    switch (which) {
    case 0: return (float)g + i6;         /* params */
    case 1: return -(float)g - i6;        /* exp_avg */
    default: return 0.5f * (float)g + i6; /* exp_avg_sq */
    }
}

static loco_ckpt_state gen_state(int64_t g) {
    loco_ckpt_state st = {.step = g,
                          .data = {.shard = g % 5, .pos = 2 * g, .epoch = g / 5},
                          .rng = {{(uint64_t)g, ~(uint64_t)g, (uint64_t)g * 3, 7}},
                          .model_hash = model_hash};
    return st;
}

static void gen_fill(int64_t g) {
    for (size_t i = 0; i < loco_gpt_num_params(model); i++) {
        loco_gpt_params(model)[i] = gen_value(g, i, 0);
        opt.m[i] = gen_value(g, i, 1);
        opt.v[i] = gen_value(g, i, 2);
    }
    opt.t = g;
}

static void poison(void) {
    for (size_t i = 0; i < loco_gpt_num_params(model); i++)
        loco_gpt_params(model)[i] = opt.m[i] = opt.v[i] = POISON;
    opt.t = -1;
}

/* Index of the first element that is not generation g's (or the poison,
 * when g < 0), or n_params when all are. */
static size_t first_mismatch(int64_t g, int *which) {
    for (size_t i = 0; i < loco_gpt_num_params(model); i++) {
        const float got[3] = {loco_gpt_params(model)[i], opt.m[i], opt.v[i]};
        for (int k = 0; k < 3; k++)
            if (got[k] != (g < 0 ? POISON : gen_value(g, i, k))) {
                *which = k;
                return i;
            }
    }
    return loco_gpt_num_params(model);
}

/* Loads path into poisoned buffers. On success every tensor, the optimizer
 * count and the state must all be the generation state.json names; on
 * failure the code must be LOCO_EPROTO and the buffers untouched. Returns
 * the code; *step receives the generation loaded. */
static int load_checked(const char *path, int64_t *step) {
    poison();
    loco_ckpt_state st;
    memset(&st, 0, sizeof st);
    int rc = loco_ckpt_load(path, &cfg, model, &opt, &st);
    int which = 0;
    size_t bad;
    if (rc < 0) {
        cr_assert_eq(rc, LOCO_EPROTO, "%s: a torn checkpoint must be LOCO_EPROTO, got %s: %s", path,
                     loco_strerror(rc), loco_errmsg());
        bad = first_mismatch(-1, &which);
        cr_assert_eq(bad, loco_gpt_num_params(model),
                     "%s: a failed load wrote into the model (tensor %d, %zu)", path, which, bad);
        cr_assert_eq(opt.t, -1, "%s: a failed load changed the optimizer count", path);
        return rc;
    }
    const int64_t g = st.step;
    const loco_ckpt_state want = gen_state(g);
    cr_assert_eq(opt.t, g, "%s: adam_t %lld but step %lld: files of two generations", path,
                 (long long)opt.t, (long long)g);
    cr_assert(st.data.shard == want.data.shard && st.data.pos == want.data.pos &&
                  st.data.epoch == want.data.epoch,
              "%s: data position is not generation %lld's", path, (long long)g);
    cr_assert_eq(memcmp(st.rng.s, want.rng.s, sizeof want.rng.s), 0,
                 "%s: rng state is not generation %lld's", path, (long long)g);
    bad = first_mismatch(g, &which);
    if (bad < loco_gpt_num_params(model)) {
        static const char *const names[3] = {"params", "exp_avg", "exp_avg_sq"};
        const float got[3] = {loco_gpt_params(model)[bad], opt.m[bad], opt.v[bad]};
        cr_assert_fail("%s: step %lld but %s[%zu] = %.9g (want %.9g): files of two generations",
                       path, (long long)g, names[which], bad, got[which], gen_value(g, bad, which));
    }
    *step = g;
    return 0;
}

/* The writer: generations first, first + 1, ... into name(g), as fast as it
 * can, until killed. Any failure exits at once with a distinct code and
 * leaves the message in wlog. */
static _Noreturn void writer(int64_t first, bool per_generation) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
    for (int64_t g = first;; g++) {
        char path[600];
        int n = per_generation ? snprintf(path, sizeof path, "%s/ckpt_%08lld", root, (long long)g)
                               : snprintf(path, sizeof path, "%s/ckpt", root);
        if (n >= (int)sizeof path)
            _exit(CHILD_ENAME);
        gen_fill(g);
        const loco_ckpt_state st = gen_state(g);
        atomic_store(&wlog->started, g);
        int rc = loco_ckpt_save(path, &cfg, model, &opt, &st);
        if (rc < 0) {
            wlog->rc = rc;
            snprintf(wlog->msg, sizeof wlog->msg, "%s", loco_errmsg());
            _exit(CHILD_ESAVE);
        }
        atomic_store(&wlog->done, g);
    }
}

/* Where one kill lands: once the writer has begun its (saves + 1)-th save,
 * us microseconds into it. */
typedef struct {
    int saves;
    long us;
} kill_point;

static void sleep_us(long us) {
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* The writer must have died of the kill, not of an error of its own. */
static void check_killed(int status) {
    if (WIFEXITED(status))
        cr_assert_fail("writer exited with code %d before the kill (%s): %s", WEXITSTATUS(status),
                       WEXITSTATUS(status) == CHILD_ESAVE ? loco_strerror(wlog->rc) : "no save",
                       wlog->msg);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "writer died of signal %d",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/* Forks a writer starting at generation first, kills it at kp and reaps
 * it. Timing the kill from the start of a save, not from the fork, keeps
 * the kills spread over the phases of a save however slow the disk is. */
static void run_and_kill(int64_t first, bool per_generation, const kill_point *kp) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork failed");
    if (pid == 0)
        writer(first, per_generation);
    const double t0 = loco_now();
    int status;
    while (atomic_load(&wlog->started) < first + kp->saves) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            check_killed(status);
        if (loco_now() - t0 > WAIT_LIMIT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            cr_assert_fail("writer did not begin generation %lld within %g s",
                           (long long)(first + kp->saves), WAIT_LIMIT_S);
        }
        sleep_us(20);
    }
    sleep_us(kp->us);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    check_killed(status);
}

/* Kill points: offsets spread evenly over 0 .. SPREAD save times (one
 * uniform draw per 1/KILLS of it), shuffled, each after 0 .. SAVES_BEFORE-1
 * whole saves. */
static void plan_kills(kill_point kp[KILLS], double save_s) {
    loco_rng rng;
    loco_rng_seed(&rng, KILL_SEED);
    const double span_us = SPREAD * save_s * 1e6;
    for (int k = 0; k < KILLS; k++)
        kp[k].us = (long)(((double)k + loco_rng_uniform_d(&rng)) * span_us / KILLS);
    for (int k = KILLS - 1; k > 0; k--) {
        int j = (int)(loco_rng_u64(&rng) % (uint64_t)(k + 1));
        long t = kp[k].us;
        kp[k].us = kp[j].us, kp[j].us = t;
    }
    for (int k = 0; k < KILLS; k++)
        kp[k].saves = (int)(loco_rng_u64(&rng) % SAVES_BEFORE);
}

/* Saves generation 0 to path three times; returns the median time of one
 * save, which scales the kill points. */
static double save_generation0(const char *path) {
    double t[3];
    gen_fill(0);
    const loco_ckpt_state st0 = gen_state(0);
    for (int i = 0; i < 3; i++) {
        const double t0 = loco_now();
        cr_assert_eq(loco_ckpt_save(path, &cfg, model, &opt, &st0), 0, "%s", loco_errmsg());
        t[i] = loco_now() - t0;
    }
    double lo = t[0] < t[1] ? t[0] : t[1], hi = t[0] < t[1] ? t[1] : t[0];
    return t[2] < lo ? lo : t[2] > hi ? hi : t[2];
}

static bool exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

static void setup(void) {
    root = strdup("/tmp/loco-ckpt-crash-XXXXXX");
    cr_assert(root && mkdtemp(root));
    loco_config_defaults(&cfg);
    cfg.model.n_layer = 2, cfg.model.n_head = 2, cfg.model.n_embd = 64;
    cfg.model.seq_len = 32, cfg.model.vocab_size = 256;
    static const char *const sec[] = {"model", NULL};
    model_hash = loco_config_hash(&cfg, sec);
    loco_gpt_config mc = loco_gpt_config_from(&cfg);
    cr_assert_eq(loco_gpt_create(&model, &mc, 1, 8), 0, "%s", loco_errmsg());
    cr_assert_eq(loco_adamw_init(&opt, loco_gpt_num_params(model), &cfg), 0, "%s", loco_errmsg());
    wlog = mmap(NULL, sizeof *wlog, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(wlog, MAP_FAILED);
    memset(wlog, 0, sizeof *wlog);
}

static void teardown(void) {
    if (wlog && wlog != MAP_FAILED)
        munmap(wlog, sizeof *wlog);
    loco_adamw_fini(&opt);
    loco_gpt_destroy(model);
    loco_rmtree(root);
    free(root);
}

TestSuite(ckpt_crash, .init = setup, .fini = teardown, .timeout = 60);

/* Saves generation g to path in this process and loads it back. */
static void save_and_reload(const char *path, int64_t g) {
    gen_fill(g);
    const loco_ckpt_state st = gen_state(g);
    cr_assert_eq(loco_ckpt_save(path, &cfg, model, &opt, &st), 0, "save %s after the kills: %s",
                 path, loco_errmsg());
    int64_t got = -1;
    cr_assert_eq(load_checked(path, &got), 0, "%s: %s", path, loco_errmsg());
    cr_assert_eq(got, g);
}

/* One name replaced in place: DIR/ckpt always holds a whole generation,
 * between the last one known saved and the one being saved, never older
 * than what was loaded before, whatever instant the writer dies; DIR/ckpt.tmp (the next one, or the
 * old one awaiting removal) never breaks the next save. */
Test(ckpt_crash, same_name_survives_kills, .timeout = 60) {
    char ck[600], tmp[640], old[640];
    snprintf(ck, sizeof ck, "%s/ckpt", root);
    snprintf(tmp, sizeof tmp, "%s/ckpt.tmp", root);
    snprintf(old, sizeof old, "%s/ckpt.old", root);
    const double save_s = save_generation0(ck);
    kill_point kp[KILLS];
    plan_kills(kp, save_s);
    int64_t last = 0;
    int clean = 0, tmp_torn = 0, tmp_next = 0, tmp_prev = 0, with_old = 0;
    for (int k = 0; k < KILLS; k++) {
        const int64_t first = atomic_load(&wlog->started) + 1;
        run_and_kill(first, false, &kp[k]);
        const int64_t started = atomic_load(&wlog->started), done = atomic_load(&wlog->done);

        int64_t g = -1;
        cr_assert_eq(load_checked(ck, &g), 0,
                     "kill %d (%d saves + %ld us, saving %lld, saved %lld): newest checkpoint "
                     "unloadable: %s",
                     k, kp[k].saves, kp[k].us, (long long)started, (long long)done, loco_errmsg());
        cr_assert_geq(g, last, "kill %d: checkpoint went back from %lld to %lld", k,
                      (long long)last, (long long)g);
        cr_assert(g >= done && g <= started,
                  "kill %d: loaded generation %lld, the writer had saved %lld and was saving %lld",
                  k, (long long)g, (long long)done, (long long)started);
        last = g;
        /* What the kill left beside it tells where it landed. */
        with_old += exists(old); /* only where RENAME_EXCHANGE is missing */
        if (!exists(tmp)) {
            clean++;
            continue;
        }
        /* ckpt.tmp, whole or not, is never read as the checkpoint; when it
         * loads it is one generation (load_checked) that was written:
         * the next one not yet swapped in, the old one swapped out, or
         * either while the next save's rmtree is removing it (it still
         * loads once only config.* are gone). */
        int64_t tg = -1;
        if (load_checked(tmp, &tg) < 0)
            tmp_torn++; /* being written, or being removed */
        else if (tg > g)
            tmp_next++;
        else
            tmp_prev++;
        cr_assert_leq(tg, started, "kill %d: %s holds generation %lld, never written", k, tmp,
                      (long long)tg);
    }
    cr_log_info("ckpt_crash same name: %d kills, save %.1f ms, generations 0..%lld; leftovers: "
                "none %d, torn tmp %d, newer tmp %d, older tmp %d; ckpt.old after %d",
                KILLS, save_s * 1e3, (long long)atomic_load(&wlog->started), clean, tmp_torn,
                tmp_next, tmp_prev, with_old);
    cr_assert_gt(last, 0, "no save completed before a kill: the test proves little");

    save_and_reload(ck, atomic_load(&wlog->started) + 1);
    cr_assert_not(exists(tmp), "%s left after a clean save", tmp);
    cr_assert_not(exists(old), "%s left after a clean save", old);
}

/* Parses "ckpt_<digits>" (published) or "ckpt_<digits>.tmp"; false for
 * anything else. */
static bool parse_name(const char *name, int64_t *g, bool *is_tmp) {
    if (strncmp(name, "ckpt_", 5) != 0)
        return false;
    char *end;
    long long v = strtoll(name + 5, &end, 10);
    if (end == name + 5 || v < 0)
        return false;
    *g = v;
    *is_tmp = strcmp(end, ".tmp") == 0;
    return *is_tmp || *end == '\0';
}

#define MAX_ENTRIES 256

/* The resume rule: the newest checkpoint is the highest generation whose
 * published name (no suffix) loads. Every published directory must load;
 * a ckpt_<g>.tmp is never a candidate, and loading it either fails with
 * LOCO_EPROTO or finds generation g whole (killed just before the rename).
 * Returns the newest generation; older published ones are removed to keep
 * the directory small, .tmp leftovers are kept for the next writers. */
static int64_t scan_per_generation(int k, int64_t started, int *n_tmp) {
    DIR *d = opendir(root);
    cr_assert(d, "opendir %s", root);
    char names[MAX_ENTRIES][64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            cr_assert_lt(n, MAX_ENTRIES, "too many entries in %s", root);
            cr_assert_lt(strlen(e->d_name), sizeof names[0], "entry %s", e->d_name);
            snprintf(names[n++], sizeof names[0], "%.63s", e->d_name);
        }
    closedir(d);

    int64_t newest = -1;
    *n_tmp = 0;
    for (int i = 0; i < n; i++) {
        int64_t g, got = -1;
        bool is_tmp;
        cr_assert(parse_name(names[i], &g, &is_tmp), "kill %d: unexpected entry %s/%s", k, root,
                  names[i]);
        cr_assert_leq(g, started, "kill %d: %s is newer than any generation written", k, names[i]);
        char path[700];
        snprintf(path, sizeof path, "%s/%s", root, names[i]);
        int rc = load_checked(path, &got);
        if (is_tmp) {
            (*n_tmp)++;
            cr_assert(rc < 0 || got == g, "kill %d: %s holds generation %lld", k, names[i],
                      (long long)got);
            continue;
        }
        cr_assert_eq(rc, 0, "kill %d: published %s does not load: %s", k, names[i], loco_errmsg());
        cr_assert_eq(got, g, "kill %d: %s holds generation %lld", k, names[i], (long long)got);
        if (g > newest)
            newest = g;
    }
    for (int i = 0; i < n; i++) {
        int64_t g;
        bool is_tmp;
        parse_name(names[i], &g, &is_tmp);
        if (!is_tmp && g < newest) {
            char path[700];
            snprintf(path, sizeof path, "%s/%s", root, names[i]);
            cr_assert_eq(loco_rmtree(path), 0, "%s", loco_errmsg());
        }
    }
    return newest;
}

/* One directory per generation, as the trainer writes them: after every
 * kill every published directory loads, and the highest lies between the
 * last generation known saved and the one being saved, never going back; partial ckpt_<g>.tmp
 * directories are never taken for checkpoints and do not stop a later save to that name. */
Test(ckpt_crash, new_names_survive_kills, .timeout = 60) {
    char ck[600];
    snprintf(ck, sizeof ck, "%s/ckpt_%08d", root, 0);
    const double save_s = save_generation0(ck);
    kill_point kp[KILLS];
    plan_kills(kp, save_s);
    int64_t last = 0;
    int with_tmp = 0, n_tmp = 0;
    for (int k = 0; k < KILLS; k++) {
        const int64_t first = atomic_load(&wlog->started) + 1;
        run_and_kill(first, true, &kp[k]);
        const int64_t started = atomic_load(&wlog->started), done = atomic_load(&wlog->done);
        const int64_t g = scan_per_generation(k, started, &n_tmp);
        cr_assert_geq(g, last, "kill %d: newest checkpoint went back from %lld to %lld", k,
                      (long long)last, (long long)g);
        cr_assert(g >= done && g <= started,
                  "kill %d (%d saves + %ld us): newest published generation %lld, the writer had "
                  "saved %lld and was saving %lld",
                  k, kp[k].saves, kp[k].us, (long long)g, (long long)done, (long long)started);
        last = g;
        char tmp[640];
        snprintf(tmp, sizeof tmp, "%s/ckpt_%08lld.tmp", root, (long long)started);
        with_tmp += exists(tmp);
    }
    cr_log_info("ckpt_crash new names: %d kills, save %.1f ms, generations 0..%lld; %d kills "
                "left a .tmp, %d .tmp leftovers at the end",
                KILLS, save_s * 1e3, (long long)atomic_load(&wlog->started), with_tmp, n_tmp);
    cr_assert_gt(last, 0, "no save completed before a kill: the test proves little");

    /* A later save over a leftover's name, and to a new name, both work. */
    DIR *d = opendir(root);
    cr_assert(d);
    int64_t leftover = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t g;
        bool is_tmp;
        if (parse_name(e->d_name, &g, &is_tmp) && is_tmp)
            leftover = g;
    }
    closedir(d);
    if (leftover >= 0) {
        char path[600], tmp[640];
        snprintf(path, sizeof path, "%s/ckpt_%08lld", root, (long long)leftover);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        save_and_reload(path, leftover);
        cr_assert_not(exists(tmp), "%s left after a clean save", tmp);
    }
    const int64_t next = atomic_load(&wlog->started) + 1;
    snprintf(ck, sizeof ck, "%s/ckpt_%08lld", root, (long long)next);
    save_and_reload(ck, next);
    int unused;
    cr_assert_eq(scan_per_generation(KILLS, next, &unused), next);
}
