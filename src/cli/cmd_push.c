/*
 * cmd_push — `ect push`: a generation-2 producer on the command line. Pushes
 * deterministic synthetic items (or a file's bytes) into a consumer instance
 * (`ect push-consumer`) through ect_push_producer, in steps of --step items
 * (one flush each; up to --inflight steps move at once, the next one is
 * generated meanwhile), and prints one JSON line per item as it finishes. The
 * content of item i depends only on (--seed, i, size), so a re-run prints
 * the same checksums and a consumer can verify them.
 *
 * Under pressure nothing fails: a consumer whose pool is full makes items
 * wait and retry (the producer's back-pressure, up to --push-wait); the JSON
 * line of each item says how many reserve rounds it needed, and the summary
 * counts moved (done on every shard), retried and failed items.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "ectransfer.h"

#define CMD "push"
#define MAX_STEP 4096

static void help(void) {
    printf(
        "usage: ect push --to HOST:PORT [--count N] [--size SIZE | --shape AxB...] [--dtype D]\n"
        "                [--file F] [--step K] [--seed S] [--id-prefix P] [--timeout D]\n"
        "                [--control-timeout D] [--transport tcp|shm|ucx] [--tp N]\n"
        "                [--repeat NEW:REP] [--push-wait D] [--device cpu|cuda|cuda:N]\n"
        "                [--inflight N] [--wait-go] [--curve-keys DIR]\n\n"
        "Pushes items into the consumer instance whose TP rank 0 serves control requests at\n"
        "HOST:PORT (`ect push-consumer`): reserve on every shard (found through `peers`), one\n"
        "batched write per destination session, complete on every shard. The data plane\n"
        "(tcp, shm, ucx) and the TP size are the consumer's: it names them in its replies.\n\n"
        "  --to HOST:PORT        the consumer's control address (required)\n"
        "  --count N             items to push, 1..1000000 (default 1)\n"
        "  --size SIZE           bytes per item (\"64KiB\", \"4.5MiB\"); shape becomes [SIZE / "
        "dtype size]\n"
        "  --shape AxB...        tensor shape, up to 8 dims (default 576x4096)\n"
        "  --dtype D             torch dtype name (default bfloat16)\n"
        "  --file F              push F's bytes instead of synthetic ones (every item the same;\n"
        "                        shape [len / dtype size] unless --shape is given)\n"
        "  --step K              items per step (one flush: one reserve_batch and one\n"
        "                        complete_batch per shard), 1..4096 (default: all, at most 4096)\n"
        "  --inflight N          steps kept in flight, 1..64 (default 1: each step waits for\n"
        "                        the previous one's results; N: up to N steps move at once,\n"
        "                        counted from the oldest unfinished one; the consumer still\n"
        "                        receives the items in push order)\n"
        "  --wait-go             start-up apart from the transfer (what `ect demo` times): the\n"
        "                        first step goes alone (it connects: discovery, the data-plane\n"
        "                        sessions); once its items are reported, print\n"
        "                        {\"event\":\"ready\",\"warmup_items\":K} and wait for a line \"go\"\n"
        "                        on stdin before the next step; stdin ending first: exit 1\n"
        "  --seed S              synthetic content seed (default 1)\n"
        "  --repeat NEW:REP      in every block of NEW + REP items, the last REP carry the\n"
        "                        content of the block's first REP (same mm_hash: dedup hits);\n"
        "                        REP <= NEW. Default: every item new\n"
        "  --id-prefix P         transfer_id prefix (default push-<pid>-<random>)\n"
        "  --timeout D           give up on a step D after it started (30s, 2m; bare: seconds;\n"
        "                        default 120s): its unfinished items are cancelled\n"
        "  --push-wait D         how long an item may wait for room when the consumer's pool is\n"
        "                        full (it retries meanwhile; bare: seconds; default 60s, "
        "upstream's\n"
        "                        push_wait_timeout_s); then it fails saying the pool stayed full\n"
        "  --control-timeout D   each control exchange (bare: seconds; default 30s, as the spec "
        "says)\n"
        "  --transport T         require data plane T: an item whose consumer offers another\n"
        "                        fails before anything is reserved (default: whatever the\n"
        "                        consumer offers)\n"
        "  --tp N                require the consumer to have N shards (TP ranks): with another\n"
        "                        number every item fails before anything is reserved\n"
        "  --device D            where the items live: cpu (default), or cuda / cuda:N (GPU\n"
        "                        memory, borrowed: tcp stages each with one device-to-host\n"
        "                        copy, shm into a GPU pool copies device to device by CUDA\n"
        "                        IPC). Needs the CUDA driver (`ect info`)\n"
        "  --curve-keys DIR      CurveZMQ on every ZMQ socket (docs/SECURITY.md): DIR from `ect\n"
        "                        keygen`, with the peers' public keys in DIR/accept/; default\n"
        "                        off\n"
        "\n"
        "Item i: bytes = synthetic ones of state (seed, c) (a fixed random block, every 8\n"
        "  bytes XOR a per-4-KiB key of (seed, c, page)), or the file's bytes; c = i,\n"
        "  or with --repeat: block b = i / (NEW + REP), r = i %% (NEW + REP),\n"
        "  c = b x NEW + (r < NEW ? r : r - NEW).\n"
        "  transfer_id = <prefix>-<i>   (unique per run, so a re-run is not refused)\n"
        "  mm_hash     = xxh3-<checksum>-<dtype>-<shape>   (a hash of the content: repeated\n"
        "                content dedups at the consumer, which answers it `cached`)\n"
        "  checksum    = XXH3_64bits (seed 0) of the bytes, 16 hex digits (as ect push-consumer\n"
        "                prints)\n"
        "Output: one JSON line per item: transfer_id, mm_hash, nbytes, checksum, status\n"
        "(ok | the error text), state (done | failed | cancelled), error (when not done),\n"
        "latency_ms (reserve to outcome),\n"
        "shards (TP ranks it went to), transport (\"\" when nothing moved: answered cached),\n"
        "retries (reserve rounds the consumer refused as full before the outcome). Then on\n"
        "stderr: \"ect push: M moved, R retried, F failed of N items\" (moved: done on every\n"
        "shard; retried: moved after waiting for room; the consumer verifies the bytes).\n"
        "Exit status: 0 if every item was done, 1 if any failed, 2 for bad flags.\n");
}

static bool parse_shape(const char *s, uint64_t *shape, size_t *ndim) {
    *ndim = 0;
    const char *p = s;
    while (*p) {
        if (*ndim == ECT_POOL_MAX_NDIM) return false;
        char *end = NULL;
        errno = 0;
        if (*p < '0' || *p > '9') return false;
        unsigned long long v = strtoull(p, &end, 10);
        if (errno || end == p || v == 0) return false;
        shape[(*ndim)++] = v;
        if (*end == 'x' || *end == 'X' || *end == ',')
            p = end + 1;
        else if (*end == '\0')
            p = end;
        else
            return false;
        if (p != end && *p == '\0') return false; /* trailing separator */
    }
    return *ndim > 0;
}

