/*
 * cmd_demo — `ect demo`: the whole system end to end on loopback, in
 * separate processes. Push (default): an `ect push-consumer` instance (its
 * scheduler and one shard per TP rank) receives what one `ect push` process
 * sends (in steps of 8 items, --inflight steps in flight, default 4; it
 * generates the next step while they move). With --bench, `ect bench push` of the same
 * item size, step and steps in flight runs right after, in this run, and the
 * report gives the demo's items/s as a ratio to it.
 * Pull: `ect pull` loads what an `ect pull-producer` holds. Every item's
 * checksum (XXH3_64bits, cli_checksum) printed by the producing side must equal the one
 * the consuming side computed over the bytes it received. Workload: batches
 * of 32 new items followed by 8 repeats of that batch's first items (the same
 * content, so the same mm_hash: the consumer answers them from its resident
 * copy — the dedup hits of the report).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uthash.h>

#include "cli/cli.h"
#include "cli/demo_line.h"
#include "cli/demo_proc.h"
#include "ectransfer.h"

#define BATCH_NEW 32
#define BATCH_REP 8
#define SLOT_CONSUMER 0
#define SLOT_PRODUCER 1
#define DEMO_STEP "8"
/* resident copies the consumer keeps per rank (ect push-consumer
 * --keep-resident): a repeat comes BATCH_NEW items after its first, with up
 * to 4 steps (32 items) in flight beside; the pool is not cycled through
 * beyond that (docs/BENCHMARKS.md, issue 13 eighth pass) */
#define DEMO_KEEP_RESIDENT "64"

typedef struct entry {
    char key[256]; /* push: transfer_id; pull: mm_hash */
    char want[17]; /* checksum the producing side printed */
    char got[17];  /* checksum the consuming side computed */
    uint64_t nbytes;
    uint64_t mm; /* push: XXH3 of the mm_hash the producer printed (moved items) */
    bool have_want, have_got, settled, moved;
    UT_hash_handle hh; /* pull: entries are found by mm_hash */
} entry;

typedef struct seen_hash {
    char *hash;
    UT_hash_handle hh;
} seen_hash;

typedef struct demo {
    /* flags */
    const char *protocol, *transport, *shape, *dtype;
    uint64_t items, tp, timeout_ms, item_bytes;
    bool keys;                         /* --keys: CurveZMQ on both sides */
    char keyroot[256];                 /* the temporary directory holding both key dirs */
    char ckeys[300], pkeys[300];       /* consumer-side and producer-side key dirs */
    const char *cons_keys, *prod_keys; /* NULL, or ckeys / pkeys */
    /* run */
    demo_procs procs;
    entry *entries; /* pull: by mm_hash */
    entry *slots;   /* push: item i (transfer_id <id_prefix>-<i>) at [i] */
    char id_prefix[32];
    seen_hash *seen;
    char **pull_hashes; /* pull: the producer's hashes in save order */
    size_t n_pull_hashes;
    uint64_t *lat_ns; /* per item, as the producing side reported it */
    size_t n_lat;
    /* sent: items the producing side reported; moved: of those, the ones whose
     * bytes arrived (push: done on every shard; pull: loaded); retried: moved
     * after waiting for room (push) or a second attempt (pull) */
    uint64_t sent, moved, retried, verified, failed, mismatched, dedup, bytes;
    bool consumer_ready;
    bool producer_ready; /* push: ect push --wait-go reported its first step */
    bool went;           /* push: the go was sent */
    int pull_port;
    bool tty;
    bool bench;        /* --bench: `ect bench push` of the same size after the run */
    uint64_t inflight; /* push: steps in flight (ect push --inflight) */
    /* t_begin: the demo started (before any child); t_start: the transfer
     * clock's start (push: the go, after the first step went alone; pull:
     * the first `ect pull` started); t_settled: the last item settled
     * (verified, mismatched or failed), 0 until then. The transfer span
     * [t_start, t_settled] is what the report's rate and `vs bench` use;
     * [t_begin, t_settled] is the run in all. Stopping the children after
     * is in neither. */
    long long t_begin, t_start, t_settled, t_last_progress, t_ready;
    long long t_serving; /* the consuming side's ready event (push: the consumer's) */
    /* verified items and their bytes when the transfer clock started (the
     * first step's, moved before it) */
    uint64_t verified_at_go, bytes_at_go, dedup_at_go;
    uint64_t next_plain;
} demo;

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) {
    (void)sig;
    stop_flag = 1;
}

static long long now_ms(void) { return (long long)cli_now_ms(); }

/* --keys: two fresh key directories under one temporary directory, each
 * accepting the other's public key (what an operator does by hand with `ect
 * keygen` and a copy, README "Turning authentication on"). */
