/* Which run id a run's certificates carry (`loco certs`). */
#include "net/net.h"

#include <stdio.h>

int loco_net_pick_run_id(char id[LOCO_NET_RUN_ID_MAX], const char **from, const char *opt,
                         const char *cfg_id, const char *dir) {
    id[0] = '\0';
    if (opt) {
        LOCO_CHECK(loco_net_run_id_check(opt));
        snprintf(id, LOCO_NET_RUN_ID_MAX, "%.63s", opt);
        *from = "from --run-id";
        return 0;
    }
    if (cfg_id && cfg_id[0]) {
        LOCO_CHECK(loco_net_run_id_check(cfg_id));
        snprintf(id, LOCO_NET_RUN_ID_MAX, "%.63s", cfg_id);
        *from = "from net.run_id";
        return 0;
    }
    const int kept = loco_net_certs_run_id(dir, id);
    if (kept != 0) {
        *from = "kept from DIR/run_id";
        return kept < 0 ? kept : 0;
    }
    *from = "new, random";
    return loco_net_new_run_id(id);
}