/* Synthetic item i: cli_fill_synthetic's bytes of state (seed, i); returns
 * their checksum. */
static uint64_t fill(void *buf, uint64_t n, uint64_t seed, uint64_t i) {
    return cli_fill_synthetic_checksum(
        buf, n, seed * 0x9e3779b97f4a7c15ull ^ (i + 1) * 0xbf58476d1ce4e5b9ull);
}

static void on_release(void *user, const void *data, uint64_t nbytes) {
    (void)user;
    (void)data;
    (void)nbytes;
}

typedef struct slot {
    char tid[300];
    char hash[320];
    uint64_t checksum;
    void *data;
    void *dev;      /* --device cuda: the item's device copy (what is pushed) */
    uint64_t index; /* the item's number (transfer_id <prefix>-<index>) */
    bool reported;
} slot;

/* A step in flight: k items, queued of them reserved, got of them reported;
 * end: its --timeout, then (cancelled) the grace for the cancels. */
typedef struct push_step {
    size_t k, queued, got;
    uint64_t end;
    bool cancelled;
} push_step;

static void print_line(const slot *s, uint64_t nbytes, const ect_push_result *r) {
    cli_print_push_line(&(cli_push_line){.transfer_id = s->tid,
                                         .mm_hash = s->hash,
                                         .nbytes = nbytes,
                                         .checksum = s->checksum,
                                         .r = r});
}