static bool write_accept(const char *dir, const char *name, const char *pub) {
    char path[400];
    snprintf(path, sizeof path, "%s/accept/%s.public", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return false;
    bool ok = fprintf(f, "%s\n", pub) > 0;
    return fclose(f) == 0 && ok;
}

static bool make_keys(demo *d) {
    const char *tmp = getenv("TMPDIR");
    snprintf(d->keyroot, sizeof d->keyroot, "%s/ect-demo-keys-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(d->keyroot)) {
        fprintf(stderr, "ect demo: --keys: mkdtemp %s: %s\n", d->keyroot, strerror(errno));
        d->keyroot[0] = '\0';
        return false;
    }
    snprintf(d->ckeys, sizeof d->ckeys, "%s/consumer", d->keyroot);
    snprintf(d->pkeys, sizeof d->pkeys, "%s/producer", d->keyroot);
    char cpub[41], ppub[41];
    if (ect_keygen(d->ckeys, cpub) != 0 || ect_keygen(d->pkeys, ppub) != 0) {
        fprintf(stderr, "ect demo: --keys: %s\n", ect_last_error());
        return false;
    }
    if (!write_accept(d->ckeys, "producer", ppub) || !write_accept(d->pkeys, "consumer", cpub)) {
        fprintf(stderr, "ect demo: --keys: cannot write accept/: %s\n", strerror(errno));
        return false;
    }
    d->cons_keys = d->ckeys;
    d->prod_keys = d->pkeys;
    return true;
}

static void remove_keys(demo *d) {
    if (!d->keyroot[0]) return;
    const char *dirs[] = {d->ckeys, d->pkeys};
    const char *files[] = {"self.public", "self.secret", "accept/producer.public",
                           "accept/consumer.public"};
    char path[400];
    for (size_t i = 0; i < 2; i++) {
        for (size_t j = 0; j < sizeof files / sizeof *files; j++) {
            snprintf(path, sizeof path, "%s/%s", dirs[i], files[j]);
            unlink(path);
        }
        snprintf(path, sizeof path, "%s/accept", dirs[i]);
        rmdir(path);
        rmdir(dirs[i]);
    }
    rmdir(d->keyroot);
}

static void help(void) {
    printf(
        "usage: ect demo [--protocol push|pull] [--transport tcp|shm|ucx] [--items N]\n"
        "                [--shape 576x4096] [--dtype bfloat16] [--tp N] [--timeout D]\n"
        "                [--inflight N] [--bench] [--keys]\n"
        "\n"
        "Runs ectransfer end to end on loopback, in separate processes of this binary, and\n"
        "checks every byte. push (default): an `ect push-consumer` instance (scheduler + one\n"
        "shard per TP rank) receives what one `ect push` sends. pull: `ect pull` loads\n"
        "what an `ect pull-producer` holds. The workload comes in batches of 32 new items\n"
        "followed by 8 repeats of the batch's first items (same content, same mm_hash: the\n"
        "consumer answers them from its resident copy). The checksum (XXH3) each producer\n"
        "printed must equal the one the consumer computed over the bytes it received.\n"
        "\n"
        "  --protocol P    push (default) or pull\n"
        "  --transport T   data plane: tcp (default), shm or ucx\n"
        "  --items N       items to move, 1..100000 (default 300)\n"
        "  --shape AxB...  tensor shape, up to 8 dims (default 576x4096: LLaVA, 4.5 MiB bf16)\n"
        "  --dtype D       torch dtype name (default bfloat16); pull announces the bytes as\n"
        "                  uint8 [nbytes]\n"
        "  --tp N          consumer TP ranks (push only), 1..64 (default 1)\n"
        "  --timeout D     give up after D (90s, 5m; bare: seconds; up to 24h; default 300s)\n"
        "  --inflight N    push: steps of 8 items `ect push` keeps in flight, 1..64 (default 4)\n"
        "  --bench         push, TP 1: then run `ect bench push` of the same item size, step\n"
        "                  (8), steps in flight and transport for 1 s (its row is checked to\n"
        "                  be that case) and report the demo's items/s as a ratio to it (line\n"
        "                  `vs bench`; the bench failing fails the demo), and below it the\n"
        "                  ratio counting only the demo's items whose bytes moved (its\n"
        "                  dedup hits move none; every bench item moves its). The bench\n"
        "                  pushes into a shard in its own process and neither generates\n"
        "                  nor checksums its items, which the demo does for every one\n"
        "  --keys          authentication on: makes two key directories (`ect keygen`) that\n"
        "                  accept each other and runs both sides with --curve-keys\n"
        "\n"
        "Prints a live progress line on a terminal (plain lines otherwise), then a report:\n"
        "items moved (the bytes arrived), verified (checksums equal), retried (moved after\n"
        "waiting for room in a full pool) and failed, bytes, time, throughput, per-item\n"
        "latency p50/p99, dedup hits, failures.\n"
        "Time: the transfer, and the run in all. Push: `ect push --wait-go` moves its first\n"
        "step (8 items) alone, which connects it (discovery, data-plane session), and says\n"
        "so; once those items are verified and the consumer serves, the demo starts the\n"
        "transfer clock and sends it the go: the transfer runs from the go to the last item\n"
        "verified or failed, as `ect bench push` times its pushes after its own set-up and\n"
        "warm-up. Pull: from starting the first `ect pull` (each round's start-up is in it).\n"
        "In all: from the demo's start, the children's start-up included. Throughput (and\n"
        "`vs bench`) is over the transfer, counting the items verified in it (push: all but\n"
        "the first step's); stopping the children is in neither time.\n"
        "Exit status: 0 when every item arrived with equal checksums, 1 otherwise (or on\n"
        "SIGINT; the children are always stopped), 2 for bad flags.\n");
}

/* ------------------------------------------------------------ bookkeeping */

static entry *get_entry(demo *d, const char *key) {
    entry *e;
    HASH_FIND_STR(d->entries, key, e);
    if (e) return e;
    e = calloc(1, sizeof *e);
    if (!e) return NULL;
    snprintf(e->key, sizeof e->key, "%s", key);
    HASH_ADD_STR(d->entries, key, e);
    return e;
}

/* Push: the entry of transfer_id "<id_prefix>-<i>" (the demo chose the
 * prefix), i < items, its key set; NULL for any other id. */
static entry *push_entry(demo *d, const char *id) {
    size_t lp = strlen(d->id_prefix);
    if (strncmp(id, d->id_prefix, lp) != 0 || id[lp] != '-') return NULL;
    const char *p = id + lp + 1;
    if (!*p || (*p == '0' && p[1])) return NULL;
    uint64_t i = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9' || i >= d->items) return NULL;
        i = i * 10 + (uint64_t)(*p - '0');
    }
    if (i >= d->items) return NULL;
    entry *e = &d->slots[i];
    if (!e->key[0]) memcpy(e->key, id, (size_t)(p - id) + 1); /* < 64 bytes */
    return e;
}

/* Push: the earlier item whose content item i repeats (ect push --repeat
 * BATCH_NEW:BATCH_REP), or NULL for a new one. */
static const entry *repeated_item(const demo *d, const entry *e) {
    uint64_t i = (uint64_t)(e - d->slots), r = i % (BATCH_NEW + BATCH_REP);
    return r < BATCH_NEW ? NULL : e - BATCH_NEW;
}

