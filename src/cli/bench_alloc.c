/*
 * bench_alloc — `ect bench alloc`: allocate + free pairs per second of the
 * pool's allocator (an augmented treap in the library, reached as users
 * reach it: ect_pool_alloc + ect_pool_free, behind the pool's mutex) at 10,
 * 1,000 and 100,000 fragments, beside a plain linear first-fit free list
 * behind a mutex of its own, measured in the same run on the same state.
 *
 * State: n free holes of one alignment unit, each between two allocated units,
 * then one large free tail. Two workloads:
 *   skip  each request is two units, so first fit must pass every hole and
 *         take the tail: the linear scan visits all n holes (twice: the free
 *         walks to the tail too); the tree descends O(log n) nodes.
 *   head  each request is one unit and fits the first hole: the linear list's
 *         best case, which shows the tree's constant overhead.
 */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ectransfer.h"

#define UNIT UINT64_C(256)
#define CAPACITY (UINT64_C(256) << 20) /* mapped, never touched */

/* ---- the baseline: a textbook first-fit free list, sorted by offset. */
typedef struct lnode {
    uint64_t off, size;
    struct lnode *next;
} lnode;

/* First fit: the first block in offset order that is large enough. */
static int lin_alloc(lnode **head, uint64_t n, uint64_t *off) {
    for (lnode **pp = head; *pp; pp = &(*pp)->next) {
        lnode *b = *pp;
        if (b->size < n) continue;
        *off = b->off;
        b->off += n;
        b->size -= n;
        if (b->size == 0) {
            *pp = b->next;
            free(b);
        }
        return 0;
    }
    return -1;
}

/* Walks to the insertion point and coalesces with both neighbours. */
static int lin_free(lnode **head, uint64_t off, uint64_t n) {
    lnode *prev = NULL, *cur = *head;
    while (cur && cur->off < off) {
        prev = cur;
        cur = cur->next;
    }
    if (prev && prev->off + prev->size == off) {
        prev->size += n;
        if (cur && prev->off + prev->size == cur->off) {
            prev->size += cur->size;
            prev->next = cur->next;
            free(cur);
        }
        return 0;
    }
    if (cur && off + n == cur->off) {
        cur->off = off;
        cur->size += n;
        return 0;
    }
    lnode *b = malloc(sizeof *b);
    if (!b) return -1;
    b->off = off;
    b->size = n;
    b->next = cur;
    if (prev)
        prev->next = b;
    else
        *head = b;
    return 0;
}

static void lin_destroy(lnode *h) {
    while (h) {
        lnode *nx = h->next;
        free(h);
        h = nx;
    }
}

/* n holes of one unit at offsets 0, 2, 4, ... units, then the free tail. */
static lnode *lin_setup(uint64_t holes) {
    lnode *head = NULL, **tail = &head;
    for (uint64_t i = 0; i <= holes; i++) {
        lnode *b = malloc(sizeof *b);
        if (!b) {
            lin_destroy(head);
            return NULL;
        }
        b->off = 2 * i * UNIT;
        b->size = i < holes ? UNIT : CAPACITY - b->off;
        b->next = NULL;
        *tail = b;
        tail = &b->next;
    }
    return head;
}

static pthread_mutex_t lin_mu = PTHREAD_MUTEX_INITIALIZER;

static ect_pool *tree_setup(uint64_t holes) {
    ect_pool_opts o;
    ect_pool_opts_init(&o);
    o.capacity = CAPACITY;
    o.alignment = UNIT;
    ect_pool *p;
    if (ect_pool_open(&o, &p)) return NULL;
    uint64_t off;
    for (uint64_t i = 0; i < 2 * holes; i++)
        if (ect_pool_alloc(p, UNIT, &off)) goto fail;
    for (uint64_t i = 0; i < holes; i++)
        if (ect_pool_free(p, 2 * i * UNIT)) goto fail;
    return p;
fail:
    ect_pool_close(p);
    return NULL;
}

static uint64_t fragments(ect_pool *p) {
    ect_pool_stat st;
    ect_pool_stats(p, &st);
    return st.fragments;
}

typedef struct result {
    const char *workload;
    uint64_t fragments;
    double tree_ops, lin_ops;
} result;

/* Runs alloc+free pairs in batches until min_ns have passed; returns pairs/s,
 * or -1 on a failed call. */
static double time_tree(ect_pool *a, uint64_t n, uint64_t min_ns) {
    uint64_t pairs = 0, t0 = cli_now_ns(), el;
    do {
        for (int i = 0; i < 64; i++) {
            uint64_t off;
            if (ect_pool_alloc(a, n, &off) || ect_pool_free(a, off)) return -1;
        }
        pairs += 64;
        el = cli_now_ns() - t0;
    } while (el < min_ns);
    return (double)pairs * 1e9 / (double)el;
}

