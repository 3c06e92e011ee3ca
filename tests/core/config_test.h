/* What the config test files share: a scratch directory per test, INI
 * files written into it, a config's dump as text. */
#ifndef LOCO_TESTS_CORE_CONFIG_TEST_H
#define LOCO_TESTS_CORE_CONFIG_TEST_H

#include "core/core.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((unused)) static char *dir;

__attribute__((unused)) static void setup(void) {
    dir = strdup("/tmp/loco-config-XXXXXX");
    cr_assert(mkdtemp(dir));
    loco_err_clear();
}

__attribute__((unused)) static void teardown(void) {
    loco_rmtree(dir);
    free(dir);
}

/* Writes text to dir/name; the path goes to path (512 bytes). */
__attribute__((unused)) static void write_ini(char *path, const char *name, const char *text) {
    snprintf(path, 512, "%s/%s", dir, name);
    cr_assert_eq(loco_file_write_sync(path, text, strlen(text)), 0, "%s", loco_errmsg());
}

/* The text of loco_config_dump (caller frees). */
__attribute__((unused)) static char *dump_text(const loco_config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert(f);
    loco_config_dump(cfg, f);
    fclose(f);
    return buf;
}

__attribute__((unused)) static void assert_has(const char *msg, const char *part) {
    cr_assert(strstr(msg, part), "message lacks \"%s\":\n%s", part, msg);
}

#endif
