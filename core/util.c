/* Checksums, clocks, files and thread counts. */
#include "core/core.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <omp.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

uint64_t loco_hash64(const void *data, size_t len) { return XXH3_64bits(data, len); }

void loco_hash_hex(uint64_t h, char buf[17]) { snprintf(buf, 17, "%016llx", (unsigned long long)h); }

double loco_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void loco_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

double loco_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int loco_file_read(const char *path, void **data, size_t *len) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return LOCO_ERR(LOCO_EIO, "%s: cannot open: %s", path, strerror(errno));
    int rc = 0;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { /* fopen takes directories */
        rc = LOCO_ERR(LOCO_EIO, "%s: is a directory", path);
        goto out_close;
    }
    if (fseeko(f, 0, SEEK_END) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "%s: cannot seek: %s", path, strerror(errno));
        goto out_close;
    }
    off_t size = ftello(f);
    if (size < 0 || fseeko(f, 0, SEEK_SET) != 0) {
        rc = LOCO_ERR(LOCO_EIO, "%s: cannot size: %s", path, strerror(errno));
        goto out_close;
    }
    char *buf = loco_alloc((size_t)size + 1);
    if (!buf) {
        rc = LOCO_ERR(LOCO_ENOMEM, "%s: cannot allocate %lld bytes", path, (long long)size);
        goto out_close;
    }
    if (size > 0 && fread(buf, 1, (size_t)size, f) != (size_t)size) {
        loco_free(buf);
        rc = LOCO_ERR(LOCO_EIO, "%s: short read", path);
        goto out_close;
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
out_close:
    fclose(f);
    return rc;
}

int loco_file_write_sync(const char *path, const void *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "%s: cannot create: %s", path, strerror(errno));
    const char *p = data;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            return LOCO_ERR(LOCO_EIO, "%s: write failed: %s", path, strerror(e));
        }
        p += w;
        len -= (size_t)w;
    }
    if (fsync(fd) != 0) {
        int e = errno;
        close(fd);
        return LOCO_ERR(LOCO_EIO, "%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) != 0)
        return LOCO_ERR(LOCO_EIO, "%s: close failed: %s", path, strerror(errno));
    return 0;
}

int loco_mkdirs(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return LOCO_ERR(LOCO_EINVAL, "path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return LOCO_ERR(LOCO_EIO, "%s: mkdir failed: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return LOCO_ERR(LOCO_EIO, "%s: mkdir failed: %s", buf, strerror(errno));
    struct stat st; /* EEXIST also means a file of that name */
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return LOCO_ERR(LOCO_EIO, "%s: exists and is not a directory", buf);
    return 0;
}

int loco_rmtree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : LOCO_ERR(LOCO_EIO, "%s: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d)
            return LOCO_ERR(LOCO_EIO, "%s: opendir: %s", path, strerror(errno));
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char sub[PATH_MAX];
            snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
            int rc = loco_rmtree(sub);
            if (rc < 0) {
                closedir(d);
                return rc;
            }
        }
        closedir(d);
        if (rmdir(path) != 0)
            return LOCO_ERR(LOCO_EIO, "%s: rmdir: %s", path, strerror(errno));
    } else if (unlink(path) != 0) {
        return LOCO_ERR(LOCO_EIO, "%s: unlink: %s", path, strerror(errno));
    }
    return 0;
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return LOCO_ERR(LOCO_EIO, "%s: open for fsync: %s", path, strerror(errno));
    int rc = fsync(fd) == 0 ? 0 : LOCO_ERR(LOCO_EIO, "%s: fsync: %s", path, strerror(errno));
    close(fd);
    return rc;
}

static void parent_dir(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash == out)
        slash[1] = '\0'; /* "/x" lives in "/" */
    else if (slash)
        *slash = '\0';
    else
        snprintf(out, cap, ".");
}

int loco_dir_commit(const char *tmp, const char *final) {
    LOCO_CHECK(fsync_path(tmp));
    char parent[PATH_MAX], old[PATH_MAX];
    parent_dir(final, parent, sizeof parent);
    snprintf(old, sizeof old, "%s.old", final);
    struct stat st;
    /* A crash of the fallback below between its two renames left the
     * complete old directory as final.old: put it back first. */
    if (stat(final, &st) != 0 && stat(old, &st) == 0 && rename(old, final) != 0)
        return LOCO_ERR(LOCO_EIO, "rename %s -> %s: %s", old, final, strerror(errno));
    LOCO_CHECK(loco_rmtree(old));
    if (stat(final, &st) != 0) {
        if (rename(tmp, final) != 0)
            return LOCO_ERR(LOCO_EIO, "rename %s -> %s: %s", tmp, final, strerror(errno));
        return fsync_path(parent);
    }
    /* Replace an existing directory by swapping the two names atomically:
     * at every instant `final` names a complete directory. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        LOCO_CHECK(fsync_path(parent));
        return loco_rmtree(tmp); /* now the old directory */
    }
    if (errno != EINVAL && errno != ENOSYS)
        return LOCO_ERR(LOCO_EIO, "exchange %s <-> %s: %s", tmp, final, strerror(errno));
    /* Filesystems without RENAME_EXCHANGE: move the old one aside first. A
     * crash between the renames leaves it as final.old. */
    if (rename(final, old) != 0)
        return LOCO_ERR(LOCO_EIO, "rename %s -> %s: %s", final, old, strerror(errno));
    if (rename(tmp, final) != 0)
        return LOCO_ERR(LOCO_EIO, "rename %s -> %s: %s", tmp, final, strerror(errno));
    LOCO_CHECK(fsync_path(parent));
    return loco_rmtree(old);
}

int loco_set_threads(int n) {
    if (n <= 0)
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0)
        n = 1;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
    return n;
}
