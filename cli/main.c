/* loco: entry point and subcommand dispatch. */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

#define LOCO_VERSION "0.1.0"

static void usage(FILE *f) {
    fprintf(f,
            "loco %s — train GPT models across datacenters\n\n"
            "Under mpirun -np N, train runs N ranks of one island (parallel.dp, zero_stage).\n\n"
            "usage: loco COMMAND [ARGS]\n\n"
            "  train CONFIG [--set section.key=value]... [--resume CKPT_DIR|RUN_DIR]\n"
            "        [--init HF_GPT2_DIR]\n"
            "                         train; progress, eval and checkpoints per [run]\n"
            "  eval CONFIG --ckpt DIR [--batches N] [--set k=v]...\n"
            "                         validation loss of a checkpoint as one JSON line\n"
            "  sample --ckpt DIR --prompt TEXT [--tokens N] [--temperature X] [--top-k K] "
            "[--seed S]\n"
            "                         generate text from a checkpoint\n"
            "  prep TEXT OUT_PREFIX [--val-frac F] [--shard-tokens N] [--tokenizer FILE\n"
            "        [--pattern NAME]]\n"
            "                         train/val token shards from a text file (bytes, or BPE\n"
            "                         ids with --tokenizer; then also OUT_PREFIX_tokenizer.json)\n"
            "  tokenizer train TEXT --vocab N --out FILE [--pattern NAME] | encode|decode --tokenizer FILE\n"
            "        [--pattern NAME] [IN]\n"
            "                         byte-level BPE: train a tokenizer.json, encode, decode;\n"
            "                         NAME: pre-tokenizer gpt2, cl100k, o200k, llama3 (auto:\n"
            "                         what FILE declares)\n"
            "  config --help | --markdown | --dump [CONFIG] [--set k=v]...\n"
            "                         the configuration keys, or a resolved config\n"
            "  island CONFIG --site NAME [--resume CKPT_DIR|RUN_DIR] [--set k=v]...\n"
            "                         one island of a multi-site DiLoCo run (or under mpirun)\n"
            "  coordinator CONFIG [--set k=v]...\n"
            "                         registers the islands of outer.sites and checks they agree\n"
            "  launch CONFIG [--set k=v]...\n"
            "                         coordinator + every island on this machine, merged output\n"
            "  lab CONFIG [--seeds N] [--sweep KEY=V1,V2,...]... [--json FILE] [--set k=v]...\n"
            "                         the quality lab: the islands in one process against data\n"
            "                         parallelism, over seeds and settings (docs/QUALITY.md)\n"
            "  report FAULT_RUN_DIR BASELINE_RUN_DIR [--out DIR] [--loss-tol X] [--strict-loss]\n"
            "                         report.md + report.html of a fault experiment against its\n"
            "                         baseline; exit 1 on FAIL (divergence, lost update, no finish)\n"
            "  report RUN_DIR [--out DIR]\n"
            "                         report.html of a training run (loss, val loss, lr, grad norm,\n"
            "                         tokens/s; bytes and outer steps per island when multi-site);\n"
            "                         a fault experiment's dir gets its report against RUN_DIR/baseline\n"
            "  certs --out DIR --names coordinator,siteA,... [--days N] [--run-id ID]\n"
            "        [--config CONFIG] [--set k=v]...\n"
            "                         a CA and a certificate per name (mutual TLS), bound to\n"
            "                         a run id (--run-id, net.run_id, DIR/run_id, else new)\n"
            "  certs revoke --out DIR --names siteB,...\n"
            "                         list their certificates in DIR/crl.pem (net.crl)\n"
            "  ckpt export CKPT_DIR OUT_DIR\n"
            "                         one Hugging Face model.safetensors + config.json from any\n"
            "                         checkpoint, sharded or not\n"
            "  pipeline [CONFIG] [--set k=v]... [--costs F,B,W] [--latency L]\n"
            "                         pipeline schedules checked by the simulator: every schedule\n"
            "                         against the published bubble and memory; with CONFIG or\n"
            "                         --set, parallel.pp_schedule's per-rank action lists\n"
            "  bench step|memory|exchange|compress|rejoin|pipeline|tokenizer [OPTIONS]\n"
            "                         benchmarks against a reference measured in the same run\n"
            "  version                print the version\n",
            LOCO_VERSION);
}

int cli_fail(int rc) {
    fprintf(stderr, "loco: error: %s\n", loco_errmsg()[0] ? loco_errmsg() : loco_strerror(rc));
    return CLI_FAIL;
}

int cli_load_config(loco_config *cfg, const char *path, int nsets, char **sets) {
    loco_config_defaults(cfg);
    if (path)
        LOCO_CHECK(loco_config_load(cfg, path));
    for (int i = 0; i < nsets; i++)
        LOCO_CHECK(loco_config_set(cfg, sets[i]));
    LOCO_CHECK(loco_config_validate(cfg));
    loco_log_level level;
    LOCO_CHECK(loco_log_parse_level(cfg->run.log_level, &level));
    loco_log_set_level(level);
    return 0;
}

int main(int argc, char **argv) {
    /* OpenMP threads that spin while OpenBLAS's own pool works (and the
     * other way round) halve the speed on a machine with few cores
     * (docs/PERFORMANCE.md). libgomp reads its wait policy only when it
     * starts, so set a passive one and start again; the results do not
     * depend on it. An explicit OMP_WAIT_POLICY is respected. */
    if (!getenv("OMP_WAIT_POLICY")) {
        setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
        execv("/proc/self/exe", argv);
        /* exec failed: go on with libgomp's default */
    }
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    const char *cmd = argv[1];
    int sub_argc = argc - 2;
    char **sub_argv = argv + 2;
    if (!strcmp(cmd, "train"))
        return cli_train(sub_argc, sub_argv);
    if (!strcmp(cmd, "eval"))
        return cli_eval(sub_argc, sub_argv);
    if (!strcmp(cmd, "sample"))
        return cli_sample(sub_argc, sub_argv);
    if (!strcmp(cmd, "prep"))
        return cli_prep(sub_argc, sub_argv);
    if (!strcmp(cmd, "config"))
        return cli_config(sub_argc, sub_argv);
    if (!strcmp(cmd, "bench"))
        return cli_bench(sub_argc, sub_argv);
    if (!strcmp(cmd, "ckpt"))
        return cli_ckpt(sub_argc, sub_argv);
    if (!strcmp(cmd, "island"))
        return cli_island(sub_argc, sub_argv);
    if (!strcmp(cmd, "coordinator"))
        return cli_coordinator(sub_argc, sub_argv);
    if (!strcmp(cmd, "certs"))
        return cli_certs(sub_argc, sub_argv);
    if (!strcmp(cmd, "launch"))
        return cli_launch(sub_argc, sub_argv);
    if (!strcmp(cmd, "report"))
        return cli_report(sub_argc, sub_argv);
    if (!strcmp(cmd, "pipeline"))
        return cli_pipeline(sub_argc, sub_argv);
    if (!strcmp(cmd, "tokenizer"))
        return cli_tokenizer(sub_argc, sub_argv);
    if (!strcmp(cmd, "lab"))
        return cli_lab(sub_argc, sub_argv);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("loco %s\n", LOCO_VERSION);
        return CLI_OK;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return CLI_OK;
    }
    fprintf(stderr, "loco: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return CLI_USAGE;
}
