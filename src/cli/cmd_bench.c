/*
 * cmd_bench — `ect bench [NAME] [--json]`: runs one benchmark by name, or all
 * of them and prints ONE table. Each benchmark measures its figures beside a
 * limit measured in the same run (raw TCP, memcpy, raw write_batch, a linear
 * free list) and the ratio between the two. For the combined table each one
 * runs in a child process with --json (so a crash in one costs only its rows)
 * and its rows are mapped onto one row shape, bench_row.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"

static const cli_bench benches[] = {
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

/* Run by name only (they need hardware the combined run cannot assume). */
static const cli_bench named_only[] = {
    {"gpu", "GPU pools over tcp and shm/CUDA IPC, 4.5 and 64 MiB, vs device copies (needs CUDA)",
     bench_gpu},
    {NULL, NULL, NULL},
};

/* Flags each benchmark gets in the combined run: default, and --quick. */
static const struct {
    const char *name;
    const char *quick[4];
} quick_flags[] = {
    {"push", {"--seconds", "0.05", "--sizes", "64KiB,4.5MiB"}},
    {"pull", {"--ms", "50", NULL, NULL}},
    {"xport", {"--seconds", "0.05", NULL, NULL}},
    {"alloc", {"--ms", "20", NULL, NULL}},
};

/* One row of the combined table. */
typedef struct bench_row {
    char bench[8];
    char what[64];    /* transport, size, items per step ... */
    double value;     /* the figure */
    const char *unit; /* "GB/s", "ops/s" */
    char limit[32];   /* what it is compared with */
    double limit_value;
    double ratio;  /* value / limit_value, as the benchmark computed it */
    double p50_ms; /* per batch / item / round; NAN if none */
} bench_row;

typedef struct rows {
    bench_row *v;
    size_t n, cap;
} rows;

static bench_row *add_row(rows *r, const char *bench) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 32;
        bench_row *nv = realloc(r->v, cap * sizeof *nv);
        if (!nv) return NULL;
        r->v = nv;
        r->cap = cap;
    }
    bench_row *row = &r->v[r->n++];
    memset(row, 0, sizeof *row);
    snprintf(row->bench, sizeof row->bench, "%s", bench);
    row->p50_ms = NAN;
    row->unit = "GB/s";
    return row;
}

static double num(json_t *o, const char *k) { return json_number_value(json_object_get(o, k)); }
static const char *str(json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "?";
}

/* Maps one benchmark's --json output onto rows. Returns false if it is not
 * what that benchmark documents. */
static bool parse_rows(const char *name, const char *text, rows *out) {
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!root) {
        fprintf(stderr, "ect bench: %s --json: %s (line %d)\n", name, err.text, err.line);
        return false;
    }
    json_t *list = strcmp(name, "alloc") == 0 ? json_object_get(root, "results") : root;
    if (!json_is_array(list)) {
        fprintf(stderr, "ect bench: %s --json: no list of rows\n", name);
        json_decref(root);
        return false;
    }
    size_t i;
    json_t *o;
    json_array_foreach(list, i, o) {
        bench_row *r = add_row(out, name);
        if (!r) break;
        char sz[32];
        if (strcmp(name, "alloc") == 0) {
            snprintf(r->what, sizeof r->what, "%s, %" PRId64 " fragments", str(o, "workload"),
                     (int64_t)num(o, "fragments"));
            r->value = num(o, "tree_ops_per_s");
            r->unit = "ops/s";
            snprintf(r->limit, sizeof r->limit, "linear first-fit");
            r->limit_value = num(o, "linear_ops_per_s");
        } else { /* xport, push, pull: a transport and an item size, in GB/s */
            bool xp = strcmp(name, "xport") == 0;
            size_t len = (size_t)snprintf(r->what, sizeof r->what, "%s %s", str(o, "transport"),
                                          cli_fmt_size((uint64_t)num(o, "size"), sz, sizeof sz));
            if (len < sizeof r->what && strcmp(name, "push") == 0)
                snprintf(r->what + len, sizeof r->what - len, ", step %" PRId64,
                         (int64_t)num(o, "step"));
            else if (len < sizeof r->what && xp && json_object_get(o, "batch"))
                snprintf(r->what + len, sizeof r->what - len, " x %" PRId64 " in one batch",
                         (int64_t)num(o, "batch"));
            else if (len < sizeof r->what && strcmp(name, "pull") == 0)
                snprintf(r->what + len, sizeof r->what - len, " x %" PRId64 "%s",
                         (int64_t)num(o, "items"), num(o, "inflight") > 1 ? " in flight" : "");
            r->value = num(o, "gbps");
            snprintf(r->limit, sizeof r->limit, "%s", xp ? str(o, "limit") : "raw write_batch");
            r->limit_value = num(o, xp ? "limit_gbps" : "raw_gbps");
            r->p50_ms = xp ? num(o, "p50_us") / 1000.0 : num(o, "p50_ms");
        }
        r->ratio = num(o, "ratio");
    }
    json_decref(root);
    return true;
}

