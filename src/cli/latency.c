/* latency — sorting and percentiles of per-item or per-iteration times, the
 * one percentile definition of every command (the benches and `ect demo`):
 * nearest rank. The p-th percentile of n sorted values is the smallest value
 * that at least p % of them do not exceed: v[ceil(p / 100 x n) - 1] (p50 of
 * 4 values is the 2nd, p99 of 100 the 99th, p99 of 10 the 10th). */
#include <stdlib.h>

#include "cli/cli.h"

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void cli_sort_u64(uint64_t *v, size_t n) { qsort(v, n, sizeof *v, cmp_u64); }

uint64_t cli_pct_u64(const uint64_t *sorted, size_t n, unsigned p) {
    if (n == 0) return 0;
    size_t rank = (n * p + 99) / 100; /* ceil(n x p / 100), in integers */
    return sorted[rank == 0 ? 0 : rank > n ? n - 1 : rank - 1];
}

void cli_summarize(uint64_t *lat, size_t n, uint64_t bytes, uint64_t total_ns, cli_timing *s) {
    cli_sort_u64(lat, n);
    s->gbps = (double)bytes * (double)n / (double)total_ns;
    s->p50_us = (double)cli_pct_u64(lat, n, 50) / 1000.0;
    s->p99_us = (double)cli_pct_u64(lat, n, 99) / 1000.0;
    s->ok = true;
}

int cli_timed(cli_iter_fn fn, void *ctx, uint64_t bytes, double secs, cli_timing *s) {
    uint64_t *lat = malloc(CLI_MAX_ITERS * sizeof *lat);
    int rc = lat ? 0 : -1;
    for (int w = 0; w < 2 && !rc; w++) rc = fn(ctx) ? -1 : 0;
    size_t n = 0;
    uint64_t t0 = cli_now_ns(), budget = (uint64_t)(secs * 1e9);
    while (!rc && n < CLI_MAX_ITERS && (n < 5 || cli_now_ns() - t0 < budget)) {
        uint64_t a = cli_now_ns();
        rc = fn(ctx) ? -1 : 0;
        lat[n++] = cli_now_ns() - a;
    }
    if (!rc) cli_summarize(lat, n, bytes, cli_now_ns() - t0, s);
    free(lat);
    return rc;
}

int cli_write_iter(void *ctx) {
    cli_write_ctx *c = ctx;
    return ect_xport_write_batch(c->x, c->session, &c->w, 1, NULL);
}

size_t cli_round_count(double secs) {
    size_t n = (size_t)(secs * 1e9 / (double)CLI_ROUND_NS + 0.5);
    return n < CLI_MIN_ROUNDS ? CLI_MIN_ROUNDS : n;
}

int cli_round(cli_iter_fn fn, void *ctx, uint64_t dur_ns, size_t most, cli_rounds *r) {
    uint64_t t0 = cli_now_ns();
    size_t calls = 0;
    do {
        if (r->n == r->cap) break;
        uint64_t a = cli_now_ns();
        if (fn(ctx) != 0) return -1;
        uint64_t d = cli_now_ns() - a;
        r->lat[r->n++] = d;
        r->busy_ns += d;
    } while (++calls < most && cli_now_ns() - t0 < dur_ns);
    r->rounds++;
    return 0;
}

void cli_rounds_summarize(cli_rounds *r, uint64_t bytes, cli_timing *s) {
    cli_sort_u64(r->lat, r->n);
    s->gbps = r->busy_ns ? (double)bytes * (double)r->n / (double)r->busy_ns : 0;
    s->p50_us = (double)cli_pct_u64(r->lat, r->n, 50) / 1000.0;
    s->p99_us = (double)cli_pct_u64(r->lat, r->n, 99) / 1000.0;
    s->rounds = r->rounds;
    s->ok = r->n > 0;
}

int cli_timed_pair(cli_iter_fn fa, void *ca, uint64_t bytes_a, cli_iter_fn fb, void *cb,
                   uint64_t bytes_b, double secs, cli_timing *sa, cli_timing *sb) {
    cli_rounds ra = {.lat = malloc(CLI_MAX_ITERS * sizeof(uint64_t)), .cap = CLI_MAX_ITERS};
    cli_rounds rb = {.lat = malloc(CLI_MAX_ITERS * sizeof(uint64_t)), .cap = CLI_MAX_ITERS};
    int rc = ra.lat && rb.lat ? 0 : -1;
    for (int w = 0; w < 2 && !rc; w++) rc = fa(ca) || fb(cb) ? -1 : 0;
    size_t rounds = cli_round_count(secs), most = CLI_MAX_ITERS / rounds;
    uint64_t dur = (uint64_t)(secs * 1e9) / rounds;
    /* the rounds, then more (a round each) until each kind made 5 calls */
    for (size_t i = 0; !rc && (i < rounds || ra.n < 5 || rb.n < 5); i++) {
        rc = cli_round(fa, ca, dur, most, &ra);
        if (!rc) rc = cli_round(fb, cb, dur, most, &rb);
        if (ra.n == ra.cap || rb.n == rb.cap) break;
    }
    if (!rc) {
        cli_rounds_summarize(&ra, bytes_a, sa);
        cli_rounds_summarize(&rb, bytes_b, sb);
    }
    free(ra.lat);
    free(rb.lat);
    return rc;
}
