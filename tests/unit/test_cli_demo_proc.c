/* `ect demo`'s splitting of its children's output into lines
 * (src/cli/demo_proc.c's demo_feed, compiled in here): however the bytes
 * come in chunks, the lines handed over are those of a byte-at-a-time
 * reference (what the demo did before it scanned for newlines): a line is
 * its bytes up to a newline, a longer one than LINE_MAX_BYTES comes in
 * pieces of that size, and what follows the last newline waits. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#include "cli/clock.c"
#include "cli/demo_proc.c"

typedef struct lines {
    char **v;
    size_t n;
    int child, stream;
} lines;

static void push_line(lines *l, const char *s) {
    l->v = realloc(l->v, (l->n + 1) * sizeof *l->v);
    assert_non_null(l->v);
    l->v[l->n] = strdup(s);
    assert_non_null(l->v[l->n]);
    l->n++;
}

static void collect(void *user, int child, bool is_stderr, char *line) {
    lines *l = user;
    assert_int_equal(child, l->child);
    assert_int_equal(is_stderr, l->stream == 1);
    push_line(l, line);
}

static void lines_free(lines *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i]);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* The reference: one byte at a time. */
static void reference(const char *data, size_t n, lines *out) {
    char *cur = malloc(LINE_MAX_BYTES + 1);
    assert_non_null(cur);
    size_t len = 0;
    for (size_t k = 0; k < n; k++) {
        if (data[k] == '\n' || len == LINE_MAX_BYTES) {
            cur[len] = '\0';
            len = 0;
            push_line(out, cur);
            if (data[k] == '\n') continue;
        }
        cur[len++] = data[k];
    }
    free(cur);
}

/* Feeds data to child 1's stream in chunks of the sizes cut[] gives in turn. */
static void feed(const char *data, size_t n, const size_t *cut, size_t ncut, int stream,
                 lines *out) {
    demo_procs p;
    memset(&p, 0, sizeof p);
    p.on_line = collect;
    p.user = out;
    out->child = 1;
    out->stream = stream;
    char *copy = malloc(n ? n : 1); /* demo_feed writes into what it is given */
    assert_non_null(copy);
    memcpy(copy, data, n);
    for (size_t off = 0, i = 0; off < n; i++) {
        size_t k = cut[i % ncut];
        if (k > n - off) k = n - off;
        demo_feed(&p, 1, stream, copy + off, k);
        off += k;
    }
    free(copy);
    free(p.c[1].buf[stream]);
}

static void same_lines(const lines *a, const lines *b) {
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) assert_string_equal(a->v[i], b->v[i]);
}

static void test_every_cut_gives_the_same_lines(void **state) {
    (void)state;
    const char text[] = "{\"a\":1}\n\n{\"transfer_id\":\"t-1\"}\nlast without newline";
    size_t n = sizeof text - 1;
    lines want = {0};
    reference(text, n, &want);
    assert_int_equal(want.n, 3);
    assert_string_equal(want.v[1], "");
    for (size_t first = 1; first <= n; first++)
        for (size_t rest = 1; rest <= 3; rest++) {
            size_t cut[] = {first, rest};
            lines got = {0};
            feed(text, n, cut, 2, 0, &got);
            same_lines(&got, &want);
            lines_free(&got);
        }
    lines_free(&want);
}

static void test_long_lines_come_in_pieces(void **state) {
    (void)state;
    /* lines of 1 MiB - 1, 1 MiB, 1 MiB + 1, 2 MiB, 2 MiB + 5, then a short
     * one and an unfinished one: the pieces and where they end */
    const size_t M = LINE_MAX_BYTES, lens[] = {M - 1, M, M + 1, 2 * M, 2 * M + 5, 3};
    size_t n = 0;
    for (size_t i = 0; i < CLI_ARRAY_LEN(lens); i++) n += lens[i] + 1;
    n += M + 7; /* unfinished: one piece handed over, 7 bytes wait */
    char *data = malloc(n);
    assert_non_null(data);
    size_t off = 0;
    for (size_t i = 0; i < CLI_ARRAY_LEN(lens); i++) {
        for (size_t k = 0; k < lens[i]; k++) data[off + k] = (char)('a' + (i + k) % 26);
        off += lens[i];
        data[off++] = '\n';
    }
    memset(data + off, 'z', M + 7);
    lines want = {0};
    reference(data, n, &want);
    /* 1 + 1 + 2 + 2 + 3 + 1 + 1 */
    assert_int_equal(want.n, 11);
    const size_t chunkings[][3] = {{65536, 65536, 65536}, {n, n, n}, {1000, 7, 65536 + 1}};
    for (size_t c = 0; c < CLI_ARRAY_LEN(chunkings); c++) {
        lines got = {0};
        feed(data, n, chunkings[c], 3, 1, &got);
        same_lines(&got, &want);
        lines_free(&got);
    }
    lines_free(&want);
    free(data);
}

static void test_stderr_lines_are_kept_in_the_tail(void **state) {
    (void)state;
    demo_procs p;
    memset(&p, 0, sizeof p);
    lines got = {0};
    p.on_line = collect;
    p.user = &got;
    got.child = 0;
    got.stream = 1;
    char text[] = "first\nsecond\nthird";
    demo_feed(&p, 0, 1, text, strlen(text));
    assert_int_equal(got.n, 2);
    assert_string_equal(p.c[0].errtail, "first\nsecond\n");
    free(p.c[0].buf[1]);
    lines_free(&got);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_every_cut_gives_the_same_lines),
                                       cmocka_unit_test(test_long_lines_come_in_pieces),
                                       cmocka_unit_test(test_stderr_lines_are_kept_in_the_tail)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