static void settle(demo *d, entry *e) {
    if (e->settled || !e->have_want || !e->have_got) return;
    e->settled = true;
    if (strcmp(e->want, e->got) == 0) {
        d->verified++;
        d->bytes += e->nbytes;
    } else {
        d->mismatched++;
        fprintf(stderr, "%sect demo: %s: consumer checksum %s, producer %s\n", d->tty ? "\n" : "",
                e->key, e->got, e->want);
    }
}

/* Counts a dedup hit when mm_hash was moved before in this run. */
static void note_hash(demo *d, const char *mm_hash) {
    seen_hash *s;
    HASH_FIND_STR(d->seen, mm_hash, s);
    if (s) {
        d->dedup++;
        return;
    }
    s = calloc(1, sizeof *s);
    if (!s || !(s->hash = strdup(mm_hash))) {
        free(s);
        return;
    }
    HASH_ADD_KEYPTR(hh, d->seen, s->hash, strlen(s->hash), s);
}

static void add_latency(demo *d, double ms) {
    if (d->n_lat < d->items) d->lat_ns[d->n_lat++] = ms > 0 ? (uint64_t)llround(ms * 1e6) : 0;
}

static void item_failed(demo *d, const char *what, const char *why) {
    d->failed++;
    fprintf(stderr, "%sect demo: %s failed: %s\n", d->tty ? "\n" : "", what, why);
}

/* Push: lines of `ect push-consumer` (slot 0) and `ect push` (slot 1). */
/* A child's readiness line: {"event": "ready", ...} on stdout. */
static bool is_ready(const demo_line *o) { return strcmp(demo_line_str(o, "event"), "ready") == 0; }

static void push_line(demo *d, int child, const demo_line *o) {
    if (!o) return;
    if (is_ready(o)) {
        if (child == SLOT_CONSUMER) {
            d->consumer_ready = true;
            d->t_serving = now_ms();
        } else
            d->producer_ready = true;
        return;
    }
    const char *id = demo_line_str(o, "transfer_id");
    if (!*id) return; /* not an item's line */
    entry *e = push_entry(d, id);
    if (!e) {
        item_failed(d, id, "not an item of this run");
        return;
    }
    if (child == SLOT_CONSUMER) {
        snprintf(e->got, sizeof e->got, "%s", demo_line_str(o, "checksum"));
        e->have_got = true;
    } else {
        d->sent++;
        add_latency(d, demo_line_num(o, "latency_ms"));
        if (strcmp(demo_line_str(o, "status"), "ok") != 0) { /* "ok" or the error text */
            e->settled = true;
            item_failed(d, id, demo_line_str(o, "status"));
            return;
        }
        d->moved++;
        if (demo_line_int(o, "retries") > 0) d->retried++;
        /* a dedup hit: the same mm_hash as the item whose content it repeats,
         * moved before, and nothing written for it (transport "": every shard
         * answered it `cached`, from its resident copy) */
        const char *mm = demo_line_str(o, "mm_hash");
        e->mm = cli_checksum(mm, strlen(mm));
        e->moved = true;
        const entry *first = repeated_item(d, e);
        d->dedup += first && first->moved && first->mm == e->mm && !*demo_line_str(o, "transport");
        snprintf(e->want, sizeof e->want, "%s", demo_line_str(o, "checksum"));
        e->nbytes = (uint64_t)demo_line_int(o, "nbytes");
        e->have_want = true;
    }
    settle(d, e);
}

/* Pull: lines of `ect pull-producer` (slot 0) and `ect pull` (slot 1). */
static void pull_line(demo *d, int child, const demo_line *o) {
    if (!o) return;
    if (child == SLOT_CONSUMER) {
        if (is_ready(o)) {
            d->pull_port = (int)demo_line_int(o, "port");
            return;
        }
        const char *h = demo_line_str(o, "mm_hash");
        if (!*h) return;
        entry *e = get_entry(d, h);
        if (!e) return;
        snprintf(e->want, sizeof e->want, "%s", demo_line_str(o, "checksum"));
        e->nbytes = (uint64_t)demo_line_int(o, "nbytes");
        e->have_want = true;
        char **nh = realloc(d->pull_hashes, (d->n_pull_hashes + 1) * sizeof *nh);
        if (nh && (nh[d->n_pull_hashes] = strdup(h)) != NULL) {
            d->pull_hashes = nh;
            d->n_pull_hashes++;
        } else if (nh) {
            d->pull_hashes = nh;
        }
        return;
    }
    const char *h = demo_line_str(o, "mm_hash");
    entry *e;
    HASH_FIND_STR(d->entries, h, e);
    d->sent++;
    add_latency(d, demo_line_num(o, "latency_ms"));
    bool loaded = strcmp(demo_line_str(o, "status"), "ok") == 0;
    d->moved += loaded && e;
    if (loaded && e && demo_line_int(o, "attempts") > 1) d->retried++;
    if (!e) {
        item_failed(d, h, "the consumer loaded a hash the producer never announced");
        return;
    }
    if (strcmp(demo_line_str(o, "status"), "ok") != 0) {
        item_failed(d, h, demo_line_str(o, "status"));
        return;
    }
    note_hash(d, h);
    /* every load of a hash is checked, repeats included */
    if (strcmp(demo_line_str(o, "checksum"), e->want) == 0 &&
        (uint64_t)demo_line_int(o, "nbytes") == e->nbytes) {
        d->verified++;
        d->bytes += e->nbytes;
    } else {
        d->mismatched++;
        fprintf(stderr, "%sect demo: %s: consumer checksum %s, producer %s\n", d->tty ? "\n" : "",
                h, demo_line_str(o, "checksum"), e->want);
    }
}

static void on_line(void *user, int child, bool is_stderr, char *line) {
    demo *d = user;
    demo_line l;
    bool obj = !is_stderr && line[0] == '{' && demo_line_parse(line, &l);
    if (!is_stderr && !obj && line[0])
        fprintf(stderr, "%sect demo: unexpected output of %s: %.200s\n", d->tty ? "\n" : "",
                d->procs.c[child].name, line);
    if (strcmp(d->protocol, "push") == 0)
        push_line(d, child, obj ? &l : NULL);
    else
        pull_line(d, child, obj ? &l : NULL);
    if (obj) demo_line_free(&l);
}

