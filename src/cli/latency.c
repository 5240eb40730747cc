/* latency — sorting and percentiles of per-iteration times for the benches. */
#include <stdlib.h>

#include "cli/cli.h"

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void cli_sort_u64(uint64_t *v, size_t n) { qsort(v, n, sizeof *v, cmp_u64); }

uint64_t cli_pct_u64(const uint64_t *sorted, size_t n, unsigned p) {
    size_t i = n * p / 100;
    return sorted[i < n ? i : n - 1];
}