/* The content index of item i: i, or with --repeat NEW:REP the index of the
 * new item whose content it repeats. */
static uint64_t content_index(uint64_t i, uint64_t rep_new, uint64_t rep_rep) {
    if (!rep_new) return i;
    uint64_t b = i / (rep_new + rep_rep), r = i % (rep_new + rep_rep);
    return b * rep_new + (r < rep_new ? r : r - rep_new);
}

/* Generates and checksums items base..base+k-1 into bank (a step's slots):
 * the synthetic bytes (or the file's), checksum, transfer_id and mm_hash.
 * False when a buffer cannot be allocated. */
static bool prepare_step(slot *bank, size_t k, uint64_t base, uint64_t nbytes, uint64_t seed,
                         const uint64_t repeat[2], const void *fdata, uint64_t fck, const char *pfx,
                         const char *dtype, const char *shape_txt, int dev) {
    for (size_t j = 0; j < k; j++) {
        slot *s = &bank[j];
        s->reported = false;
        if (!fdata) {
            if (!s->data && !(s->data = malloc(nbytes))) {
                fprintf(stderr, "ect push: out of memory for %" PRIu64 " bytes\n", nbytes);
                return false;
            }
            s->checksum =
                fill(s->data, nbytes, seed, content_index(base + j, repeat[0], repeat[1]));
            if (dev >= 0) {
                if (!s->dev && ect_mem_alloc(ECT_MEM_CUDA, dev, nbytes, &s->dev) != 0) {
                    fprintf(stderr, "ect push: --device: %s\n", ect_last_error());
                    return false;
                }
                if (ect_mem_copy(s->dev, s->data, nbytes) != 0) {
                    fprintf(stderr, "ect push: --device: %s\n", ect_last_error());
                    return false;
                }
            }
        }
        s->index = base + j;
        if (fdata) s->checksum = fck;
        snprintf(s->tid, sizeof s->tid, "%s-%" PRIu64, pfx, base + j);
        snprintf(s->hash, sizeof s->hash, "xxh3-%016" PRIx64 "-%s-%s", s->checksum,
                 strncmp(dtype, "torch.", 6) == 0 ? dtype + 6 : dtype, shape_txt);
    }
    return true;
}

/* Reserves the items of step si (prepared in its bank) and flushes them; an
 * item refused at once is reported (and counted failed) here. src: the
 * file's bytes (host or device), or NULL for each slot's own. */
static void start_step(push_step *st, ect_push_producer *p, slot *slots, uint64_t si,
                       uint64_t count, uint64_t step, size_t nbank, const char *to,
                       const uint64_t *shape, size_t ndim, const char *dtype, uint64_t nbytes,
                       const void *src, uint64_t timeout_ms, uint64_t *n_failed) {
    uint64_t base = si * step;
    slot *bank = slots + (si % nbank) * step;
    memset(st, 0, sizeof *st);
    st->k = (size_t)(count - base < step ? count - base : step);
    for (size_t j = 0; j < st->k; j++) {
        slot *s = &bank[j];
        ect_push_item it = {.transfer_id = s->tid,
                            .consumer = to,
                            .mm_hash = s->hash,
                            .shape = shape,
                            .ndim = ndim,
                            .dtype = dtype,
                            .nbytes = nbytes,
                            .data = src ? src : (s->dev ? s->dev : s->data),
                            .release = on_release};
        if (ect_push_producer_reserve(p, &it)) {
            ect_push_result r = {.status = ECT_EINVAL};
            snprintf(r.error, sizeof r.error, "%s", ect_last_error());
            print_line(s, nbytes, &r);
            s->reported = true;
            (*n_failed)++;
            continue;
        }
        st->queued++;
    }
    ect_push_producer_flush(p);
    st->end = cli_now_ms() + timeout_ms;
}

/* The unreported slot of a result's transfer_id (<pfx>-<index>) among the
 * steps in flight [oldest, next), or NULL. */
