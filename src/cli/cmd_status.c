/*
 * cmd_status — `ect status HOST:PORT [--json]`: asks a running push consumer
 * shard for its status (ect_push_status, the ect_status control op) and
 * prints a short table, or the compact JSON the shard answered. A consumer
 * that is not running, or an upstream one (which has no such op), is a clear
 * error on stderr and exit 1.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"

static void help(void) {
    printf("usage: ect status HOST:PORT [--json] [--timeout SECONDS] [--curve-keys DIR]\n"
           "\n"
           "Asks the push consumer shard whose control port is HOST:PORT (an `ect push-consumer`\n"
           "or any consumer built on libectransfer) for its pool, reservations by state, peers\n"
           "and latest errors (control op ect_status, docs/PROTOCOL.md), and prints a table.\n"
           "\n"
           "  --json            print the shard's answer as one compact JSON line instead:\n"
           "                    "
           "{\"status\":\"ok\",\"shard\",\"tp_size\",\"port\",\"transport\",\"pool\",\n"
           "                    \"reservations\",\"peers\",\"events\",\"refused\",\"errors\"}\n"
           "  --timeout SECONDS how long to wait for the answer (default 5)\n"
           "  --curve-keys DIR  CurveZMQ on every ZMQ socket (docs/SECURITY.md): DIR from `ect\n"
           "                    keygen`, with the peers' public keys in DIR/accept/; default off\n"
           "\n"
           "Exit status: 0 answered; 1 no consumer answers there (stopped, wrong port), or it\n"
           "does not know ect_status (an upstream consumer), with the reason on stderr\n"
           "(with --json also {\"status\":\"error text\"} on stdout); 2 bad usage.\n");
}

static json_int_t num(const json_t *o, const char *k) {
    return json_integer_value(json_object_get(o, k));
}

static void print_table(const json_t *r, const char *addr) {
    char a[32], b[32], c[32];
    const json_t *pool = json_object_get(r, "pool");
    printf("shard        %" JSON_INTEGER_FORMAT " of %" JSON_INTEGER_FORMAT " at %s (%s)\n",
           num(r, "shard"), num(r, "tp_size"), addr,
           json_string_value(json_object_get(r, "transport")) ?: "?");
    printf("pool         %s capacity, %s used, %s resident\n",
           cli_fmt_size((uint64_t)num(pool, "capacity"), a, sizeof a),
           cli_fmt_size((uint64_t)num(pool, "used"), b, sizeof b),
           cli_fmt_size((uint64_t)num(pool, "resident"), c, sizeof c));
    printf("reservations");
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(r, "reservations"), k, v)
        printf(" %s %" JSON_INTEGER_FORMAT, k, json_integer_value(v));
    printf("\npeers       ");
    size_t i;
    json_array_foreach((json_t *)json_object_get(r, "peers"), i, v)
        printf(" %" JSON_INTEGER_FORMAT, json_integer_value(v));
    const json_t *ev = json_object_get(r, "events");
    printf("\nevents       %" JSON_INTEGER_FORMAT " queued, %" JSON_INTEGER_FORMAT
           " sent, %" JSON_INTEGER_FORMAT " dropped\n",
           num(ev, "queued"), num(ev, "sent"), num(ev, "dropped"));
    printf("refused     ");
    json_object_foreach((json_t *)json_object_get(r, "refused"), k, v)
        printf(" %s %" JSON_INTEGER_FORMAT, k, json_integer_value(v));
    const json_t *errs = json_object_get(r, "errors");
    printf("\nlast errors  %s\n", json_array_size(errs) ? "" : "(none)");
    json_array_foreach((json_t *)errs, i, v)
        printf("  %s  %s\n", json_string_value(json_object_get(v, "time")) ?: "?",
               json_string_value(json_object_get(v, "error")) ?: "?");
}

int cmd_status(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"timeout", required_argument, 0, 't'},
                                         {"curve-keys", required_argument, 0, 'K'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *curve_keys = NULL;
    bool as_json = false;
    double timeout = 5;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': as_json = true; break;
        case 't':
            if (!cli_parse_seconds("status", optarg, 0.001, 3600, &timeout)) return CLI_EXIT_USAGE;
            break;
        case 'K': curve_keys = optarg; break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("status", opts);
        }
    }
    if (optind >= argc) return cli_usage_error("status", "HOST:PORT is required");
    if (optind + 1 < argc)
        return cli_usage_error("status", "unexpected argument '%s'", argv[optind + 1]);
    char host[256];
    int port;
    if (!cli_parse_hostport("HOST:PORT", argv[optind], host, sizeof host, &port))
        return CLI_EXIT_USAGE;
    char *txt = NULL;
    if (ect_push_status_keyed(host, port, (int)(timeout * 1000 + 0.5), curve_keys, &txt) != 0) {
        const char *why = ect_last_error();
        fprintf(stderr, "ect status: %s\n", why);
        if (as_json) {
            json_t *o = json_pack("{s:s}", "status", why);
            char *d = json_dumps(o, JSON_COMPACT);
            if (d) printf("%s\n", d);
            free(d);
            json_decref(o);
        }
        return CLI_EXIT_FAIL;
    }
    json_error_t e;
    json_t *r = json_loads(txt, 0, &e);
    free(txt);
    if (!json_is_object(r)) {
        json_decref(r);
        fprintf(stderr, "ect status: %s: the answer is not a JSON object\n", argv[optind]);
        return CLI_EXIT_FAIL;
    }
    if (as_json) {
        json_t *o = json_object();
        json_object_set_new(o, "status", json_string("ok"));
        json_object_update(o, r);
        char *d = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (d) printf("%s\n", d);
        free(d);
        json_decref(o);
    } else {
        print_table(r, argv[optind]);
    }
    json_decref(r);
    return CLI_EXIT_OK;
}