/* ------------------------------------------------------------- progress */

static void progress(demo *d, bool final) {
    long long t = now_ms();
    double secs = (double)(t - d->t_start) / 1000.0;
    double gbps = secs > 0 ? (double)(d->bytes - d->bytes_at_go) / secs / 1e9 : 0;
    char b[32];
    cli_fmt_size(d->bytes, b, sizeof b);
    if (d->tty) {
        if (!final && t - d->t_last_progress < 100) return;
        d->t_last_progress = t;
        printf("\r  %" PRIu64 "/%" PRIu64 " items verified, %s, %.2f GB/s, %" PRIu64
               " dedup hits, %" PRIu64 " failures   ",
               d->verified, d->items, b, gbps, d->dedup, d->failed + d->mismatched);
        if (final) printf("\n");
        fflush(stdout);
        return;
    }
    if (d->verified >= d->next_plain || (final && d->verified < d->items)) {
        printf("  %" PRIu64 "/%" PRIu64 " items verified, %s, %.2f GB/s\n", d->verified, d->items,
               b, gbps);
        fflush(stdout);
        uint64_t step = d->items / 4 ? d->items / 4 : 1;
        while (d->next_plain <= d->verified) d->next_plain += step;
    }
}

/* Notes when the last item settled (the end of the report's time span). */
static void note_settled(demo *d) {
    if (!d->t_settled && d->verified + d->mismatched + d->failed >= d->items)
        d->t_settled = now_ms();
}

/* Seconds from `from` to the last item settled (or to now, when not every
 * item did). */
static double secs_since(const demo *d, long long from) {
    long long end = d->t_settled ? d->t_settled : now_ms();
    return (double)(end - from) / 1000.0;
}