static slot *find_slot(slot *slots, const char *pfx, const char *tid, uint64_t step, size_t nbank,
                       uint64_t oldest, uint64_t next) {
    size_t lp = strlen(pfx);
    if (strncmp(tid, pfx, lp) || tid[lp] != '-' || tid[lp + 1] < '0' || tid[lp + 1] > '9')
        return NULL;
    char *end = NULL;
    errno = 0;
    unsigned long long i = strtoull(tid + lp + 1, &end, 10);
    if (errno || *end) return NULL;
    uint64_t si = i / step;
    if (si < oldest || si >= next) return NULL;
    slot *s = slots + (si % nbank) * step + i % step;
    return !s->reported && s->index == i && !strcmp(s->tid, tid) ? s : NULL;
}

/* --wait-go: the ready event (the first step's k items are reported), then
 * a line "go" on stdin. False, saying why, when stdin ends or says
 * anything else first. */
static bool await_go(size_t k) {
    printf("{\"event\":\"ready\",\"warmup_items\":%zu}\n", k);
    fflush(stdout);
    char line[16];
    if (fgets(line, sizeof line, stdin) && strcmp(line, "go\n") == 0) return true;
    fprintf(stderr, "ect push: --wait-go: stdin ended (or said something else) before \"go\"\n");
    return false;
}

static int read_file(const char *path, void **data, uint64_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "ect push: --file %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
        if (len == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "ect push: --file %s: %s\n", path, buf ? "read error" : "out of memory");
        free(buf);
        return -1;
    }
    if (len == 0) {
        fprintf(stderr, "ect push: --file %s is empty\n", path);
        free(buf);
        return -1;
    }
    *data = buf;
    *n = len;
    return 0;
}

