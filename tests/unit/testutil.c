/* testutil — see testutil.h. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

void test_assert_err(int rc, int expected, const char *msg_part, const char *file, int line) {
    if (rc != expected) {
        print_error("%s:%d: expected %d (%s), got %d (%s); last error: %s\n", file, line, expected,
                    ect_strerror(expected), rc, ect_strerror(rc), ect_last_error());
        _fail(file, line);
    }
    if (msg_part && !strstr(ect_last_error(), msg_part)) {
        print_error("%s:%d: error text '%s' does not mention '%s'\n", file, line, ect_last_error(),
                    msg_part);
        _fail(file, line);
    }
}

uint64_t test_rand(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void test_fill_pattern(void *buf, size_t n, uint64_t seed) {
    unsigned char *p = buf;
    uint64_t st = seed, v = 0;
    for (size_t i = 0; i < n; i++) {
        if ((i & 7) == 0) v = test_rand(&st);
        p[i] = (unsigned char)(v >> ((i & 7) * 8));
    }
}

int test_check_pattern(const void *buf, size_t n, uint64_t seed) {
    const unsigned char *p = buf;
    uint64_t st = seed, v = 0;
    for (size_t i = 0; i < n; i++) {
        if ((i & 7) == 0) v = test_rand(&st);
        if (p[i] != (unsigned char)(v >> ((i & 7) * 8))) return 0;
    }
    return 1;
}

const char *test_protocol_md(void) {
    char path[1024];
    const char *src = getenv("ECT_SOURCE_DIR");
    if (src) {
        snprintf(path, sizeof path, "%s/docs/PROTOCOL.md", src);
    } else { /* run by hand: find the docs from this file's path */
        snprintf(path, sizeof path, "%s", __FILE__);
        char *cut = strstr(path, "tests/unit/");
        assert_non_null(cut);
        snprintf(cut, sizeof path - (size_t)(cut - path), "docs/PROTOCOL.md");
    }
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    static char doc[256 * 1024];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = '\0';
    return doc;
}

void test_accept_key(const char *dir, const char *name, const char *from) {
    char src[512], dst[512], buf[64];
    snprintf(src, sizeof src, "%s/self.public", from);
    snprintf(dst, sizeof dst, "%s/accept/%s.public", dir, name);
    FILE *f = fopen(src, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    f = fopen(dst, "w");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}