/* Pumps output for up to ms; false when interrupted or past the deadline. */
static bool pump(demo *d, int ms, long long deadline, const char **why) {
    demo_pump(&d->procs, ms);
    note_settled(d);
    progress(d, false);
    if (stop_flag) {
        *why = "interrupted";
        return false;
    }
    if (now_ms() > deadline) {
        *why = "timed out (--timeout)";
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ push */

/* A base port with tp consecutive ports free on 127.0.0.1 (the consumer binds
 * them; a race with another process is retried by the caller). */
static int free_port_range(int n) {
    for (int attempt = 0; attempt < 64; attempt++) {
        int base = 20000 + (int)(cli_random_u64() % 40000);
        bool ok = true;
        for (int i = 0; i < n && ok; i++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in a = {.sin_family = AF_INET,
                                    .sin_port = htons((uint16_t)(base + i)),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            ok = fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
            if (fd >= 0) close(fd);
        }
        if (ok) return base;
    }
    return -1;
}

static bool start_push_consumer(demo *d, int *port, long long deadline, const char **why) {
    char tp[16], pool[32], portbuf[16];
    /* each rank holds one batch resident, so the repeats are answered cached */
    uint64_t per_item = (d->item_bytes + 4095) & ~(uint64_t)4095;
    snprintf(pool, sizeof pool, "%" PRIu64, per_item * (BATCH_NEW + 8) + (64u << 20));
    snprintf(tp, sizeof tp, "%" PRIu64, d->tp);
    for (int attempt = 0; attempt < 8; attempt++) {
        *port = free_port_range((int)d->tp);
        if (*port < 0) {
            *why = "no free port range on 127.0.0.1";
            return false;
        }
        snprintf(portbuf, sizeof portbuf, "%d", *port);
        char *argv[] = {"push-consumer",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        portbuf,
                        "--tp",
                        tp,
                        "--transport",
                        (char *)d->transport,
                        "--pool-size",
                        pool,
                        "--keep-resident",
                        DEMO_KEEP_RESIDENT,
                        d->cons_keys ? "--curve-keys" : NULL,
                        (char *)d->cons_keys,
                        NULL};
        if (!demo_spawn(&d->procs, SLOT_CONSUMER, "ect push-consumer", argv)) {
            *why = "cannot start ect push-consumer";
            return false;
        }
        d->consumer_ready = false;
        long long until = now_ms() + 20000;
        while (!d->consumer_ready && d->procs.c[SLOT_CONSUMER].pid > 0 && now_ms() < until)
            if (!pump(d, 50, deadline, why)) return false;
        if (d->consumer_ready) return true;
        demo_stop(&d->procs, SLOT_CONSUMER, SIGTERM, 2000);
        if (!strstr(d->procs.c[SLOT_CONSUMER].errtail, "address in use")) {
            fprintf(stderr, "%s", d->procs.c[SLOT_CONSUMER].errtail);
            *why = "ect push-consumer did not start";
            return false;
        }
    }
    *why = "every port range tried was taken";
    return false;
}

/* Items the producer reported that have not settled yet. */
static uint64_t unsettled(const demo *d) {
    uint64_t n = 0;
    for (uint64_t i = 0; i < d->items; i++) {
        const entry *e = &d->slots[i];
        n += (e->have_want || e->have_got) && !e->settled;
    }
    return n;
}

/* Push: once `ect push --wait-go` reported its first step (sent alone: it
 * connected) and those items settled on both sides (or 15 s passed: they
 * fail at the end), starts the transfer clock and sends the go. False when
 * the go cannot be sent. */
static bool maybe_go(demo *d) {
    if (d->went || !d->producer_ready) return true;
    long long now = now_ms();
    if (!d->t_ready) d->t_ready = now;
    if (unsettled(d) && now - d->t_ready < 15000) return true;
    d->went = true;
    d->verified_at_go = d->verified;
    d->bytes_at_go = d->bytes;
    d->dedup_at_go = d->dedup;
    d->t_start = now_ms();
    return demo_send(&d->procs, SLOT_PRODUCER, "go");
}

/* Runs one `ect push` of count items (the whole workload: --repeat gives
 * every block of BATCH_NEW new items BATCH_REP repeats of its first ones) and
 * waits for it to exit. --inflight steps of DEMO_STEP move at once; it
 * generates the next one meanwhile. */
static bool push_round(demo *d, int port, uint64_t seed, uint64_t count, long long deadline,
                       const char **why) {
    char to[32], cnt[24], sd[24], tmo[24], repeat[48], tp[16], fl[24];
    snprintf(fl, sizeof fl, "%" PRIu64, d->inflight);
    snprintf(tp, sizeof tp, "%" PRIu64, d->tp);
    snprintf(repeat, sizeof repeat, "%d:%d", BATCH_NEW, BATCH_REP);
    snprintf(to, sizeof to, "127.0.0.1:%d", port);
    snprintf(cnt, sizeof cnt, "%" PRIu64, count);
    snprintf(sd, sizeof sd, "%" PRIu64, seed);
    snprintf(tmo, sizeof tmo, "%" PRIu64 "ms", d->timeout_ms);
    char *argv[] = {"push",
                    "--to",
                    to,
                    "--count",
                    cnt,
                    "--seed",
                    sd,
                    "--shape",
                    (char *)d->shape,
                    "--dtype",
                    (char *)d->dtype,
                    "--step",
                    DEMO_STEP,
                    "--inflight",
                    fl,
                    "--repeat",
                    repeat,
                    "--timeout",
                    tmo,
                    "--tp",
                    tp,
                    "--wait-go",
                    "--id-prefix",
                    d->id_prefix,
                    d->prod_keys ? "--curve-keys" : NULL,
                    (char *)d->prod_keys,
                    NULL};
    uint64_t before = d->sent;
    if (!demo_spawn(&d->procs, SLOT_PRODUCER, "ect push", argv)) {
        *why = "cannot start ect push";
        return false;
    }
    while (!demo_exited(&d->procs, SLOT_PRODUCER)) {
        if (!pump(d, 50, deadline, why)) return false;
        if (!maybe_go(d)) {
            *why = "cannot send ect push its go";
            return false;
        }
        if (demo_exited(&d->procs, SLOT_CONSUMER)) {
            *why = "ect push-consumer exited during the run";
            return false;
        }
    }
    int st = d->procs.c[SLOT_PRODUCER].status;
    if (d->sent - before != count) {
        fprintf(stderr, "%s", d->procs.c[SLOT_PRODUCER].errtail);
        uint64_t missing = count - (d->sent - before);
        d->failed += missing;
        fprintf(stderr, "ect demo: ect push reported %" PRIu64 " of %" PRIu64 " items (%s %d)\n",
                d->sent - before, count, WIFEXITED(st) ? "exit" : "signal",
                WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    }
    return true;
}

static bool run_push(demo *d, const char **why) {
    long long deadline = now_ms() + (long long)d->timeout_ms;
    int port;
    if (!start_push_consumer(d, &port, deadline, why)) return false;
    if (!push_round(d, port, 1, d->items, deadline, why)) return false;
    /* the consumer prints an item once every rank took it: wait for the rest */
    long long until = now_ms() + 15000;
    for (;;) {
        if (!unsettled(d)) break;
        if (now_ms() > until) {
            for (entry *e = d->slots; e < d->slots + d->items; e++)
                if ((e->have_want || e->have_got) && !e->settled) {
                    e->settled = true;
                    item_failed(d, e->key,
                                e->have_want ? "never reached the consumer's engine"
                                             : "the producer never reported it");
                }
            break;
        }
        if (!pump(d, 50, deadline, why)) return false;
    }
    int st = demo_stop(&d->procs, SLOT_CONSUMER, SIGTERM, 10000);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "%s", d->procs.c[SLOT_CONSUMER].errtail);
        *why = "ect push-consumer did not exit cleanly";
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ pull */

static bool run_pull(demo *d, const char **why) {
    long long deadline = now_ms() + (long long)d->timeout_ms;
    /* the items the producer saves: BATCH_NEW of every batch */
    uint64_t uniq = 0, left = d->items;
    while (left > 0) {
        uint64_t fresh = left < BATCH_NEW ? left : BATCH_NEW;
        left -= fresh;
        uniq += fresh;
        uint64_t rep = fresh < BATCH_REP ? fresh : BATCH_REP;
        left -= rep > left ? left : rep;
    }
    uint64_t per_item = (d->item_bytes + 4095) & ~(uint64_t)4095;
    char cnt[24], size[24], ppool[32], cpool[32];
    snprintf(cnt, sizeof cnt, "%" PRIu64, uniq);
    snprintf(size, sizeof size, "%" PRIu64, d->item_bytes);
    snprintf(ppool, sizeof ppool, "%" PRIu64, per_item * uniq + (64u << 20));
    snprintf(cpool, sizeof cpool, "%" PRIu64, per_item * (BATCH_NEW + 8) + (64u << 20));
    char *pargv[] = {"pull-producer",
                     "--port",
                     "0",
                     "--transport",
                     (char *)d->transport,
                     "--count",
                     cnt,
                     "--size",
                     size,
                     "--pool-size",
                     ppool,
                     d->prod_keys ? "--curve-keys" : NULL,
                     (char *)d->prod_keys,
                     NULL};
    if (!demo_spawn(&d->procs, SLOT_CONSUMER, "ect pull-producer", pargv)) {
        *why = "cannot start ect pull-producer";
        return false;
    }
    /* slot 0 is the producer here: it prints its items, then its ready event */
    while (d->pull_port == 0) {
        if (!pump(d, 50, deadline, why)) return false;
        if (d->procs.c[SLOT_CONSUMER].pid <= 0) {
            fprintf(stderr, "%s", d->procs.c[SLOT_CONSUMER].errtail);
            *why = "ect pull-producer exited before serving";
            return false;
        }
    }
    if (d->n_pull_hashes != uniq) {
        *why = "ect pull-producer did not list every item";
        return false;
    }
    /* One `ect pull` per round of whole batches (it takes at most 1024 --hash;
     * a batch's repeats stay in the process that loaded its first items). */
    enum { ROUND_BATCHES = 1000 / (BATCH_NEW + BATCH_REP) };
    char **argv = calloc(11 + 2 * ROUND_BATCHES * (BATCH_NEW + BATCH_REP) + 1, sizeof *argv);
    if (!argv) {
        *why = "out of memory";
        return false;
    }
    char from[32];
    snprintf(from, sizeof from, "127.0.0.1:%d", d->pull_port);
    d->t_start = now_ms();
    left = d->items;
    for (uint64_t batch = 0; left > 0;) {
        size_t k = 0;
        argv[k++] = "pull";
        argv[k++] = "--from";
        argv[k++] = from;
        argv[k++] = "--transport";
        argv[k++] = (char *)d->transport;
        argv[k++] = "--pool-size";
        argv[k++] = cpool;
        argv[k++] = "--timeout";
        argv[k++] = "60000";
        if (d->cons_keys) {
            argv[k++] = "--curve-keys";
            argv[k++] = (char *)d->cons_keys;
        }
        uint64_t before = d->sent, round = 0;
        for (int nb = 0; nb < ROUND_BATCHES && left > 0; nb++, batch++) {
            uint64_t fresh = left < BATCH_NEW ? left : BATCH_NEW;
            left -= fresh;
            for (uint64_t i = 0; i < fresh; i++) {
                argv[k++] = "--hash";
                argv[k++] = d->pull_hashes[batch * BATCH_NEW + i];
            }
            uint64_t rep = fresh < BATCH_REP ? fresh : BATCH_REP;
            if (rep > left) rep = left;
            left -= rep;
            for (uint64_t i = 0; i < rep; i++) {
                argv[k++] = "--hash";
                argv[k++] = d->pull_hashes[batch * BATCH_NEW + i];
            }
            round += fresh + rep;
        }
        argv[k] = NULL;
        if (!demo_spawn(&d->procs, SLOT_PRODUCER, "ect pull", argv)) {
            free(argv);
            *why = "cannot start ect pull";
            return false;
        }
        while (!demo_exited(&d->procs, SLOT_PRODUCER)) {
            if (!pump(d, 50, deadline, why)) {
                free(argv);
                return false;
            }
            if (demo_exited(&d->procs, SLOT_CONSUMER)) { /* loads would only time out */
                free(argv);
                *why = "ect pull-producer exited during the run";
                return false;
            }
        }
        if (d->sent - before != round) {
            fprintf(stderr, "%s", d->procs.c[SLOT_PRODUCER].errtail);
            fprintf(stderr, "ect demo: ect pull reported %" PRIu64 " of %" PRIu64 " items\n",
                    d->sent - before, round);
            d->failed += round - (d->sent - before);
        }
    }
    free(argv);
    int st = demo_stop(&d->procs, SLOT_CONSUMER, SIGTERM, 10000);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "%s", d->procs.c[SLOT_CONSUMER].errtail);
        *why = "ect pull-producer did not exit cleanly";
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- report */

/* What the report's rate is over: the transfer span (from the transfer
 * clock's start to the last item settled) and the items verified in it;
 * the whole run when none was (every item went before the clock, in the
 * first step). all_secs: the run in all, start-up included. dedup: of the
 * items, the dedup hits (answered `cached`: no bytes moved). */
typedef struct span {
    double secs, all_secs;
    uint64_t items, bytes, dedup;
    bool whole;
} span;

static span transfer_span(const demo *d) {
    span s = {.secs = secs_since(d, d->t_start),
              .all_secs = secs_since(d, d->t_begin),
              .items = d->verified - d->verified_at_go,
              .bytes = d->bytes - d->bytes_at_go,
              .dedup = d->dedup - d->dedup_at_go};
    if (!s.items)
        s = (span){.secs = s.all_secs,
                   .all_secs = s.all_secs,
                   .items = d->verified,
                   .bytes = d->bytes,
                   .dedup = d->dedup,
                   .whole = true};
    return s;
}

static double per_sec(double x, double secs) { return secs > 0 ? x / secs : 0.0; }

static void report(demo *d, const span *sp) {
    char b[32], isz[32];
    cli_fmt_size(d->bytes, b, sizeof b);
    cli_fmt_size(d->item_bytes, isz, sizeof isz);
    cli_sort_u64(d->lat_ns, d->n_lat);
    uint64_t failures = d->failed + d->mismatched;
    char tp[32] = "";
    if (strcmp(d->protocol, "push") == 0) snprintf(tp, sizeof tp, "TP %" PRIu64 ", ", d->tp);
    printf("ect demo: %s protocol, %s, %s%" PRIu64 " items of %s %s (%s each)\n", d->protocol,
           d->transport, tp, d->items, d->shape, d->dtype, isz);
    printf("  items       %" PRIu64 " moved, %" PRIu64
           " verified (checksums equal end to end), %" PRIu64 " retried, %" PRIu64 " failed\n",
           d->moved - d->mismatched, d->verified, d->retried, failures);
    printf("  bytes       %s\n", b);
    if (sp->whole)
        printf("  time        %.2f s in all (no transfer span: every item went in the first "
               "step, moved alone before the transfer clock)\n",
               sp->all_secs);
    else if (strcmp(d->protocol, "push") == 0 && d->went)
        printf("  time        %.2f s transfer, %.2f s in all (before the clock: %.2f s starting "
               "the consumer, %.2f s ect push and its first step alone)\n",
               sp->secs, sp->all_secs, (double)(d->t_serving - d->t_begin) / 1000.0,
               (double)(d->t_start - d->t_serving) / 1000.0);
    else
        printf("  time        %.2f s transfer, %.2f s in all (start-up before the clock)\n",
               sp->secs, sp->all_secs);
    printf("  throughput  %.2f GB/s (%.1f items/s) over %s (%" PRIu64 " items)\n",
           per_sec((double)sp->bytes, sp->secs) / 1e9, per_sec((double)sp->items, sp->secs),
           sp->whole ? "the run in all: every item went in the first step" : "the transfer",
           sp->items);
    printf("  latency     p50 %.2f ms, p99 %.2f ms per item (%s)\n",
           (double)cli_pct_u64(d->lat_ns, d->n_lat, 50) / 1e6,
           (double)cli_pct_u64(d->lat_ns, d->n_lat, 99) / 1e6,
           strcmp(d->protocol, "push") == 0 ? "reserve to done, at the producer"
                                            : "load call to completion, at the consumer");
    printf("  dedup hits  %" PRIu64 " (repeated mm_hash, answered from the resident copy)\n",
           d->dedup);
    printf("  failures    %" PRIu64 "\n", failures);
    if (d->retried)
        printf("  (retried: %s; nothing was lost)\n",
               strcmp(d->protocol, "push") == 0
                   ? "the consumer's pool was full, so the producer waited and reserved again"
                   : "a load was refused while the producer was busy and was asked again");
}

/* True when the bench's row measured the demo's case: transport, item size,
 * step and steps in flight as the demo ran them (like for like). */
static bool bench_row_matches(const demo *d, json_t *row) {
    const char *x = json_string_value(json_object_get(row, "transport"));
    return x && strcmp(x, d->transport) == 0 &&
           json_integer_value(json_object_get(row, "size")) == (json_int_t)d->item_bytes &&
           json_integer_value(json_object_get(row, "step")) == atoi(DEMO_STEP) &&
           json_integer_value(json_object_get(row, "inflight")) == (json_int_t)d->inflight;
}

/* --bench: `ect bench push` (this binary, a child) of the demo's item size,
 * step and steps in flight over its transport for 1 s; its items/s, or a
 * negative value (and why on stderr) when it could not run or its row is
 * not the demo's case. */
static double bench_items_s(const demo *d) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || memchr(exe, '\'', (size_t)n)) {
        fprintf(stderr, "ect demo: --bench: cannot name this binary\n");
        return -1;
    }
    exe[n] = '\0';
    char cmd[4400];
    snprintf(cmd, sizeof cmd,
             "'%s' bench push --json --transport %s --sizes %" PRIu64 " --steps " DEMO_STEP
             " --inflight %" PRIu64 " --seconds 1",
             exe, d->transport, d->item_bytes, d->inflight);
    FILE *f = popen(cmd, "r");
    if (!f) {
        fprintf(stderr, "ect demo: --bench: %s\n", strerror(errno));
        return -1;
    }
    json_error_t je;
    json_t *rows = json_loadf(f, JSON_DISABLE_EOF_CHECK, &je);
    int st = pclose(f);
    json_t *row = json_array_get(rows, 0), *v = json_object_get(row, "items_per_s");
    double r = json_is_number(v) ? json_number_value(v) : -1;
    if (r > 0 && !bench_row_matches(d, row)) {
        fprintf(stderr, "ect demo: --bench: the bench's row is not the demo's case\n");
        r = -1;
    }
    json_decref(rows);
    if (st != 0 || r <= 0) {
        fprintf(stderr, "ect demo: --bench: ect bench push failed (status %d)\n", st);
        return -1;
    }
    return r;
}

/* ------------------------------------------------------------------ main */

static bool parse_shape(const char *s, uint64_t *elems) {
    uint64_t n = 1;
    int dims = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9') return false;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || v == 0 || end == p || ++dims > 8) return false;
        if (!cli_mul_u64(n, v, &n)) return false;
        p = end;
        if (*p == 'x') {
            p++;
            if (!*p) return false;
        } else if (*p) {
            return false;
        }
    }
    *elems = n;
    return dims > 0;
}

int cmd_demo(int argc, char **argv) {
    static const struct option opts[] = {
        {"protocol", required_argument, 0, 'P'}, {"transport", required_argument, 0, 't'},
        {"items", required_argument, 0, 'n'},    {"shape", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 'd'},    {"tp", required_argument, 0, 'T'},
        {"timeout", required_argument, 0, 'o'},  {"bench", no_argument, 0, 'b'},
        {"inflight", required_argument, 0, 'f'}, {"keys", no_argument, 0, 'K'},
        {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    demo d = {.protocol = "push",
              .transport = "tcp",
              .shape = "576x4096",
              .dtype = "bfloat16",
              .items = 300,
              .tp = 1,
              .timeout_ms = 300000,
              .inflight = 4};
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'P':
            if (strcmp(optarg, "push") != 0 && strcmp(optarg, "pull") != 0)
                return cli_usage_error("demo", "--protocol '%s': accepted: push, pull", optarg);
            d.protocol = optarg;
            break;
        case 't':
            if (strcmp(optarg, "tcp") != 0 && strcmp(optarg, "shm") != 0 &&
                strcmp(optarg, "ucx") != 0)
                return cli_usage_error("demo", "--transport '%s': accepted: tcp, shm, ucx", optarg);
            if (strcmp(optarg, "ucx") == 0 && !cli_have_transport("ucx"))
                return cli_usage_error("demo", "--transport ucx: this build has no UCX");
            d.transport = optarg;
            break;
        case 'n':
            if (!cli_parse_u64("--items", optarg, 1, 100000, &d.items)) return CLI_EXIT_USAGE;
            break;
        case 's': d.shape = optarg; break;
        case 'd': d.dtype = optarg; break;
        case 'T':
            if (!cli_parse_u64("--tp", optarg, 1, 64, &d.tp)) return CLI_EXIT_USAGE;
            break;
        case 'o':
            if (!cli_parse_duration_u64("--timeout", optarg, 1000, 1, 86400000, &d.timeout_ms))
                return CLI_EXIT_USAGE;
            break;
        case 'b': d.bench = true; break;
        case 'K': d.keys = true; break;
        case 'f':
            if (!cli_parse_u64("--inflight", optarg, 1, 64, &d.inflight)) return CLI_EXIT_USAGE;
            break;
        case 'h': help(); return CLI_EXIT_OK;
        default:
            return cli_usage_error("demo",
                                   "unknown flag or missing value '%s'; accepted: --protocol, "
                                   "--transport, --items, --shape, --dtype, --tp, --timeout, "
                                   "--inflight, --bench, --keys, --help",
                                   argv[optind - 1]);
        }
    }
    if (optind < argc) return cli_usage_error("demo", "unexpected argument '%s'", argv[optind]);
    uint64_t elems;
    if (!parse_shape(d.shape, &elems))
        return cli_usage_error("demo",
                               "--shape '%s': expected up to 8 positive sizes joined by 'x', "
                               "e.g. 576x4096",
                               d.shape);
    size_t esz = ect_dtype_size(d.dtype);
    if (esz == 0)
        return cli_usage_error("demo",
                               "--dtype '%s' is not a torch dtype name (e.g. bfloat16, "
                               "float16, float32, uint8)",
                               d.dtype);
    if (!cli_mul_u64(elems, esz, &d.item_bytes) || d.item_bytes > (1ull << 34))
        return cli_usage_error("demo", "--shape %s x %s is over 16 GiB per item", d.shape, d.dtype);
    if (strcmp(d.protocol, "pull") == 0 && d.tp != 1)
        return cli_usage_error("demo", "--tp: generation 1 (pull) has no TP shards; use --tp 1");
    if (d.bench && (strcmp(d.protocol, "push") != 0 || d.tp != 1 || d.item_bytes % 2 ||
                    d.item_bytes > (256ull << 20)))
        return cli_usage_error("demo",
                               "--bench compares with `ect bench push`: push, --tp 1, and an item "
                               "size that is even and at most 256 MiB");

    d.lat_ns = calloc(d.items, sizeof *d.lat_ns);
    d.slots = strcmp(d.protocol, "push") == 0 ? calloc(d.items, sizeof *d.slots) : NULL;
    if (!d.lat_ns || (!d.slots && strcmp(d.protocol, "push") == 0)) {
        fprintf(stderr, "ect demo: out of memory\n");
        free(d.lat_ns);
        free(d.slots);
        return CLI_EXIT_FAIL;
    }
    snprintf(d.id_prefix, sizeof d.id_prefix, "demo-%d", (int)getpid());
    if (d.keys && !make_keys(&d)) {
        remove_keys(&d);
        free(d.lat_ns);
        free(d.slots);
        return CLI_EXIT_FAIL;
    }
    d.tty = isatty(STDOUT_FILENO);
    d.next_plain = d.items / 4 ? d.items / 4 : 1;
    d.procs.on_line = on_line;
    d.procs.user = &d;
    /* the children's lines in batches of ~2 ms: reading each as it came,
     * the parent woke ~1,400 times per 10,000 items and spent a quarter of
     * its CPU switching (docs/BENCHMARKS.md, issue 13 fifth pass) */
    d.procs.batch_ms = 2;
    for (int i = 0; i < DEMO_MAX_CHILDREN; i++)
        d.procs.c[i].fd[0] = d.procs.c[i].fd[1] = d.procs.c[i].in = -1;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns at once */
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    char isz[32];
    cli_fmt_size(d.item_bytes, isz, sizeof isz);
    if (strcmp(d.protocol, "push") == 0)
        printf("ect demo: starting ect push-consumer (scheduler + %" PRIu64
               " shard(s), %s) and pushing %" PRIu64 " items of %s %s (%s) with ect push\n",
               d.tp, d.transport, d.items, d.shape, d.dtype, isz);
    else
        printf("ect demo: starting ect pull-producer (%s), saving the items, then pulling %" PRIu64
               " items of %s (%s %s) with ect pull\n",
               d.transport, d.items, isz, d.shape, d.dtype);
    if (d.keys)
        printf("ect demo: keys on (CurveZMQ on every ZMQ socket, key handshake on every data-plane "
               "session): consumer keys %s, producer keys %s (each accepts the "
               "other)\n",
               d.ckeys, d.pkeys);
    fflush(stdout);
    d.t_begin = d.t_start = now_ms();
    const char *why = NULL;
    bool ok = strcmp(d.protocol, "push") == 0 ? run_push(&d, &why) : run_pull(&d, &why);
    span sp = transfer_span(&d);
    demo_stop_all(&d.procs);
    progress(&d, true);
    report(&d, &sp);
    if (!ok) fprintf(stderr, "ect demo: %s\n", why);
    bool pass = ok && d.verified == d.items && d.failed == 0 && d.mismatched == 0;
    if (pass && d.bench && !stop_flag) {
        double mine = per_sec((double)sp.items, sp.secs), b = bench_items_s(&d);
        if (b > 0) {
            printf("  vs bench    %.2f x `ect bench push` (%.1f items/s; like for like, as its "
                   "row says: %s items, steps of " DEMO_STEP ", %" PRIu64 " in flight, %s; "
                   "measured right after)\n",
                   mine / b, b, isz, d.inflight, d.transport);
            /* every bench item moves its bytes; the demo's dedup hits move none */
            printf("              %.2f x counting only the demo's %" PRIu64
                   " items whose bytes moved (its %" PRIu64 " dedup hits moved none)\n",
                   per_sec((double)(sp.items - sp.dedup), sp.secs) / b, sp.items - sp.dedup,
                   sp.dedup);
        } else
            pass = false;
    }
    if (ok && !pass)
        fprintf(stderr, "ect demo: %" PRIu64 " of %" PRIu64 " items verified\n", d.verified,
                d.items);

    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    entry *e, *tmp;
    HASH_ITER(hh, d.entries, e, tmp) {
        HASH_DEL(d.entries, e);
        free(e);
    }
    seen_hash *s, *stmp;
    HASH_ITER(hh, d.seen, s, stmp) {
        HASH_DEL(d.seen, s);
        free(s->hash);
        free(s);
    }
    for (size_t i = 0; i < d.n_pull_hashes; i++) free(d.pull_hashes[i]);
    free(d.pull_hashes);
    free(d.lat_ns);
    free(d.slots);
    remove_keys(&d);
    return pass ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
