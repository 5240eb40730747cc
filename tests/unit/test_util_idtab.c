/*
 * Tests for util/idtab, the one id table with live lists and tombstones:
 * the contract cases (dedup, TTL, the cap, pins, clamped time), then a
 * random run against a simple model (arrays in order of arrival), comparing
 * the lists, the lookups and which records the table dropped, after every
 * operation.
 */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "util/idtab.h"
#include "util/util.h"

#define N 48

typedef struct rec {
    char id[16];
    idt_node node;
    bool in;     /* linked in the table */
    bool pinned; /* the owner still refers to it */
    int dropped; /* times ops.drop was called for it */
} rec;

static rec R[N];

static void on_drop(void *ctx, idt_node *n) {
    (void)ctx;
    rec *r = IDT_ENTRY(n, rec, node);
    assert_true(r->in);
    r->in = false;
    r->dropped++;
}

static bool on_pinned(void *ctx, const idt_node *n) {
    (void)ctx;
    return IDT_ENTRY(n, rec, node)->pinned;
}

static const idt_ops OPS = {on_drop, on_pinned, NULL};

static void reset(void) {
    memset(R, 0, sizeof R);
    for (int i = 0; i < N; i++) {
        snprintf(R[i].id, sizeof R[i].id, "id-%d", i);
        R[i].node.id = R[i].id;
    }
}

static int add(idtab *t, int i, int list, uint64_t when) {
    int rc = idt_add(t, &R[i].node, list, when);
    if (!rc) R[i].in = true;
    return rc;
}

static void test_contract(void **state) {
    (void)state;
    reset();
    idtab t;
    idt_init(&t, 100, 2, &OPS);
    assert_int_equal(add(&t, 0, IDT_LIVE, 5), 0);
    assert_err(idt_add(&t, &R[0].node, IDT_TOMBS, 0), ECT_EEXIST, "id-0"); /* dedup */
    assert_ptr_equal(idt_find(&t, "id-0"), &R[0].node);
    assert_null(idt_find(&t, "nope"));
    assert_null(idt_find(&t, NULL));
    assert_int_equal(add(&t, 1, IDT_LIVE, 3), 0);
    assert_int_equal(idt_live(&t), 2);
    assert_ptr_equal(idt_first(&t, IDT_LIVE), &R[0].node); /* order of arrival */
    assert_int_equal(R[1].node.deadline, 3);               /* live: the owner's value */
    idt_move(&t, &R[0].node, IDT_TOMBS, 10);               /* entombed at 10: goes at 110 */
    assert_int_equal(R[0].node.deadline, 110);
    idt_move(&t, &R[1].node, IDT_TOMBS, 4); /* earlier time counts as 10 */
    assert_int_equal(R[1].node.deadline, 110);
    assert_int_equal(idt_count(&t, IDT_TOMBS), 2);
    assert_int_equal(add(&t, 2, IDT_TOMBS, 20), 0); /* over the cap of 2: the oldest goes */
    assert_int_equal(R[0].dropped, 1);
    assert_int_equal(t.dropped, 1);
    assert_null(idt_find(&t, "id-0"));
    assert_int_equal(idt_expire(&t, 109), 0);
    R[1].pinned = true; /* expiry stops at a pinned one */
    assert_int_equal(idt_expire(&t, 110), 0);
    R[1].pinned = false;
    assert_int_equal(idt_expire(&t, 110), 1);
    assert_int_equal(R[1].dropped, 1);
    assert_int_equal(idt_expire(&t, 119), 0);
    assert_int_equal(idt_expire(&t, 120), 1);
    assert_int_equal(idt_count(&t, IDT_TOMBS), 0);
    assert_int_equal(add(&t, 3, 2, 0), 0);
    idt_remove(&t, &R[3].node); /* no drop */
    assert_int_equal(R[3].dropped, 0);
    assert_int_equal(idt_live(&t), 0);
    assert_int_equal(idt_check(&t), 0);
    assert_int_equal(add(&t, 3, IDT_LIVE, 0), 0); /* free again */
    assert_int_equal(add(&t, 4, IDT_TOMBS, 0), 0);
    R[4].pinned = true;
    idt_clear(&t); /* pins ignored */
    assert_int_equal(R[3].dropped + R[4].dropped, 2);
    assert_int_equal(idt_count(&t, IDT_TOMBS) + idt_live(&t), 0);
}

/* ---- the model */

typedef struct model {
    int list[IDT_LISTS][N]; /* record indexes in order */
    int n[IDT_LISTS];
    uint64_t deadline[N];
    int where[N]; /* -1: not in */
    uint64_t now, ttl;
    size_t cap;
    int dropped[N];
} model;

static void m_unlink(model *m, int i) {
    int l = m->where[i];
    int k = 0;
    while (m->list[l][k] != i) k++;
    memmove(&m->list[l][k], &m->list[l][k + 1], sizeof(int) * (size_t)(m->n[l] - k - 1));
    m->n[l]--;
    m->where[i] = -1;
}

