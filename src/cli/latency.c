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
