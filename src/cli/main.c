/*
 * main — `ect`: dispatches to a command by name. `ect --help` lists them.
 */
#include <signal.h>
#include <string.h>

#include "cli/cli.h"
#include "ectransfer.h"

static const cli_cmd commands[] = {
    {"info", "print the version, compiled-in transports and defaults", cmd_info},
    {"demo", "run push (or pull) end to end in separate processes and verify every byte", cmd_demo},
    {"push-consumer", "generation-2 consumer: receive pushed items, one JSON line each",
     cmd_push_consumer},
    {"push", "generation-2 producer: push items into a consumer's shards, one JSON line each",
     cmd_push},
    {"pull-producer", "generation-1 producer: save items, announce them, serve pulls",
     cmd_pull_producer},
    {"pull", "generation-1 consumer: learn a producer's items, pull and verify them", cmd_pull},
    {"status", "ask a running push consumer shard for its pool, reservations, peers and errors",
     cmd_status},
    {"keygen", "create a key directory (CURVE key pair) for --curve-keys", cmd_keygen},
    {"bench", "run benchmarks and print ratios against limits measured in the same run", cmd_bench},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: ect COMMAND [FLAGS]\n"
            "\n"
            "ectransfer %s: move encoder outputs (embedding tensors) between inference instances.\n"
            "\n"
            "commands:\n",
            ect_version());
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-16s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'ect COMMAND --help' describes each command. ECT_LOG=error|warn|info|debug sets "
               "the log level.\n"
               "Durations take units (500ms, 30s, 2m, 1h); a bare number keeps each flag's unit, "
               "given in its --help.\nSizes: 4096, 64KiB, 4.5MiB, 1GiB, 2GB. Machine output "
               "(--json, daemons' stdout) is compact JSON,\none object a line; daemons print "
               "{\"event\":\"ready\",...} once they serve.\n");
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("ect %s\n", ect_version());
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0) {
            ect_log_set_role(commands[i].name); /* "role=push-consumer" in log lines */
            cli_set_command(commands[i].name);
            return commands[i].run(argc - 1, argv + 1);
        }
    fprintf(stderr, "ect: unknown command '%s'; commands are:", argv[1]);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(stderr, " %s", commands[i].name);
    fprintf(stderr, "\ntry 'ect --help'\n");
    return CLI_EXIT_USAGE;
}