static void m_drop_head(model *m) {
    int i = m->list[IDT_TOMBS][0];
    m_unlink(m, i);
    m->dropped[i]++;
}

static void m_cap(model *m) {
    while ((size_t)m->n[IDT_TOMBS] > m->cap && !R[m->list[IDT_TOMBS][0]].pinned) m_drop_head(m);
}

static void m_link(model *m, int i, int l, uint64_t when) {
    if (l == IDT_TOMBS) {
        if (when > m->now) m->now = when;
        when = m->now + m->ttl;
    }
    m->list[l][m->n[l]++] = i;
    m->where[i] = l;
    m->deadline[i] = when;
    if (l == IDT_TOMBS) m_cap(m);
}

static void compare(const idtab *t, const model *m) {
    assert_int_equal(idt_check(t), 0);
    for (int l = 0; l < IDT_LISTS; l++) {
        assert_int_equal(idt_count(t, l), (size_t)m->n[l]);
        const idt_node *x = idt_first(t, l);
        for (int k = 0; k < m->n[l]; k++, x = x->next) {
            assert_ptr_equal(x, &R[m->list[l][k]].node);
            assert_int_equal(x->deadline, m->deadline[m->list[l][k]]);
        }
        assert_null(x);
    }
    for (int i = 0; i < N; i++) {
        assert_int_equal(R[i].dropped, m->dropped[i]);
        assert_ptr_equal(idt_find(t, R[i].id), m->where[i] >= 0 ? &R[i].node : NULL);
    }
}

static void test_random_against_model(void **state) {
    (void)state;
    for (unsigned seed = 1; seed <= 20; seed++) {
        srand(seed);
        reset();
        model m = {.ttl = 1 + (uint64_t)(rand() % 50), .cap = 1 + (size_t)(rand() % 12)};
        for (int i = 0; i < N; i++) m.where[i] = -1;
        idtab t;
        idt_init(&t, m.ttl, m.cap, &OPS);
        uint64_t now = 0;
        for (int step = 0; step < 4000; step++) {
            now += (uint64_t)(rand() % 4);
            uint64_t when = rand() % 8 ? now : now - (now ? (uint64_t)(rand() % (int)now) : 0);
            int i = rand() % N, l = rand() % IDT_LISTS;
            switch (rand() % 6) {
            case 0:
            case 1: { /* add */
                int rc = idt_add(&t, &R[i].node, l, when);
                if (m.where[i] >= 0) {
                    assert_int_equal(rc, ECT_EEXIST);
                } else {
                    assert_int_equal(rc, 0);
                    R[i].in = true;
                    m_link(&m, i, l, when);
                }
                break;
            }
            case 2: /* move */
                if (m.where[i] < 0) break;
                idt_move(&t, &R[i].node, l, when);
                m_unlink(&m, i);
                m_link(&m, i, l, when);
                break;
            case 3: /* remove */
                if (m.where[i] < 0) break;
                idt_remove(&t, &R[i].node);
                R[i].in = false;
                m_unlink(&m, i);
                break;
            case 4: { /* expire */
                int before = 0, after = 0;
                for (int k = 0; k < N; k++) before += m.dropped[k];
                if (when > m.now) m.now = when;
                m_cap(&m);
                while (m.n[IDT_TOMBS] && m.deadline[m.list[IDT_TOMBS][0]] <= m.now &&
                       !R[m.list[IDT_TOMBS][0]].pinned)
                    m_drop_head(&m);
                for (int k = 0; k < N; k++) after += m.dropped[k];
                assert_int_equal(idt_expire(&t, when), (size_t)(after - before));
                break;
            }
            case 5: /* the owner pins or unpins */ R[i].pinned = rand() % 3 == 0; break;
            }
            compare(&t, &m);
        }
        for (int i = 0; i < N; i++) R[i].pinned = rand() % 2;
        idt_clear(&t);
        for (int i = 0; i < N; i++) assert_false(R[i].in);
        assert_int_equal(idt_check(&t), 0);
    }
}

/* The index at scale: it grows through several sizes, removals in random
 * order keep every other id findable (the probe runs stay intact), and the
 * ids the owner removed are gone. */
typedef struct big {
    char id[24];
    idt_node node;
    bool in;
} big;

static void big_drop(void *ctx, idt_node *n) {
    (void)ctx;
    IDT_ENTRY(n, big, node)->in = false;
}

/* idt_add finds a known id before it grows the index: at the growth
 * threshold (48 ids of 64 slots) a second node with a known id is refused
 * and the index neither grows nor changes; the next new id grows it. */