/* Runs benchmark b with --json (plus its --quick flags) in a child process
 * and reads what it prints. Returns its exit status; *text is malloc'd. */
static int run_child(const cli_bench *b, bool quick, char **text) {
    int fds[2];
    *text = NULL;
    if (pipe(fds) != 0) {
        fprintf(stderr, "ect bench: pipe: %s\n", strerror(errno));
        return CLI_EXIT_FAIL;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "ect bench: fork: %s\n", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return CLI_EXIT_FAIL;
    }
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[1]);
        char *argv[8] = {(char *)b->name, "--json"};
        int n = 2;
        for (size_t i = 0; quick && i < sizeof quick_flags / sizeof quick_flags[0]; i++)
            if (strcmp(quick_flags[i].name, b->name) == 0)
                for (int k = 0; k < 4 && quick_flags[i].quick[k]; k++)
                    argv[n++] = (char *)quick_flags[i].quick[k];
        argv[n] = NULL;
        optind = 1;
        int rc = b->run(n, argv);
        fflush(stdout);
        _exit(rc);
    }
    close(fds[1]);
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap);
    for (;;) {
        if (buf && len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            } else {
                buf = nb;
                cap *= 2;
            }
        }
        char sink[4096];
        ssize_t n = buf ? read(fds[0], buf + len, cap - len - 1) : read(fds[0], sink, sizeof sink);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (buf) len += (size_t)n;
    }
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (buf) buf[len] = '\0';
    *text = buf;
    if (WIFEXITED(st)) return WEXITSTATUS(st);
    fprintf(stderr, "ect bench: %s died of signal %d\n", b->name, WTERMSIG(st));
    return CLI_EXIT_FAIL;
}

static void print_table(const rows *r) {
    printf("%-6s %-28s %12s %-6s %-18s %12s %7s %10s\n", "bench", "case", "value", "unit", "limit",
           "limit value", "ratio", "p50 ms");
    for (size_t i = 0; i < r->n; i++) {
        const bench_row *w = &r->v[i];
        char p50[16] = "-";
        if (!isnan(w->p50_ms)) snprintf(p50, sizeof p50, "%.3f", w->p50_ms);
        if (strcmp(w->unit, "ops/s") == 0)
            printf("%-6s %-28s %12.0f %-6s %-18s %12.0f %7.3f %10s\n", w->bench, w->what, w->value,
                   w->unit, w->limit, w->limit_value, w->ratio, p50);
        else
            printf("%-6s %-28s %12.3f %-6s %-18s %12.3f %7.3f %10s\n", w->bench, w->what, w->value,
                   w->unit, w->limit, w->limit_value, w->ratio, p50);
    }
    printf("\nratio = value / limit, both measured in this run (GB/s = 10^9 B/s). Each line's\n"
           "benchmark is described by 'ect bench NAME --help'.\n");
}

