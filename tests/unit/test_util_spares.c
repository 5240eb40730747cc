/*
 * Tests for util/spares, the bounded stack of freed blocks that the
 * reservation table, the resident cache and the control server keep so that
 * a per-item block costs no malloc: last in first out, at most max kept (the
 * rest freed: the sanitizer suite's leak check fails otherwise), the link in
 * the named member only (a capacity kept across reuse survives), and clear
 * frees every spare.
 */
#include <stdlib.h>

#include "testutil.h"
#include "util/spares.h"

typedef struct blk {
    size_t cap;        /* kept across reuse, as rsv_buf's hash_cap */
    struct blk *other; /* another pointer member: must not be the link */
    struct blk *link;
    char body[24];
} blk;

static blk *blk_new(size_t cap) {
    blk *b = calloc(1, sizeof *b);
    assert_non_null(b);
    b->cap = cap;
    return b;
}

static void test_lifo_and_fields_kept(void **state) {
    (void)state;
    ect_spares s = ECT_SPARES_INIT(blk, link, 4);
    assert_null(ect_spares_peek(&s));
    assert_null(ect_spares_get(&s));
    blk *a = blk_new(10), *b = blk_new(20);
    a->other = a;
    ect_spares_put(&s, a);
    ect_spares_put(&s, b);
    assert_int_equal(s.n, 2);
    assert_ptr_equal(ect_spares_peek(&s), b);
    assert_int_equal(s.n, 2); /* peek leaves it */
    assert_ptr_equal(ect_spares_get(&s), b);
    assert_int_equal(b->cap, 20);
    blk *got = ect_spares_get(&s);
    assert_ptr_equal(got, a);
    assert_int_equal(a->cap, 10);
    assert_ptr_equal(a->other, a); /* only the link member was written */
    assert_null(ect_spares_get(&s));
    assert_int_equal(s.n, 0);
    free(a);
    free(b);
}

static void test_bounded_and_cleared(void **state) {
    (void)state;
    ect_spares s = ECT_SPARES_INIT(blk, link, 3);
    for (size_t i = 0; i < 10; i++) ect_spares_put(&s, blk_new(i)); /* 7 freed at once */
    assert_int_equal(s.n, 3);
    /* the three kept are the first three given back, newest first */
    blk *x = ect_spares_get(&s);
    assert_int_equal(x->cap, 2);
    ect_spares_put(&s, x);
    assert_int_equal(s.n, 3);
    ect_spares_clear(&s); /* frees them: the ASan suite's leak check sees any left */
    assert_int_equal(s.n, 0);
    assert_null(ect_spares_peek(&s));
    ect_spares_put(&s, blk_new(1)); /* usable again after a clear */
    assert_int_equal(s.n, 1);
    ect_spares_clear(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifo_and_fields_kept),
        cmocka_unit_test(test_bounded_and_cleared),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
