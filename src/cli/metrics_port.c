/*
 * metrics_port — `--metrics-port P` for the long-running commands: starts
 * the library's metrics endpoint (ect_metrics_serve) on the command's bind
 * address and says where it listens.
 */
#include <inttypes.h>
#include <stdio.h>

#include "cli/cli.h"

bool cli_parse_metrics_port(const char *cmd, const char *s, int *port) {
    uint64_t v;
    if (!cli_parse_u64("--metrics-port", s, 0, 65535, &v)) {
        fprintf(stderr, "ect %s: --metrics-port takes 0..65535 (0: any free port)\n", cmd);
        return false;
    }
    *port = (int)v;
    return true;
}

bool cli_metrics_start(const char *cmd, const char *host, int port, ect_metrics_server **out) {
    *out = NULL;
    if (port < 0) return true;
    if (ect_metrics_serve(host, port, out) != 0) {
        fprintf(stderr, "ect %s: --metrics-port %d: %s\n", cmd, port, ect_last_error());
        return false;
    }
    fprintf(stderr, "ect %s: metrics on http://%s:%d/metrics\n", cmd, host,
            ect_metrics_server_port(*out));
    return true;
}