int cmd_push(int argc, char **argv) {
    static const struct option opts[] = {{"to", required_argument, 0, 't'},
                                         {"count", required_argument, 0, 'n'},
                                         {"size", required_argument, 0, 's'},
                                         {"shape", required_argument, 0, 'S'},
                                         {"dtype", required_argument, 0, 'd'},
                                         {"file", required_argument, 0, 'f'},
                                         {"step", required_argument, 0, 'k'},
                                         {"seed", required_argument, 0, 'r'},
                                         {"id-prefix", required_argument, 0, 'p'},
                                         {"timeout", required_argument, 0, 'T'},
                                         {"control-timeout", required_argument, 0, 'C'},
                                         {"transport", required_argument, 0, 'x'},
                                         {"tp", required_argument, 0, 'P'},
                                         {"repeat", required_argument, 0, 'R'},
                                         {"push-wait", required_argument, 0, 'W'},
                                         {"device", required_argument, 0, 'D'},
                                         {"curve-keys", required_argument, 0, 'K'},
                                         {"inflight", required_argument, 0, 'F'},
                                         {"wait-go", no_argument, 0, 'G'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    const char *curve_keys = NULL;
    const char *to = NULL, *file = NULL, *dtype = "bfloat16", *prefix = NULL;
    uint64_t count = 1, size = 0, step = 0, seed = 1, timeout_ms = 120000, ctl_ms = 30000, tp = 0;
    uint64_t push_wait_ms = 60000, inflight = 1;
    const char *transport = NULL;
    int dev = -1; /* --device cuda:N: N; -1: host */
    uint64_t shape[ECT_POOL_MAX_NDIM] = {576, 4096};
    uint64_t repeat[2] = {0, 0}; /* --repeat NEW:REP; 0: every item new */
    size_t ndim = 2;
    bool have_size = false, have_shape = false, wait_go = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "t:n:s:S:d:f:k:r:p:T:C:x:P:R:W:D:F:Gh", opts, NULL)) != -1) {
        switch (c) {
        case 't': to = optarg; break;
        case 'n':
            if (!cli_parse_u64("--count", optarg, 1, 1000000, &count)) return CLI_EXIT_USAGE;
            break;
        case 's':
            if (!cli_parse_size("--size", optarg, &size)) return CLI_EXIT_USAGE;
            have_size = true;
            break;
        case 'S':
            if (!parse_shape(optarg, shape, &ndim))
                return cli_usage_error(CMD,
                                       "--shape must be 1..8 positive integers joined by 'x' "
                                       "(e.g. 576x4096), got '%s'",
                                       optarg);
            have_shape = true;
            break;
        case 'd': dtype = optarg; break;
        case 'f': file = optarg; break;
        case 'k':
            if (!cli_parse_u64("--step", optarg, 1, MAX_STEP, &step)) return CLI_EXIT_USAGE;
            break;
        case 'r':
            if (!cli_parse_u64("--seed", optarg, 0, UINT64_MAX, &seed)) return CLI_EXIT_USAGE;
            break;
        case 'p': prefix = optarg; break;
        case 'T':
            if (!cli_parse_duration_u64("--timeout", optarg, 1000, 1, 86400000, &timeout_ms))
                return CLI_EXIT_USAGE;
            break;
        case 'C':
            if (!cli_parse_duration_u64("--control-timeout", optarg, 1000, 1, 3600000, &ctl_ms))
                return CLI_EXIT_USAGE;
            break;
        case 'x':
            if (strcmp(optarg, "tcp") && strcmp(optarg, "shm") && strcmp(optarg, "ucx"))
                return cli_usage_error(CMD, "--transport must be tcp, shm or ucx, not '%s'",
                                       optarg);
            transport = optarg;
            break;
        case 'P':
            if (!cli_parse_u64("--tp", optarg, 1, 64, &tp)) return CLI_EXIT_USAGE;
            break;
        case 'F':
            if (!cli_parse_u64("--inflight", optarg, 1, 64, &inflight)) return CLI_EXIT_USAGE;
            break;
        case 'W':
            if (!cli_parse_duration_u64("--push-wait", optarg, 1000, 1, 86400000, &push_wait_ms))
                return CLI_EXIT_USAGE;
            break;
        case 'R': {
            char *colon = strchr(optarg, ':');
            if (!colon) return cli_usage_error(CMD, "--repeat NEW:REP, got '%s'", optarg);
            *colon = '\0';
            bool ok = cli_parse_u64("--repeat NEW", optarg, 1, 1000000, &repeat[0]) &&
                      cli_parse_u64("--repeat REP", colon + 1, 0, 1000000, &repeat[1]);
            *colon = ':';
            if (!ok) return CLI_EXIT_USAGE;
            if (repeat[1] > repeat[0])
                return cli_usage_error(CMD, "--repeat %s: REP must be at most NEW", optarg);
            break;
        }
        case 'D': {
            int kind, ord;
            if (ect_mem_parse_device(optarg, &kind, &ord) != 0 || kind == ECT_MEM_PINNED)
                return cli_usage_error(CMD, "--device %s: expected cpu, cuda or cuda:N", optarg);
            dev = kind == ECT_MEM_CUDA ? ord : -1;
            break;
        }
        case 'K': curve_keys = optarg; break;
        case 'G': wait_go = true; break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_bad_flag(CMD, opts);
        }
    }
    if (optind < argc) return cli_usage_error(CMD, "unexpected argument '%s'", argv[optind]);
    if (!to) return cli_usage_error(CMD, "--to HOST:PORT is required");
    char host[256];
    int port = 0;
    if (!cli_parse_hostport("--to", to, host, sizeof host, &port)) return CLI_EXIT_USAGE;
    size_t esz = ect_dtype_size(dtype);
    if (!esz) return cli_usage_error(CMD, "--dtype: unsupported torch dtype '%s'", dtype);
    if (have_size && have_shape) return cli_usage_error(CMD, "give --size or --shape, not both");
    if (prefix && (!*prefix || strlen(prefix) > 200))
        return cli_usage_error(CMD, "--id-prefix must be 1..200 characters");

    void *fdata = NULL;
    uint64_t nbytes = 0;
    if (file) {
        if (have_size) return cli_usage_error(CMD, "--size does not apply to --file");
        if (repeat[0]) return cli_usage_error(CMD, "--repeat does not apply to --file");
        if (read_file(file, &fdata, &nbytes)) return CLI_EXIT_FAIL;
        if (!have_shape) {
            if (nbytes % esz) {
                free(fdata);
                return cli_usage_error(CMD,
                                       "--file: %" PRIu64 " bytes is not a multiple of %s (%zu)",
                                       nbytes, dtype, esz);
            }
            shape[0] = nbytes / esz;
            ndim = 1;
        }
    } else if (have_size) {
        if (size == 0 || size % esz)
            return cli_usage_error(
                CMD, "--size %" PRIu64 " is not a positive multiple of %s (%zu bytes)", size, dtype,
                esz);
        shape[0] = size / esz;
        ndim = 1;
    }
    uint64_t want = esz;
    for (size_t i = 0; i < ndim; i++)
        if (!cli_mul_u64(want, shape[i], &want)) {
            free(fdata);
            return cli_usage_error(CMD, "--shape: the size overflows");
        }
    if (file && want != nbytes) {
        free(fdata);
        return cli_usage_error(
            CMD, "--shape x --dtype is %" PRIu64 " bytes but --file has %" PRIu64, want, nbytes);
    }
    nbytes = want;
    if (!step) step = count < MAX_STEP ? count : MAX_STEP;
    if (step > count) step = count;
    /* The next step is prepared (synthetic bytes generated) while the steps
     * in flight move: a bank of step slots per step in flight and one more,
     * as many as there are steps at most. */
    uint64_t nsteps_all = (count + step - 1) / step;
    size_t nbank = (size_t)(nsteps_all < inflight + 1 ? nsteps_all : inflight + 1);
    if (!file && nbytes * step * nbank > (16ull << 30)) {
        free(fdata);
        return cli_usage_error(CMD,
                               "--step x item size x %zu exceeds 16 GiB (the steps in flight and "
                               "the next one, generated meanwhile); use a smaller --step or "
                               "--inflight",
                               nbank);
    }

    char pfx[256];
    if (prefix)
        snprintf(pfx, sizeof pfx, "%s", prefix);
    else {
        char rid[33];
        cli_random_id(rid);
        snprintf(pfx, sizeof pfx, "push-%d-%.8s", (int)getpid(), rid);
    }
    char shape_txt[256] = "";
    for (size_t i = 0; i < ndim; i++)
        snprintf(shape_txt + strlen(shape_txt), sizeof shape_txt - strlen(shape_txt), "%s%" PRIu64,
                 i ? "x" : "", shape[i]);

    ect_push_producer_opts po;
    ect_push_producer_opts_init(&po);
    po.curve_keys = curve_keys;
    po.staging_size = 0; /* sources are borrowed: each step's buffers outlive the step */
    po.control_timeout_ms = (int)ctl_ms;
    po.transport = transport;
    po.expect_shards = (uint32_t)tp; /* checked at discovery: nothing reserved on a mismatch */
    po.push_wait_ms = push_wait_ms;
    ect_push_producer *p = NULL;
    if (ect_push_producer_open(&po, &p)) {
        fprintf(stderr, "ect push: %s\n", ect_last_error());
        free(fdata);
        return CLI_EXIT_FAIL;
    }
    slot *slots = calloc(nbank * step, sizeof *slots);
    size_t rcap = (size_t)(step * inflight < MAX_STEP ? step * inflight : MAX_STEP);
    ect_push_result *res = calloc(rcap, sizeof *res);
    push_step *win = calloc(inflight, sizeof *win);
    if (!slots || !res || !win) {
        fprintf(stderr, "ect push: out of memory\n");
        ect_push_producer_close(p);
        free(fdata);
        free(slots);
        free(res);
        free(win);
        return CLI_EXIT_FAIL;
    }
    uint64_t n_done = 0, n_failed = 0, n_retried = 0;
    uint64_t fck = file ? cli_checksum(fdata, nbytes) : 0;
    int rc = CLI_EXIT_OK;
    void *fdev = NULL; /* --file with --device: the file's bytes on the device */
    if (file && dev >= 0 &&
        (ect_mem_alloc(ECT_MEM_CUDA, dev, nbytes, &fdev) != 0 ||
         ect_mem_copy(fdev, fdata, nbytes) != 0)) {
        fprintf(stderr, "ect push: --device: %s\n", ect_last_error());
        rc = CLI_EXIT_FAIL;
    }
    if (rc == CLI_EXIT_OK && !prepare_step(slots, (size_t)step, 0, nbytes, seed, repeat, fdata, fck,
                                           pfx, dtype, shape_txt, dev))
        rc = CLI_EXIT_FAIL;
    /* win[s % inflight]: step s while it is in flight; the window is
     * [oldest, next) */
    uint64_t nsteps = (count + step - 1) / step, oldest = 0, next = 0;
    bool stop_starting = rc != CLI_EXIT_OK, gave_up = false;
    bool held = wait_go; /* --wait-go: the first step alone, then wait for the go */
    while (!gave_up && (oldest < next || (!stop_starting && (next < nsteps || held)))) {
        if (held && next > 0 && oldest == next) { /* the first step is reported */
            held = false;
            if (!await_go(win[0].k)) {
                rc = CLI_EXIT_FAIL;
                break;
            }
        }
        /* start steps while the window has room */
        while (!stop_starting && next < nsteps && next - oldest < inflight && !(held && next > 0)) {
            start_step(&win[next % inflight], p, slots, next, count, step, nbank, to, shape, ndim,
                       dtype, nbytes, file ? (fdev ? fdev : fdata) : NULL, timeout_ms, &n_failed);
            next++;
            /* while the window moves, generate the next step into its bank
             * (free: its previous user, step next - nbank, left the window) */
            if (next < nsteps) {
                uint64_t nb = next * step;
                size_t nk = (size_t)(count - nb < step ? count - nb : step);
                if (!prepare_step(slots + (next % nbank) * step, nk, nb, nbytes, seed, repeat,
                                  fdata, fck, pfx, dtype, shape_txt, dev)) {
                    rc = CLI_EXIT_FAIL; /* after the results of the steps in flight */
                    stop_starting = true;
                }
            }
        }
        if (oldest == next) break;
        /* the earliest deadline of the steps in flight bounds the wait */
        uint64_t now = cli_now_ms(), soon = now + 200;
        for (uint64_t si = oldest; si < next; si++) {
            push_step *st = &win[si % inflight];
            if (st->got < st->queued && st->end < soon) soon = st->end;
        }
        fflush(stdout); /* the lines so far go out before the wait, in one write */
        size_t n = ect_push_producer_poll(p, res, rcap, (int)(soon > now ? soon - now : 0));
        for (size_t i = 0; i < n; i++) {
            slot *sl = find_slot(slots, pfx, res[i].transfer_id, step, nbank, oldest, next);
            if (!sl) continue;
            push_step *st = &win[sl->index / step % inflight];
            if (st->cancelled && res[i].status == ECT_ECANCELED)
                snprintf(res[i].error, sizeof res[i].error,
                         "timed out after %" PRIu64 " ms (--timeout)", timeout_ms);
            print_line(sl, nbytes, &res[i]);
            sl->reported = true;
            if (res[i].status == 0) {
                n_done++;
                n_retried += res[i].retries > 0;
            } else {
                n_failed++;
            }
            st->got++;
        }
        /* steps past their --timeout: cancel what is left; past the grace
         * after that, give up (their sources may still be in use: nothing
         * more is started and no buffer is reused) */
        now = cli_now_ms();
        for (uint64_t si = oldest; si < next && !gave_up; si++) {
            push_step *st = &win[si % inflight];
            if (st->got >= st->queued || now < st->end) continue;
            slot *bank = slots + (si % nbank) * step;
            if (!st->cancelled) {
                for (size_t j = 0; j < st->k; j++)
                    if (!bank[j].reported) ect_push_producer_cancel(p, bank[j].tid);
                st->cancelled = true;
                st->end = now + 2 * ctl_ms + 1000;
                continue;
            }
            fprintf(stderr, "ect push: %zu items of the step did not finish; giving up\n",
                    st->queued - st->got);
            gave_up = true;
        }
        if (gave_up) {
            for (uint64_t si = oldest; si < next; si++) {
                push_step *st = &win[si % inflight];
                n_failed += st->queued - st->got;
            }
            break;
        }
        while (oldest < next && win[oldest % inflight].got >= win[oldest % inflight].queued)
            oldest++;
    }
    fflush(stdout);
    ect_push_producer_close(p);
    for (size_t j = 0; j < nbank * step; j++) {
        free(slots[j].data);
        ect_mem_free(ECT_MEM_CUDA, slots[j].dev);
    }
    ect_mem_free(ECT_MEM_CUDA, fdev);
    free(slots);
    free(res);
    free(win);
    free(fdata);
    fprintf(stderr,
            "ect push: %" PRIu64 " moved, %" PRIu64 " retried, %" PRIu64 " failed of %" PRIu64
            " items\n",
            n_done, n_retried, n_failed, count);
    if (rc == CLI_EXIT_OK && (n_failed || n_done < count)) rc = CLI_EXIT_FAIL;
    return rc;
}
