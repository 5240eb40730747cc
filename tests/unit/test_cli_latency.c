/* The CLI's one percentile definition (src/cli/latency.c, compiled in here):
 * nearest rank, as docs/BENCHMARKS.md says every p50 / p99 is computed. */
#include <stdlib.h>

#include "testutil.h"

#include "cli/clock.c"
#include "cli/latency.c"

static void test_nearest_rank(void **state) {
    (void)state;
    uint64_t v[100];
    for (size_t i = 0; i < 100; i++) v[i] = 100 - i; /* 100 .. 1, sorted below */
    cli_sort_u64(v, 100);
    assert_int_equal(v[0], 1);
    const struct {
        size_t n;
        unsigned p;
        uint64_t want;
    } rows[] = {
        {100, 99, 99}, {100, 50, 50}, {100, 100, 100}, {100, 0, 1}, {100, 1, 1},
        {10, 99, 10},  {10, 90, 9},   {10, 50, 5},     {4, 50, 2},  {4, 51, 3},
        {2, 50, 1},    {1, 99, 1},    {1, 0, 1},       {3, 34, 2},  {3, 33, 1},
    };
    for (size_t i = 0; i < CLI_ARRAY_LEN(rows); i++) {
        if (cli_pct_u64(v, rows[i].n, rows[i].p) != rows[i].want)
            fail_msg("p%u of 1..%zu: %llu, want %llu", rows[i].p, rows[i].n,
                     (unsigned long long)cli_pct_u64(v, rows[i].n, rows[i].p),
                     (unsigned long long)rows[i].want);
    }
    assert_int_equal(cli_pct_u64(v, 0, 50), 0); /* nothing measured */
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_nearest_rank)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
