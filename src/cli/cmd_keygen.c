/*
 * cmd_keygen — `ect keygen DIR`: creates a key directory with a new CURVE key
 * pair (ect_keygen) and says how a peer is accepted. docs/SECURITY.md has the
 * layout and how the keys are used.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "cli/cli.h"

static void help(void) {
    printf("usage: ect keygen DIR [--json]\n"
           "\n"
           "Creates DIR (mode 0700) with a new CURVE key pair: DIR/self.secret (mode 0600) and\n"
           "DIR/self.public, 40 characters of Z85 each, and an empty DIR/accept/. Never replaces\n"
           "a key pair that is already there.\n"
           "\n"
           "To let two sides talk, copy each side's self.public into the other's accept/ folder\n"
           "under any NAME ending in .public (e.g. encoder.public), then start every role with\n"
           "--curve-keys DIR (or \"curve_keys\": \"DIR\" in its JSON config). With keys on, every\n"
           "ZMQ socket speaks CurveZMQ and every data-plane session starts with a key handshake;\n"
           "a peer whose key is not accepted gets nothing. docs/SECURITY.md has the details.\n"
           "\n"
           "  --json   print {\"status\":\"ok\",\"dir\":...,\"public\":...} instead of text\n"
           "\n"
           "Exit status: 0 created; 1 could not (a pair exists, no permission), reason on\n"
           "stderr; 2 bad usage.\n");
}

int cmd_keygen(int argc, char **argv) {
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    bool as_json = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'j': as_json = true; break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag("keygen", opts);
        }
    }
    if (optind >= argc) return cli_usage_error("keygen", "DIR is required");
    if (optind + 1 < argc)
        return cli_usage_error("keygen", "unexpected argument '%s'", argv[optind + 1]);
    const char *dir = argv[optind];
    char pub[41];
    if (ect_keygen(dir, pub) != 0) {
        fprintf(stderr, "ect keygen: %s\n", ect_last_error());
        return CLI_EXIT_FAIL;
    }
    if (as_json) {
        json_t *o = json_pack("{s:s,s:s,s:s}", "status", "ok", "dir", dir, "public", pub);
        char *d = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (d) printf("%s\n", d);
        free(d);
        json_decref(o);
    } else
        printf("public key %s\nwritten to %s/self.public (secret: %s/self.secret, mode 0600)\n"
               "accept a peer: copy its self.public to %s/accept/NAME.public\n",
               pub, dir, dir, dir);
    return CLI_EXIT_OK;
}