static double time_lin(lnode **head, uint64_t n, uint64_t min_ns) {
    uint64_t pairs = 0, t0 = cli_now_ns(), el;
    do {
        uint64_t off;
        pthread_mutex_lock(&lin_mu);
        int rc = lin_alloc(head, n, &off);
        pthread_mutex_unlock(&lin_mu);
        pthread_mutex_lock(&lin_mu);
        if (!rc) rc = lin_free(head, off, n);
        pthread_mutex_unlock(&lin_mu);
        if (rc) return -1;
        pairs++;
        el = cli_now_ns() - t0;
    } while (el < min_ns);
    return (double)pairs * 1e9 / (double)el;
}

static int measure(uint64_t holes, const char *workload, uint64_t min_ns, result *r) {
    uint64_t n = strcmp(workload, "skip") == 0 ? 2 * UNIT : UNIT;
    ect_pool *a = tree_setup(holes);
    lnode *head = lin_setup(holes);
    if (!a || !head) {
        ect_pool_close(a);
        lin_destroy(head);
        return -1;
    }
    uint64_t frag = fragments(a);
    r->workload = workload;
    r->fragments = frag;
    r->tree_ops = time_tree(a, n, min_ns);
    r->lin_ops = time_lin(&head, n, min_ns);
    /* Both must end where they began: the same free blocks. */
    int rc = (r->tree_ops < 0 || r->lin_ops < 0 || fragments(a) != frag) ? -1 : 0;
    ect_pool_close(a);
    lin_destroy(head);
    return rc;
}

static void help(void) {
    printf("usage: ect bench alloc [--json] [--ms N]\n\n"
           "Allocate + free pairs per second of the pool's allocator (first fit over an\n"
           "offset tree; ect_pool_alloc + ect_pool_free, behind the pool's mutex) at 10,\n"
           "1,000 and 100,000 free fragments, beside a plain linear first-fit free list\n"
           "(behind a mutex too) measured in the same run, and the ratio tree/linear.\n"
           "Workloads: 'skip' requests 512 B past n free 256 B holes to the free tail\n"
           "(the linear list's worst case); 'head' requests 256 B that fit the first hole\n"
           "(its best case).\n\n"
           "  --json   one JSON object on stdout instead of the table\n"
           "  --ms N   time each measurement for at least N (bare: ms, or 2s; up to 60s; default "
           "300)\n"
           "  --help   this text\n");
}

int bench_alloc(int argc, char **argv) {
    static const struct option opts[] = {{"json", no_argument, 0, 'j'},
                                         {"ms", required_argument, 0, 'm'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    bool json = false;
    uint64_t ms = 300;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'j': json = true; break;
        case 'm':
            if (!cli_parse_duration_u64("--ms", optarg, 1, 1, 60000, &ms)) return CLI_EXIT_USAGE;
            break;
        case 'h': help(); return CLI_EXIT_OK;
        default: return cli_usage_error("bench alloc", "accepted flags: --json, --ms N, --help");
        }
    }
    if (optind < argc)
        return cli_usage_error("bench alloc", "unexpected argument '%s'", argv[optind]);

    static const uint64_t holes[] = {10, 1000, 100000};
    static const char *const workloads[] = {"skip", "head"};
    result res[CLI_ARRAY_LEN(holes) * CLI_ARRAY_LEN(workloads)];
    size_t nres = 0;
    for (size_t w = 0; w < CLI_ARRAY_LEN(workloads); w++)
        for (size_t i = 0; i < CLI_ARRAY_LEN(holes); i++) {
            if (measure(holes[i], workloads[w], ms * 1000000, &res[nres])) {
                fprintf(stderr, "ect bench alloc: measurement failed (out of memory?)\n");
                return CLI_EXIT_FAIL;
            }
            nres++;
        }
    if (json) {
        printf("{\"bench\":\"alloc\",\"unit_bytes\":%" PRIu64 ",\"ms\":%" PRIu64 ",\"results\":[",
               UNIT, ms);
        for (size_t i = 0; i < nres; i++)
            printf("%s{\"workload\":\"%s\",\"fragments\":%" PRIu64
                   ",\"tree_ops_per_s\":%.17g,\"linear_ops_per_s\":%.17g,\"ratio\":%.17g}",
                   i ? "," : "", res[i].workload, res[i].fragments, res[i].tree_ops, res[i].lin_ops,
                   res[i].tree_ops / res[i].lin_ops);
        printf("]}\n");
        return CLI_EXIT_OK;
    }
    printf("alloc: allocate + free pairs per second (tree = ect_pool_alloc/free, linear = plain "
           "first-fit list)\n");
    printf("%-9s %10s %14s %14s %10s\n", "workload", "fragments", "tree pairs/s", "linear pairs/s",
           "tree/lin");
    for (size_t i = 0; i < nres; i++)
        printf("%-9s %10" PRIu64 " %14.0f %14.0f %10.2f\n", res[i].workload, res[i].fragments,
               res[i].tree_ops, res[i].lin_ops, res[i].tree_ops / res[i].lin_ops);
    return CLI_EXIT_OK;
}