static void print_json(const rows *r) {
    json_t *list = json_array();
    for (size_t i = 0; i < r->n; i++) {
        const bench_row *w = &r->v[i];
        json_t *o = json_object();
        json_object_set_new(o, "bench", json_string(w->bench));
        json_object_set_new(o, "case", json_string(w->what));
        json_object_set_new(o, "value", json_real(w->value));
        json_object_set_new(o, "unit", json_string(w->unit));
        json_object_set_new(o, "limit", json_string(w->limit));
        json_object_set_new(o, "limit_value", json_real(w->limit_value));
        json_object_set_new(o, "ratio", json_real(w->ratio));
        json_object_set_new(o, "p50_ms", isnan(w->p50_ms) ? json_null() : json_real(w->p50_ms));
        json_array_append_new(list, o);
    }
    /* 17 significant digits: the numbers as measured, so a reader checking a
     * ratio against value / limit gets it exactly (rounded values do not) */
    char *s = json_dumps(list, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (s) printf("%s\n", s);
    free(s);
    json_decref(list);
}

static void help(void) {
    printf("usage: ect bench [--json] [--quick]\n"
           "       ect bench NAME [--json] [FLAGS]\n\n"
           "Without NAME runs every benchmark below (each in a child process) and prints ONE\n"
           "table: bench, case, value, limit, limit value, ratio (value / limit, both measured\n"
           "in this run) and p50 latency. With NAME runs that one with its own flags and\n"
           "output.\n\n"
           "  --json    one JSON list of rows {bench, case, value, unit, limit, limit_value,\n"
           "            ratio, p50_ms}\n"
           "  --quick   the shortest timings each benchmark allows (a smoke run; noisy)\n\n"
           "benchmarks:\n");
    for (const cli_bench *b = benches; b->name; b++) printf("  %-10s %s\n", b->name, b->summary);
    printf("by name only (not in the combined run):\n");
    for (const cli_bench *b = named_only; b->name; b++) printf("  %-10s %s\n", b->name, b->summary);
    printf("\n'ect bench NAME --help' describes each one's flags.\n");
}

int cmd_bench(int argc, char **argv) {
    if (argc >= 2 && argv[1][0] != '-') {
        for (const cli_bench *b = benches; b->name; b++)
            if (strcmp(argv[1], b->name) == 0) {
                static char name[64];
                snprintf(name, sizeof name, "bench %s", b->name);
                cli_set_command(name);
                return b->run(argc - 1, argv + 1);
            }
        for (const cli_bench *b = named_only; b->name; b++)
            if (strcmp(argv[1], b->name) == 0) {
                static char name[64];
                snprintf(name, sizeof name, "bench %s", b->name);
                cli_set_command(name);
                return b->run(argc - 1, argv + 1);
            }
        return cli_usage_error(
            "bench", "unknown benchmark '%s'; accepted: push, pull, xport, alloc, gpu", argv[1]);
    }
    bool json = false, quick = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            help();
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--json") == 0) {
            json = true;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = true;
        } else {
            return cli_usage_error("bench",
                                   "unknown flag '%s'; accepted: --json, --quick, --help, or a "
                                   "benchmark name first (push, pull, xport, alloc)",
                                   argv[i]);
        }
    }
    rows r = {0};
    int rc = CLI_EXIT_OK;
    for (const cli_bench *b = benches; b->name; b++) {
        if (!json) {
            fprintf(stderr, "ect bench: running %s ...\n", b->name);
        }
        char *text = NULL;
        int st = run_child(b, quick, &text);
        if (st != CLI_EXIT_OK) {
            fprintf(stderr, "ect bench: %s exited with status %d\n", b->name, st);
            rc = CLI_EXIT_FAIL;
        }
        if (!text || !parse_rows(b->name, text, &r)) rc = CLI_EXIT_FAIL;
        free(text);
    }
    if (json)
        print_json(&r);
    else
        print_table(&r);
    free(r.v);
    return rc;
}
