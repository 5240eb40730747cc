/* `ect push`'s per-item line printed directly (src/cli/json_out.c, compiled
 * in here) is byte for byte jansson's line for it, and a line with a string
 * that needs an escape is left to jansson; reals print as jansson prints
 * them. */
#include <float.h>
#include <string.h>

#include "testutil.h"

#include "cli/json_out.c"

/* jansson's text for json_real(v) in a compact dump. */
static void jansson_real(double v, char *buf, size_t cap) {
    json_t *a = json_array();
    json_array_append_new(a, json_real(v));
    char *t = json_dumps(a, JSON_COMPACT);
    assert_non_null(t);
    size_t n = strlen(t);
    assert_true(n >= 2 && n - 2 < cap);
    memcpy(buf, t + 1, n - 2); /* inside the brackets */
    buf[n - 2] = '\0';
    free(t);
    json_decref(a);
}

static void test_reals_as_jansson(void **state) {
    (void)state;
    double vals[] = {0.0,      -0.0,   1.0,   3.891234, 0.1,     1e-7,    1.5e-5,
                     2.5e17,   1e22,   1e300, -1e-300,  DBL_MIN, DBL_MAX, 1.0 / 3,
                     123456.0, 0.0001, 42.5,  1e16,     1e15,    -7.0};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < CLI_ARRAY_LEN(vals) + 2000; i++) {
        double v;
        if (i < CLI_ARRAY_LEN(vals)) {
            v = vals[i];
        } else { /* latencies in ns / 1e6, and arbitrary bit patterns */
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            if (i % 2) {
                v = (double)(x % 100000000000ull) / 1e6;
            } else {
                memcpy(&v, &x, sizeof v);
                if (!isfinite(v)) continue;
            }
        }
        char ours[64], theirs[64];
        assert_true(cli_json_real(ours, sizeof ours, v) == (int)strlen(ours));
        jansson_real(v, theirs, sizeof theirs);
        assert_string_equal(ours, theirs);
    }
    char b[64];
    assert_int_equal(cli_json_real(b, sizeof b, NAN), -1);
    assert_int_equal(cli_json_real(b, sizeof b, INFINITY), -1);
    assert_int_equal(cli_json_real(b, 4, 1.0 / 3), -1); /* short buffer */
}

static void test_push_lines_as_jansson(void **state) {
    (void)state;
    ect_push_result rs[4];
    memset(rs, 0, sizeof rs);
    rs[0] = (ect_push_result){.status = 0, .latency_ns = 3891234, .shards = 1, .retries = 0};
    snprintf(rs[0].transport, sizeof rs[0].transport, "tcp");
    rs[1] = (ect_push_result){
        .status = ECT_ECANCELED, .latency_ns = 1000000, .shards = 2, .retries = 7};
    snprintf(rs[1].error, sizeof rs[1].error, "cancelled by the consumer's scheduler");
    snprintf(rs[1].transport, sizeof rs[1].transport, "shm");
    rs[2] = (ect_push_result){.status = ECT_EIO, .latency_ns = 0, .shards = 0, .retries = 1};
    snprintf(rs[2].error, sizeof rs[2].error, "pool \"full\"\n"); /* needs escapes */
    rs[3] = (ect_push_result){.status = ECT_EIO, .latency_ns = UINT64_MAX, .shards = 64};
    snprintf(rs[3].error, sizeof rs[3].error, "write failed");
    snprintf(rs[3].transport, sizeof rs[3].transport, "ucx");
    const char *ids[] = {"push-1-ab-7", "t\xc3\xa9", "a/b", "x"};
    for (size_t i = 0; i < CLI_ARRAY_LEN(rs); i++)
        for (size_t k = 0; k < CLI_ARRAY_LEN(ids); k++) {
            cli_push_line p = {.transfer_id = ids[k],
                               .mm_hash = "xxh3-00ff-bfloat16-16x4096",
                               .nbytes = 131072 + i,
                               .checksum = 0x0123456789abcdefull >> i,
                               .r = &rs[i]};
            char *want = push_line_jansson(&p);
            assert_non_null(want);
            char got[2048];
            bool direct = push_line_direct(&p, got, sizeof got);
            bool plain = k != 1 && i != 2; /* UTF-8 or an escape: jansson's */
            assert_true(direct == plain);
            if (direct) assert_string_equal(got, want);
            free(want);
        }
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_reals_as_jansson),
                                       cmocka_unit_test(test_push_lines_as_jansson)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