static void test_duplicate_at_growth(void **state) {
    (void)state;
    reset();
    idtab t;
    idt_init(&t, 1000, 100, &OPS);
    for (int i = 0; i < N; i++) assert_int_equal(add(&t, i, IDT_LIVE, 0), 0);
    assert_int_equal(t.cap, 64);
    rec dup = {.id = "id-17"};
    dup.node.id = dup.id;
    assert_err(idt_add(&t, &dup.node, IDT_LIVE, 0), ECT_EEXIST, "id-17");
    assert_int_equal(t.cap, 64);
    assert_int_equal(t.used, N);
    assert_ptr_equal(idt_find(&t, "id-17"), &R[17].node);
    assert_int_equal(idt_check(&t), 0);
    rec one = {.id = "new"};
    one.node.id = one.id;
    assert_int_equal(idt_add(&t, &one.node, IDT_LIVE, 0), 0);
    assert_int_equal(t.cap, 128);
    assert_ptr_equal(idt_find(&t, "new"), &one.node);
    for (int i = 0; i < N; i++) assert_ptr_equal(idt_find(&t, R[i].id), &R[i].node);
    assert_int_equal(idt_check(&t), 0);
    idt_remove(&t, &one.node);
    idt_clear(&t);
}

static void test_index_many_ids(void **state) {
    (void)state;
    enum { M = 20000 };
    big *b = calloc(M, sizeof *b);
    assert_non_null(b);
    idtab t;
    idt_init(&t, 1000, 10, &(idt_ops){.drop = big_drop});
    for (int i = 0; i < M; i++) {
        snprintf(b[i].id, sizeof b[i].id, "b-%d", i);
        b[i].node.id = b[i].id;
        assert_int_equal(idt_add(&t, &b[i].node, IDT_LIVE, 0), 0);
        b[i].in = true;
    }
    assert_int_equal(idt_add(&t, &b[7].node, IDT_LIVE, 0), ECT_EEXIST);
    srand(7);
    for (int k = 0; k < M; k++) {
        int i = rand() % M;
        if (!b[i].in) continue;
        idt_remove(&t, &b[i].node);
        b[i].in = false;
    }
    assert_int_equal(idt_check(&t), 0);
    for (int i = 0; i < M; i++)
        assert_ptr_equal(idt_find(&t, b[i].id), b[i].in ? &b[i].node : NULL);
    assert_null(idt_find(&t, "b-x"));
    for (int i = 0; i < M; i += 2)
        if (!b[i].in) {
            assert_int_equal(idt_add(&t, &b[i].node, IDT_LIVE, 0), 0);
            b[i].in = true;
        }
    assert_int_equal(idt_check(&t), 0);
    for (int i = 0; i < M; i++)
        assert_ptr_equal(idt_find(&t, b[i].id), b[i].in ? &b[i].node : NULL);
    idt_clear(&t);
    for (int i = 0; i < M; i++) assert_false(b[i].in);
    assert_null(idt_find(&t, "b-1"));
    free(b);
}

/* idt_replace puts a new node (same id, other bytes) in the old one's place:
 * found by id, same list position and deadline, the index consistent; with
 * colliding runs around it (many ids), each replaced in turn. */
static void test_replace_keeps_place(void **state) {
    (void)state;
    reset();
    idtab t;
    idt_init(&t, 100, N, &OPS);
    for (int i = 0; i < N; i++) assert_int_equal(add(&t, i, i % 2 ? IDT_TOMBS : IDT_LIVE, 5), 0);
    static rec C[N];
    for (int i = 0; i < N; i += 3) {
        memcpy(C[i].id, R[i].id, sizeof C[i].id);
        C[i].node.id = C[i].id;
        uint64_t deadline = R[i].node.deadline;
        idt_node *prev = R[i].node.prev, *next = R[i].node.next;
        int list = R[i].node.list;
        idt_replace(&t, &R[i].node, &C[i].node);
        R[i].in = false;
        assert_ptr_equal(idt_find(&t, R[i].id), &C[i].node);
        assert_int_equal(C[i].node.list, list);
        assert_int_equal(C[i].node.deadline, deadline);
        /* same neighbours: the head's prev is the tail, and may be itself */
        if (prev != &R[i].node) assert_ptr_equal(C[i].node.prev, prev);
        assert_ptr_equal(C[i].node.next, next);
        assert_int_equal(idt_check(&t), 0);
    }
    /* order of arrival kept on both lists */
    for (int l = IDT_TOMBS; l <= IDT_LIVE; l++) {
        int want = l == IDT_LIVE ? 0 : 1;
        for (idt_node *n = idt_first(&t, l); n; n = n->next, want += 2) {
            char id[16];
            snprintf(id, sizeof id, "id-%d", want);
            assert_string_equal(n->id, id);
            assert_ptr_equal(n, want % 3 ? &R[want].node : &C[want].node);
        }
        assert_int_equal(want, N + (l == IDT_LIVE ? 0 : 1));
    }
    for (int i = 0; i < N; i += 3) idt_remove(&t, &C[i].node);
    assert_int_equal(idt_check(&t), 0);
    idt_clear(&t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_contract),
        cmocka_unit_test(test_random_against_model),
        cmocka_unit_test(test_duplicate_at_growth),
        cmocka_unit_test(test_index_many_ids),
        cmocka_unit_test(test_replace_keeps_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
