/* libFuzzer target: the INI config loader (libinih under loco_config_load)
 * on arbitrary bytes as a config file. Whatever the bytes: 0, LOCO_EINVAL
 * or LOCO_EIO, nothing read out of bounds (ASan), nothing leaked. A file
 * that loads round-trips: its dump (loco_config_dump, what `loco config`
 * prints and checkpoints store as config.ini) loads back to the same
 * dump. Seeds: fuzz/corpus/config (small configs of configs/). */
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* cfg's dump, in a malloc'ed string. */
static char *dump(const loco_config *cfg, size_t *len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f)
        abort();
    loco_config_dump(cfg, f);
    if (fclose(f))
        abort();
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[128];
    fuzz_write(NULL, "config.ini", data, size, path, sizeof path);
    loco_config cfg;
    loco_config_defaults(&cfg);
    const int rc = loco_config_load(&cfg, path);
    if (rc != 0 && rc != LOCO_EINVAL && rc != LOCO_EIO)
        abort();
    if (rc == 0) {
        size_t len, len2;
        char *text = dump(&cfg, &len);
        fuzz_write(NULL, "dump.ini", text, len, path, sizeof path);
        loco_config again;
        loco_config_defaults(&again);
        if (loco_config_load(&again, path) != 0) {
            fprintf(stderr, "fuzz_config: the dump does not load: %s\n", loco_errmsg());
            abort();
        }
        char *text2 = dump(&again, &len2);
        if (len != len2 || memcmp(text, text2, len))
            abort(); /* the dump loads back to another config */
        free(text);
        free(text2);
    }
    loco_err_clear();
    return 0;
}
