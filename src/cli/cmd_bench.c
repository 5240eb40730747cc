/*
 * cmd_bench — `ect bench [NAME] [--json]`: runs one benchmark by name, or all
 * of them in order. Each benchmark prints its figures beside a limit measured
 * in the same run and the ratio between the two.
 */
#include <string.h>

#include "cli/cli.h"

static const cli_bench benches[] = {
    /* @@BENCH_TABLE@@ */
    {"push", "generation-2 pushes, steps of 1/8/32 items (64 KiB..16 MiB) vs raw write_batch",
     bench_push},
    {"pull", "generation-1 pulls of 1 and 32 items (64 KiB..16 MiB) vs raw transport writes",
     bench_pull},
    {"xport", "transport batch writes 64 KiB..64 MiB vs raw TCP, memcpy and ucx_perftest",
     bench_xport},
    {"alloc", "pool allocator alloc+free at 10..100,000 fragments vs a linear first-fit list",
     bench_alloc},
    {NULL, NULL, NULL},
};

static void help(void) {
    printf("usage: ect bench [NAME] [--json] [FLAGS]\n\n"
           "Runs the named benchmark, or every one of them in turn. Each prints its figures\n"
           "beside a limit measured in the same run, and the ratio.\n\nbenchmarks:\n");
    for (const cli_bench *b = benches; b->name; b++) printf("  %-10s %s\n", b->name, b->summary);
    printf("\n'ect bench NAME --help' describes each one's flags.\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        help();
        return CLI_EXIT_OK;
    }
    if (argc >= 2 && argv[1][0] != '-') {
        for (const cli_bench *b = benches; b->name; b++)
            if (strcmp(argv[1], b->name) == 0) return b->run(argc - 1, argv + 1);
        return cli_usage_error("bench", "unknown benchmark '%s'", argv[1]);
    }
    int rc = CLI_EXIT_OK;
    for (const cli_bench *b = benches; b->name; b++) {
        char *sub[64];
        int n = argc < 63 ? argc : 63;
        sub[0] = (char *)b->name;
        for (int i = 1; i < n; i++) sub[i] = argv[i];
        sub[n] = NULL;
        int r = b->run(n, sub);
        if (r != CLI_EXIT_OK) rc = r;
    }
    return rc;
}
