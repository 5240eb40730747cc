/* cmd_info — `ect info`: version, what was compiled in, the defaults. */
#include <getopt.h>
#include <string.h>

#include "cli/cli.h"
#include "ect_config.h"
#include "ectransfer.h"

static void help(void) {
    printf("usage: ect info\n\n"
           "Prints the library version, the build, the transports compiled in and the\n"
           "protocol defaults.\n");
}

int cmd_info(int argc, char **argv) {
    static const struct option opts[] = {{"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'h') {
            help();
            return CLI_EXIT_OK;
        }
        return cli_usage_error("info", "unknown flag");
    }
    if (optind < argc) return cli_usage_error("info", "unexpected argument '%s'", argv[optind]);
    printf("ectransfer %s\n", ect_version());
    printf("build: %s%s%s\n", ECT_BUILD_TYPE, ECT_SANITIZE_MODE[0] ? ", sanitize=" : "",
           ECT_SANITIZE_MODE);
    printf("transports compiled in: tcp shm%s\n", ECT_HAVE_UCX ? " ucx" : "");
    printf("defaults:\n");
    printf("  ec_ip                127.0.0.1\n");
    printf("  ec_port              14579 (pull: ROUTER +0, PUB +1; push: + dp_index*tp_size + "
           "tp_rank)\n");
    printf("  ec_buffer_size       1000000000 bytes\n");
    printf("  alignment            256 B\n");
    printf("  reservation ttl      300 s (refresh after 150 s, reaper every 1 s)\n");
    printf("  control timeout      30 s; push wait 60 s; pull receive timeout 60 s\n");
    printf("  event backlog        4096; tombstones 65536\n");
    return CLI_EXIT_OK;
}
