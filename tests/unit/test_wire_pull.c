/* Tests for wire/pull_msg: round trips, golden bytes (also in
 * docs/PROTOCOL.md), one rejection per bad-input class, decode_any's type
 * rule, encoder validation, and random mutations that must never crash. */
#include <stdio.h>
#include <stdlib.h>

#include <msgpack.h>

#include "testutil.h"
#include "util/util.h"
#include "wire/pull_msg.h"

/* ------------------------------------------------------------- helpers */

/* Golden encodings, hand-checked against the msgpack spec (and once against
 * python3-msgpack 1.0.3 packb). Same hex as docs/PROTOCOL.md. */
static const char GOLDEN_PULL[] =
    "84a76d6d5f68617368a3616263a76473745f707472cf00007f0000001000aa6473745f6f6666736574cd1000b363"
    "6f6e73756d65725f73657373696f6e5f6964aa636f6e73756d65722d30";
static const char GOLDEN_COMPLETE[] = "82a76d6d5f68617368a3616263a6737461747573fb";
static const char GOLDEN_NOTIFICATION[] =
    "85a96d6d5f68617368657391a3616263a67368617065739192cd0240cd1000aa64747970655f7374727391ae746f"
    "7263682e62666c6f61743136ae6e756d5f62797465735f6c69737491ce00480000b370726f64756365725f736573"
    "73696f6e5f6964a27030";
static const char GOLDEN_REQUEST[] = "83aa726571756573745f6964a27231b3636f6e73756d65725f7365737369"
                                     "6f6e5f6964a26330a96d6d5f68617368657391a3616263";
static const char GOLDEN_READY[] =
    "87aa726571756573745f6964a27231a96d6d5f68617368657391a3616263a67368617065739192cd0240cd1000aa"
    "64747970655f7374727391ae746f7263682e62666c6f61743136ae6e756d5f62797465735f6c69737491ce004800"
    "00b370726f64756365725f73657373696f6e5f6964a27030a46d6f7265c2";

static size_t unhex(const char *hex, unsigned char *out, size_t cap) {
    size_t n = strlen(hex) / 2;
    assert_true(n <= cap);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (unsigned char)v;
    }
    return n;
}

static void assert_bytes_hex(const void *buf, size_t len, const char *hex) {
    unsigned char want[1024];
    size_t n = unhex(hex, want, sizeof want);
    if (len != n || memcmp(buf, want, n) != 0) {
        print_error("encoded: ");
        for (size_t i = 0; i < len; i++) print_error("%02x", ((const unsigned char *)buf)[i]);
        print_error("\nwanted:  %s\n", hex);
        fail();
    }
}

/* A small msgpack writer for hand-made (often bad) inputs. */
typedef struct mb {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mb;

static void mb_init(mb *b) {
    msgpack_sbuffer_init(&b->sb);
    msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}
static void mb_free(mb *b) { msgpack_sbuffer_destroy(&b->sb); }
static void mb_str(mb *b, const char *s) {
    msgpack_pack_str(&b->pk, strlen(s));
    msgpack_pack_str_body(&b->pk, s, strlen(s));
}
static void mb_strn(mb *b, const char *s, size_t n) {
    msgpack_pack_str(&b->pk, n);
    msgpack_pack_str_body(&b->pk, s, n);
}
static void mb_map(mb *b, size_t n) { msgpack_pack_map(&b->pk, n); }
static void mb_arr(mb *b, size_t n) { msgpack_pack_array(&b->pk, n); }
static void mb_u(mb *b, uint64_t v) { msgpack_pack_uint64(&b->pk, v); }
static void mb_i(mb *b, int64_t v) { msgpack_pack_int64(&b->pk, v); }
static void mb_raw(mb *b, const void *p, size_t n) { msgpack_sbuffer_write(&b->sb, p, n); }
static void mb_kstr(mb *b, const char *k, const char *v) {
    mb_str(b, k);
    mb_str(b, v);
}
static void mb_ku(mb *b, const char *k, uint64_t v) {
    mb_str(b, k);
    mb_u(b, v);
}

/* Decodes b as ECTransferPull / ECHashNotification and expects failure. */
static void expect_pull_err(mb *b, int code, const char *msg_part) {
    wire_transfer_pull m;
    assert_err(wire_transfer_pull_decode(b->sb.data, b->sb.size, &m), code, msg_part);
    assert_null(m.mm_hash);
    wire_pull_msg any;
    assert_err(wire_pull_decode_any(b->sb.data, b->sb.size, &any), code, msg_part);
    assert_int_equal(any.type, WIRE_PULL_NONE);
    mb_free(b);
}

static void expect_notif_err(mb *b, int code, const char *msg_part) {
    wire_hash_notification m;
    assert_err(wire_hash_notification_decode(b->sb.data, b->sb.size, &m), code, msg_part);
    assert_null(m.items);
    mb_free(b);
}

/* A valid ECTransferPull with `skip` left out and `extra` key/values after. */
static void build_pull(mb *b, const char *skip, int extra) {
    mb_map(b, (skip ? 3 : 4) + (size_t)extra);
    if (!skip || strcmp(skip, "mm_hash")) mb_kstr(b, "mm_hash", "abc");
    if (!skip || strcmp(skip, "dst_ptr")) mb_ku(b, "dst_ptr", 4096);
    if (!skip || strcmp(skip, "dst_offset")) mb_ku(b, "dst_offset", 0);
    if (!skip || strcmp(skip, "consumer_session_id")) mb_kstr(b, "consumer_session_id", "c0");
}

/* A notification whose lists are written by hand: n hashes, the other lists
 * with their own lengths, each entry a 2x3 float32 tensor (24 bytes). */
static void build_notif(mb *b, size_t nh, size_t ns, size_t nd, size_t nb) {
    mb_map(b, 5);
    mb_str(b, "mm_hashes");
    mb_arr(b, nh);
    for (size_t i = 0; i < nh; i++) mb_str(b, "h");
    mb_str(b, "shapes");
    mb_arr(b, ns);
    for (size_t i = 0; i < ns; i++) {
        mb_arr(b, 2);
        mb_u(b, 2);
        mb_u(b, 3);
    }
    mb_str(b, "dtype_strs");
    mb_arr(b, nd);
    for (size_t i = 0; i < nd; i++) mb_str(b, "float32");
    mb_str(b, "num_bytes_list");
    mb_arr(b, nb);
    for (size_t i = 0; i < nb; i++) mb_u(b, 24);
    mb_kstr(b, "producer_session_id", "p0");
}

static char *rand_str(uint64_t *st, size_t len) {
    char *s = malloc(len + 1);
    assert_non_null(s);
    for (size_t i = 0; i < len; i++) s[i] = "0123456789abcdef"[test_rand(st) % 16];
    s[len] = '\0';
    return s;
}

static const char *const dtypes[] = {"torch.bfloat16", "float16", "torch.float32", "float8_e4m3fn",
                                     "torch.int64",    "uint8",   "complex128",    "bool"};

static void rand_items(uint64_t *st, wire_pull_item *items, size_t n, bool max_size) {
    for (size_t i = 0; i < n; i++) {
        wire_pull_item *it = &items[i];
        it->mm_hash = rand_str(st, max_size ? WIRE_PULL_MAX_STR : 1 + test_rand(st) % 64);
        it->ndim = max_size ? WIRE_MAX_NDIM : (uint32_t)(test_rand(st) % (WIRE_MAX_NDIM + 1));
        for (uint32_t d = 0; d < it->ndim; d++)
            it->shape[d] =
                max_size ? (d == 0 ? 0 : UINT64_MAX) : test_rand(st) % (it->ndim > 4 ? 64 : 600);
        const char *dt = max_size ? "torch.float8_e5m2fnuz" : dtypes[test_rand(st) % 8];
        strcpy(it->dtype, dt);
        assert_int_equal(wire_shape_nbytes(dt, it->shape, it->ndim, &it->num_bytes, "t"), 0);
        if (max_size) assert_true(it->num_bytes == 0);
    }
}

static void assert_items_equal(const wire_pull_item *a, const wire_pull_item *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(a[i].mm_hash, b[i].mm_hash);
        assert_int_equal(a[i].ndim, b[i].ndim);
        for (uint32_t d = 0; d < a[i].ndim; d++) assert_int_equal(a[i].shape[d], b[i].shape[d]);
        assert_string_equal(a[i].dtype, b[i].dtype);
        assert_int_equal(a[i].num_bytes, b[i].num_bytes);
    }
}

/* ---------------------------------------------------------- round trips */

static void test_round_trip_pull_and_complete(void **state) {
    (void)state;
    uint64_t vals[] = {0, 1, 127, 128, 255, 256, 65535, 65536, UINT32_MAX, 1ull << 32, UINT64_MAX};
    for (size_t k = 0; k < ECT_ARRAY_LEN(vals); k++) {
        wire_transfer_pull in = {"hash-x", vals[k], vals[ECT_ARRAY_LEN(vals) - 1 - k], "sess"};
        void *buf;
        size_t len;
        assert_int_equal(wire_transfer_pull_encode(&in, &buf, &len), 0);
        wire_transfer_pull out;
        assert_int_equal(wire_transfer_pull_decode(buf, len, &out), 0);
        assert_string_equal(out.mm_hash, "hash-x");
        assert_int_equal(out.dst_ptr, in.dst_ptr);
        assert_int_equal(out.dst_offset, in.dst_offset);
        assert_string_equal(out.consumer_session_id, "sess");
        wire_transfer_pull_free(&out);
        assert_null(out.mm_hash);
        free(buf);
    }
    int32_t sts[] = {0, 1, -1, -32, -33, 127, 128, -128, -129, INT32_MAX, INT32_MIN, ECT_EPROTO};
    for (size_t k = 0; k < ECT_ARRAY_LEN(sts); k++) {
        wire_transfer_complete in = {"\xc3\xa9t\xc3\xa9", sts[k]}; /* UTF-8 "été" */
        void *buf;
        size_t len;
        assert_int_equal(wire_transfer_complete_encode(&in, &buf, &len), 0);
        wire_pull_msg any;
        assert_int_equal(wire_pull_decode_any(buf, len, &any), 0);
        assert_int_equal(any.type, WIRE_PULL_COMPLETE);
        assert_string_equal(any.u.complete.mm_hash, in.mm_hash);
        assert_int_equal(any.u.complete.status, sts[k]);
        wire_pull_msg_free(&any);
        free(buf);
    }
}

static void test_round_trip_notification_and_ready(void **state) {
    (void)state;
    uint64_t st = 42;
    for (int round = 0; round < 50; round++) {
        size_t n = round == 0 ? 0 : 1 + test_rand(&st) % 40;
        wire_pull_item *items = calloc(n ? n : 1, sizeof *items);
        rand_items(&st, items, n, false);
        wire_hash_notification in = {items, n, "producer-1"};
        void *buf;
        size_t len;
        assert_int_equal(wire_hash_notification_encode(&in, &buf, &len), 0);
        wire_hash_notification out;
        assert_int_equal(wire_hash_notification_decode(buf, len, &out), 0);
        assert_int_equal(out.n_items, n);
        assert_items_equal(items, out.items, n);
        assert_string_equal(out.producer_session_id, "producer-1");
        wire_hash_notification_free(&out);
        free(buf);

        wire_transfer_ready rin = {"req-7", items, n, "producer-1", round % 2};
        assert_int_equal(wire_transfer_ready_encode(&rin, &buf, &len), 0);
        wire_pull_msg any;
        assert_int_equal(wire_pull_decode_any(buf, len, &any), 0);
        assert_int_equal(any.type, WIRE_PULL_READY);
        assert_string_equal(any.u.ready.request_id, "req-7");
        assert_int_equal(any.u.ready.n_items, n);
        assert_items_equal(items, any.u.ready.items, n);
        assert_int_equal(any.u.ready.more, round % 2);
        /* decode_any's result re-encodes to the same bytes. */
        void *buf2;
        size_t len2;
        assert_int_equal(wire_pull_msg_encode(&any, &buf2, &len2), 0);
        assert_int_equal(len2, len);
        assert_memory_equal(buf2, buf, len);
        free(buf2);
        wire_pull_msg_free(&any);
        free(buf);
        for (size_t i = 0; i < n; i++) free(items[i].mm_hash);
        free(items);
    }
}

static void test_round_trip_request(void **state) {
    (void)state;
    uint64_t st = 7;
    for (size_t n = 0; n < 20; n += 3) {
        char *hashes[20];
        for (size_t i = 0; i < n; i++) hashes[i] = rand_str(&st, 64);
        wire_transfer_request in = {"r", "consumer", n ? hashes : NULL, n};
        void *buf;
        size_t len;
        assert_int_equal(wire_transfer_request_encode(&in, &buf, &len), 0);
        wire_transfer_request out;
        assert_int_equal(wire_transfer_request_decode(buf, len, &out), 0);
        assert_string_equal(out.request_id, "r");
        assert_string_equal(out.consumer_session_id, "consumer");
        assert_int_equal(out.n_mm_hashes, n);
        for (size_t i = 0; i < n; i++) assert_string_equal(out.mm_hashes[i], hashes[i]);
        wire_transfer_request_free(&out);
        free(buf);
        for (size_t i = 0; i < n; i++) free(hashes[i]);
    }
}

/* Every bound at its maximum at once still fits WIRE_PULL_MAX_MSG, decodes,
 * and the scan's object bound leaves room for it. */
static void test_largest_messages_fit_bounds(void **state) {
    (void)state;
    uint64_t st = 99;
    wire_pull_item *items = calloc(WIRE_PULL_MAX_ITEMS, sizeof *items);
    rand_items(&st, items, WIRE_PULL_MAX_ITEMS, true);
    char id[WIRE_PULL_MAX_STR + 1];
    memset(id, 'x', WIRE_PULL_MAX_STR);
    id[WIRE_PULL_MAX_STR] = '\0';
    wire_transfer_ready in = {id, items, WIRE_PULL_MAX_ITEMS, id, true};
    void *buf;
    size_t len;
    assert_int_equal(wire_transfer_ready_encode(&in, &buf, &len), 0);
    assert_true(len < WIRE_PULL_MAX_MSG);
    print_message("full ECTransferReady: %zu bytes\n", len);
    wire_transfer_ready out;
    assert_int_equal(wire_transfer_ready_decode(buf, len, &out), 0);
    assert_int_equal(out.n_items, WIRE_PULL_MAX_ITEMS);
    assert_items_equal(items, out.items, WIRE_PULL_MAX_ITEMS);
    wire_transfer_ready_free(&out);
    free(buf);

    /* One item more is refused by the encoder, and by the decoder when a
     * peer sends it anyway. */
    wire_pull_item *more = realloc(items, (WIRE_PULL_MAX_ITEMS + 1) * sizeof *items);
    assert_non_null(more);
    items = more;
    items[WIRE_PULL_MAX_ITEMS] = items[0];
    wire_hash_notification big = {items, WIRE_PULL_MAX_ITEMS + 1, "p"};
    assert_err(wire_hash_notification_encode(&big, &buf, &len), ECT_EINVAL,
               "ECHashNotification.mm_hashes: list of 4097");
    assert_null(buf);
    for (size_t i = 0; i < WIRE_PULL_MAX_ITEMS; i++) free(items[i].mm_hash);
    free(items);

    mb b;
    mb_init(&b);
    build_notif(&b, WIRE_PULL_MAX_ITEMS + 1, WIRE_PULL_MAX_ITEMS + 1, WIRE_PULL_MAX_ITEMS + 1,
                WIRE_PULL_MAX_ITEMS + 1);
    expect_notif_err(&b, ECT_EPROTO, "ECHashNotification.mm_hashes: list of 4097 entries");
}

/* --------------------------------------------------------- golden bytes */

static void test_golden_bytes(void **state) {
    (void)state;
    void *buf;
    size_t len;
    unsigned char raw[512];
    size_t n;

    wire_transfer_pull p = {"abc", 0x7f0000001000ull, 4096, "consumer-0"};
    assert_int_equal(wire_transfer_pull_encode(&p, &buf, &len), 0);
    assert_bytes_hex(buf, len, GOLDEN_PULL);
    free(buf);
    n = unhex(GOLDEN_PULL, raw, sizeof raw);
    wire_pull_msg any;
    assert_int_equal(wire_pull_decode_any(raw, n, &any), 0);
    assert_int_equal(any.type, WIRE_PULL_PULL);
    assert_string_equal(any.u.pull.mm_hash, "abc");
    assert_int_equal(any.u.pull.dst_ptr, 0x7f0000001000ull);
    assert_int_equal(any.u.pull.dst_offset, 4096);
    assert_string_equal(any.u.pull.consumer_session_id, "consumer-0");
    wire_pull_msg_free(&any);

    wire_transfer_complete c = {"abc", -5};
    assert_int_equal(wire_transfer_complete_encode(&c, &buf, &len), 0);
    assert_bytes_hex(buf, len, GOLDEN_COMPLETE);
    free(buf);
    n = unhex(GOLDEN_COMPLETE, raw, sizeof raw);
    assert_int_equal(wire_pull_decode_any(raw, n, &any), 0);
    assert_int_equal(any.type, WIRE_PULL_COMPLETE);
    assert_int_equal(any.u.complete.status, -5);
    wire_pull_msg_free(&any);

    wire_pull_item item = {.mm_hash = "abc",
                           .ndim = 2,
                           .shape = {576, 4096},
                           .dtype = "torch.bfloat16",
                           .num_bytes = 4718592};
    wire_hash_notification hn = {&item, 1, "p0"};
    assert_int_equal(wire_hash_notification_encode(&hn, &buf, &len), 0);
    assert_bytes_hex(buf, len, GOLDEN_NOTIFICATION);
    free(buf);
    n = unhex(GOLDEN_NOTIFICATION, raw, sizeof raw);
    assert_int_equal(wire_pull_decode_any(raw, n, &any), 0);
    assert_int_equal(any.type, WIRE_PULL_NOTIFICATION);
    assert_int_equal(any.u.notification.n_items, 1);
    assert_items_equal(&item, any.u.notification.items, 1);
    assert_string_equal(any.u.notification.producer_session_id, "p0");
    wire_pull_msg_free(&any);

    char *filter[] = {"abc"};
    wire_transfer_request rq = {"r1", "c0", filter, 1};
    assert_int_equal(wire_transfer_request_encode(&rq, &buf, &len), 0);
    assert_bytes_hex(buf, len, GOLDEN_REQUEST);
    free(buf);
    n = unhex(GOLDEN_REQUEST, raw, sizeof raw);
    assert_int_equal(wire_pull_decode_any(raw, n, &any), 0);
    assert_int_equal(any.type, WIRE_PULL_REQUEST);
    assert_string_equal(any.u.request.request_id, "r1");
    assert_int_equal(any.u.request.n_mm_hashes, 1);
    assert_string_equal(any.u.request.mm_hashes[0], "abc");
    wire_pull_msg_free(&any);

    wire_transfer_ready rd = {"r1", &item, 1, "p0", false};
    assert_int_equal(wire_transfer_ready_encode(&rd, &buf, &len), 0);
    assert_bytes_hex(buf, len, GOLDEN_READY);
    free(buf);
    n = unhex(GOLDEN_READY, raw, sizeof raw);
    assert_int_equal(wire_pull_decode_any(raw, n, &any), 0);
    assert_int_equal(any.type, WIRE_PULL_READY);
    assert_false(any.u.ready.more);
    assert_items_equal(&item, any.u.ready.items, 1);
    wire_pull_msg_free(&any);
}

/* A msgspec peer may send keys in another order and with smaller or larger
 * int encodings than ours; all are the same message. */
static void test_key_order_and_int_width_do_not_matter(void **state) {
    (void)state;
    mb b;
    mb_init(&b);
    mb_map(&b, 4);
    mb_kstr(&b, "consumer_session_id", "c");
    mb_str(&b, "dst_offset");
    mb_raw(&b, "\xd3\x00\x00\x00\x00\x00\x00\x00\x05", 9); /* int64 5 */
    mb_str(&b, "dst_ptr");
    mb_raw(&b, "\xd0\x07", 2); /* int8 7 */
    mb_kstr(&b, "mm_hash", "h");
    wire_transfer_pull m;
    assert_int_equal(wire_transfer_pull_decode(b.sb.data, b.sb.size, &m), 0);
    assert_int_equal(m.dst_ptr, 7);
    assert_int_equal(m.dst_offset, 5);
    wire_transfer_pull_free(&m);
    wire_transfer_pull_free(NULL);
    mb_free(&b);
}

/* ------------------------------------------------- rejections, by class */

static void test_reject_wrong_type(void **state) {
    (void)state;
    mb b;
    mb_init(&b);
    mb_map(&b, 4);
    mb_kstr(&b, "mm_hash", "abc");
    mb_kstr(&b, "dst_ptr", "4096"); /* str, not int */
    mb_ku(&b, "dst_offset", 0);
    mb_kstr(&b, "consumer_session_id", "c0");
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull.dst_ptr: expected an int, got str");

    mb_init(&b); /* bin where a str belongs */
    mb_map(&b, 4);
    mb_str(&b, "mm_hash");
    msgpack_pack_bin(&b.pk, 3);
    msgpack_pack_bin_body(&b.pk, "abc", 3);
    mb_ku(&b, "dst_ptr", 1);
    mb_ku(&b, "dst_offset", 0);
    mb_kstr(&b, "consumer_session_id", "c0");
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull.mm_hash: expected a str, got bin");

    mb_init(&b); /* float where an int belongs */
    mb_map(&b, 4);
    mb_kstr(&b, "mm_hash", "abc");
    mb_ku(&b, "dst_ptr", 1);
    mb_str(&b, "dst_offset");
    msgpack_pack_double(&b.pk, 1.0);
    mb_kstr(&b, "consumer_session_id", "c0");
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull.dst_offset: expected an int, got float");

    mb_init(&b); /* a shape that is not an array */
    mb_map(&b, 5);
    mb_str(&b, "mm_hashes");
    mb_arr(&b, 1);
    mb_str(&b, "h");
    mb_str(&b, "shapes");
    mb_arr(&b, 1);
    mb_u(&b, 6);
    mb_str(&b, "dtype_strs");
    mb_arr(&b, 1);
    mb_str(&b, "float32");
    mb_str(&b, "num_bytes_list");
    mb_arr(&b, 1);
    mb_u(&b, 24);
    mb_kstr(&b, "producer_session_id", "p0");
    expect_notif_err(&b, ECT_EPROTO, "ECHashNotification.shapes[0]: expected an array, got int");

    mb_init(&b); /* more must be a bool */
    mb_map(&b, 7);
    mb_kstr(&b, "request_id", "r");
    const char *lists[] = {"mm_hashes", "shapes", "dtype_strs", "num_bytes_list"};
    for (int i = 0; i < 4; i++) {
        mb_str(&b, lists[i]);
        mb_arr(&b, 0);
    }
    mb_kstr(&b, "producer_session_id", "p");
    mb_ku(&b, "more", 1);
    wire_transfer_ready r;
    assert_err(wire_transfer_ready_decode(b.sb.data, b.sb.size, &r), ECT_EPROTO,
               "ECTransferReady.more: expected a bool, got int");
    mb_free(&b);

    mb_init(&b); /* the message itself must be a map */
    mb_arr(&b, 0);
    expect_pull_err(&b, ECT_EPROTO, "expected a msgpack map at the top level");
}

static void test_reject_missing_field(void **state) {
    (void)state;
    const char *fields[] = {"mm_hash", "dst_ptr", "dst_offset", "consumer_session_id"};
    for (size_t i = 0; i < 4; i++) {
        mb b;
        mb_init(&b);
        build_pull(&b, fields[i], 0);
        char want[96];
        snprintf(want, sizeof want, "ECTransferPull.%s: missing field", fields[i]);
        wire_transfer_pull m;
        assert_err(wire_transfer_pull_decode(b.sb.data, b.sb.size, &m), ECT_EPROTO, want);
        mb_free(&b);
    }
    /* decode_any picks the type by key, then names what is missing. */
    mb b;
    mb_init(&b);
    build_pull(&b, "consumer_session_id", 0);
    wire_pull_msg any;
    assert_err(wire_pull_decode_any(b.sb.data, b.sb.size, &any), ECT_EPROTO,
               "ECTransferPull.consumer_session_id: missing field");
    mb_free(&b);
}

static void test_reject_negative_and_overflowing_int(void **state) {
    (void)state;
    mb b;
    mb_init(&b);
    mb_map(&b, 4);
    mb_kstr(&b, "mm_hash", "abc");
    mb_str(&b, "dst_ptr");
    mb_i(&b, -1);
    mb_ku(&b, "dst_offset", 0);
    mb_kstr(&b, "consumer_session_id", "c0");
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull.dst_ptr: negative int -1");

    int64_t bad_status[] = {(int64_t)INT32_MAX + 1, (int64_t)INT32_MIN - 1, INT64_MIN};
    for (size_t i = 0; i < 3; i++) {
        mb_init(&b);
        mb_map(&b, 2);
        mb_kstr(&b, "mm_hash", "abc");
        mb_str(&b, "status");
        mb_i(&b, bad_status[i]);
        wire_transfer_complete c;
        assert_err(wire_transfer_complete_decode(b.sb.data, b.sb.size, &c), ECT_EPROTO,
                   "ECTransferComplete.status: int");
        assert_non_null(strstr(ect_last_error(), "out of the int32 range"));
        mb_free(&b);
    }
    mb_init(&b);
    mb_map(&b, 2);
    mb_kstr(&b, "mm_hash", "abc");
    mb_ku(&b, "status", UINT64_MAX);
    wire_transfer_complete c;
    assert_err(wire_transfer_complete_decode(b.sb.data, b.sb.size, &c), ECT_EPROTO,
               "ECTransferComplete.status: int 18446744073709551615 out of the int32 range");
    mb_free(&b);

    /* A negative dimension, and a shape whose byte count overflows 64 bits. */
    mb_init(&b);
    mb_map(&b, 5);
    mb_str(&b, "mm_hashes");
    mb_arr(&b, 1);
    mb_str(&b, "h");
    mb_str(&b, "shapes");
    mb_arr(&b, 1);
    mb_arr(&b, 2);
    mb_u(&b, 2);
    mb_i(&b, -3);
    mb_str(&b, "dtype_strs");
    mb_arr(&b, 1);
    mb_str(&b, "float32");
    mb_str(&b, "num_bytes_list");
    mb_arr(&b, 1);
    mb_u(&b, 24);
    mb_kstr(&b, "producer_session_id", "p0");
    expect_notif_err(&b, ECT_EPROTO, "ECHashNotification.shapes[0][1]: negative int -3");

    mb_init(&b);
    mb_map(&b, 5);
    mb_str(&b, "mm_hashes");
    mb_arr(&b, 1);
    mb_str(&b, "h");
    mb_str(&b, "shapes");
    mb_arr(&b, 1);
    mb_arr(&b, 2);
    mb_u(&b, 1ull << 40);
    mb_u(&b, 1ull << 40);
    mb_str(&b, "dtype_strs");
    mb_arr(&b, 1);
    mb_str(&b, "float32");
    mb_str(&b, "num_bytes_list");
    mb_arr(&b, 1);
    mb_u(&b, 0);
    mb_kstr(&b, "producer_session_id", "p0");
    expect_notif_err(&b, ECT_EPROTO,
                     "ECHashNotification.num_bytes_list[0]: shape product overflows");
}

static void test_reject_truncated_input(void **state) {
    (void)state;
    const char *goldens[] = {GOLDEN_PULL, GOLDEN_COMPLETE, GOLDEN_NOTIFICATION, GOLDEN_REQUEST,
                             GOLDEN_READY};
    unsigned char raw[512];
    for (size_t g = 0; g < ECT_ARRAY_LEN(goldens); g++) {
        size_t n = unhex(goldens[g], raw, sizeof raw);
        /* Every strict prefix is truncated; a fresh heap copy of exactly the
         * prefix lets ASan catch any read past its end. */
        for (size_t k = 0; k < n; k++) {
            unsigned char *copy = malloc(k ? k : 1);
            memcpy(copy, raw, k);
            wire_pull_msg any;
            assert_err(wire_pull_decode_any(copy, k, &any), ECT_EPROTO, "truncated input");
            wire_hash_notification hn;
            assert_err(wire_hash_notification_decode(copy, k, &hn), ECT_EPROTO, "truncated input");
            free(copy);
        }
    }
    /* No buffer at all. */
    wire_transfer_ready rd;
    assert_err(wire_transfer_ready_decode(NULL, 0, &rd), ECT_EPROTO,
               "ECTransferReady: truncated input (empty message)");
    assert_err(wire_transfer_ready_decode(NULL, 5, &rd), ECT_EINVAL, "NULL buffer");
    /* The error names the field being read. */
    size_t n = unhex(GOLDEN_PULL, raw, sizeof raw);
    wire_transfer_pull p;
    assert_err(wire_transfer_pull_decode(raw, n - 3, &p), ECT_EPROTO,
               "ECTransferPull.consumer_session_id: truncated input");
    /* A 32-bit array header claiming 4 billion entries fails at once instead
     * of making msgpack-c allocate ~100 GiB. */
    mb b;
    mb_init(&b);
    mb_map(&b, 4);
    mb_kstr(&b, "mm_hash", "abc");
    mb_str(&b, "huge");
    mb_raw(&b, "\xdd\xff\xff\xff\xff", 5);
    expect_pull_err(&b, ECT_EPROTO, ".huge: truncated input (array at offset");
    mb_init(&b);
    mb_raw(&b, "\xdf\xff\xff\xff\xff", 5);
    expect_pull_err(&b, ECT_EPROTO, "map of 4294967295 keys exceeds the bound of 64");
}

static void test_reject_trailing_bytes(void **state) {
    (void)state;
    unsigned char raw[512];
    size_t n = unhex(GOLDEN_COMPLETE, raw, sizeof raw);
    raw[n] = 0xc0;
    wire_transfer_complete c;
    assert_err(wire_transfer_complete_decode(raw, n + 1, &c), ECT_EPROTO,
               "ECTransferComplete: 1 trailing bytes after the message");
    /* Two messages back to back are not one message. */
    memcpy(raw + n, raw, n);
    wire_pull_msg any;
    assert_err(wire_pull_decode_any(raw, 2 * n, &any), ECT_EPROTO, "trailing bytes");
}

/* Nests `depth` arrays under an unknown key of a valid ECTransferPull; the
 * top map is level 1, the key's value level 2. */
static void build_nested(mb *b, int levels) {
    build_pull(b, NULL, 1);
    mb_str(b, "deep");
    for (int i = 0; i < levels - 1; i++) mb_arr(b, 1);
    mb_u(b, 1);
}

static void test_reject_excessive_nesting(void **state) {
    (void)state;
    mb b;
    mb_init(&b);
    build_nested(&b, WIRE_PULL_MAX_DEPTH - 1); /* deepest value at level 16 */
    wire_transfer_pull m;
    assert_int_equal(wire_transfer_pull_decode(b.sb.data, b.sb.size, &m), 0);
    wire_transfer_pull_free(&m);
    mb_free(&b);
    mb_init(&b);
    build_nested(&b, WIRE_PULL_MAX_DEPTH);
    expect_pull_err(&b, ECT_EPROTO, ".deep: nesting deeper than 16 levels");
    mb_init(&b); /* far beyond msgpack-c's own stack of 32 */
    build_nested(&b, 5000);
    expect_pull_err(&b, ECT_EPROTO, "nesting deeper than 16 levels");
}

static void test_reject_mismatched_list_lengths(void **state) {
    (void)state;
    mb b;
    mb_init(&b);
    build_notif(&b, 2, 2, 2, 2);
    wire_hash_notification m;
    assert_int_equal(wire_hash_notification_decode(b.sb.data, b.sb.size, &m), 0);
    assert_int_equal(m.n_items, 2);
    wire_hash_notification_free(&m);
    mb_free(&b);
    mb_init(&b);
    build_notif(&b, 2, 3, 2, 2);
    expect_notif_err(&b, ECT_EPROTO,
                     "ECHashNotification.shapes: list has 3 entries but mm_hashes has 2");
    mb_init(&b);
    build_notif(&b, 2, 2, 1, 2);
    expect_notif_err(&b, ECT_EPROTO, "ECHashNotification.dtype_strs: list has 1 entries");
    mb_init(&b);
    build_notif(&b, 2, 2, 2, 0);
    expect_notif_err(&b, ECT_EPROTO, "ECHashNotification.num_bytes_list: list has 0 entries");
}

static void test_reject_over_bounds(void **state) {
    (void)state;
    char s[WIRE_PULL_MAX_STR + 2];
    memset(s, 'a', sizeof s);
    mb b;
    /* mm_hash: 256 bytes pass, 257 do not. */
    for (int over = 0; over < 2; over++) {
        mb_init(&b);
        mb_map(&b, 2);
        mb_str(&b, "mm_hash");
        mb_strn(&b, s, WIRE_PULL_MAX_STR + (size_t)over);
        mb_ku(&b, "status", 0);
        wire_transfer_complete c;
        int rc = wire_transfer_complete_decode(b.sb.data, b.sb.size, &c);
        if (over)
            assert_err(rc, ECT_EPROTO,
                       "ECTransferComplete.mm_hash: string of 257 bytes exceeds the bound of 256");
        else
            assert_int_equal(rc, 0);
        wire_transfer_complete_free(&c);
        mb_free(&b);
    }
    mb_init(&b);
    mb_map(&b, 4);
    mb_kstr(&b, "mm_hash", "abc");
    mb_ku(&b, "dst_ptr", 1);
    mb_ku(&b, "dst_offset", 0);
    mb_str(&b, "consumer_session_id");
    mb_strn(&b, s, WIRE_PULL_MAX_STR + 1);
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull.consumer_session_id: string of 257 bytes");

    /* A request filter of 4097 hashes. */
    mb_init(&b);
    mb_map(&b, 3);
    mb_kstr(&b, "request_id", "r");
    mb_kstr(&b, "consumer_session_id", "c");
    mb_str(&b, "mm_hashes");
    mb_arr(&b, WIRE_PULL_MAX_ITEMS + 1);
    for (int i = 0; i < WIRE_PULL_MAX_ITEMS + 1; i++) mb_str(&b, "h");
    wire_transfer_request rq;
    assert_err(wire_transfer_request_decode(b.sb.data, b.sb.size, &rq), ECT_EPROTO,
               "ECTransferRequest.mm_hashes: list of 4097 entries exceeds the bound of 4096");
    mb_free(&b);

    /* ndim 9. */
    mb_init(&b);
    mb_map(&b, 5);
    mb_str(&b, "mm_hashes");
    mb_arr(&b, 1);
    mb_str(&b, "h");
    mb_str(&b, "shapes");
    mb_arr(&b, 1);
    mb_arr(&b, WIRE_MAX_NDIM + 1);
    for (int d = 0; d < WIRE_MAX_NDIM + 1; d++) mb_u(&b, 1);
    mb_str(&b, "dtype_strs");
    mb_arr(&b, 1);
    mb_str(&b, "uint8");
    mb_str(&b, "num_bytes_list");
    mb_arr(&b, 1);
    mb_u(&b, 1);
    mb_kstr(&b, "producer_session_id", "p0");
    expect_notif_err(&b, ECT_EPROTO, "ECHashNotification.shapes[0]: shape has 9 dimensions");

    /* 65 keys in the top map. */
    mb_init(&b);
    build_pull(&b, NULL, WIRE_PULL_MAX_KEYS + 1 - 4);
    for (int i = 0; i < WIRE_PULL_MAX_KEYS + 1 - 4; i++) {
        char k[16];
        snprintf(k, sizeof k, "x%d", i);
        mb_ku(&b, k, 0);
    }
    expect_pull_err(&b, ECT_EPROTO, "map of 65 keys exceeds the bound of 64");

    /* More than WIRE_PULL_MAX_OBJECTS objects, in an ignored field. */
    mb_init(&b);
    build_pull(&b, NULL, 1);
    mb_str(&b, "pad");
    mb_arr(&b, WIRE_PULL_MAX_OBJECTS);
    for (int i = 0; i < WIRE_PULL_MAX_OBJECTS; i++) msgpack_pack_nil(&b.pk);
    expect_pull_err(&b, ECT_EPROTO, ".pad: more than 131072 msgpack objects");

    /* A message over 2 MiB, whatever it holds. */
    mb_init(&b);
    build_pull(&b, NULL, 1);
    mb_str(&b, "pad");
    msgpack_pack_bin(&b.pk, WIRE_PULL_MAX_MSG);
    char *zeros = calloc(1, WIRE_PULL_MAX_MSG);
    msgpack_pack_bin_body(&b.pk, zeros, WIRE_PULL_MAX_MSG);
    free(zeros);
    expect_pull_err(&b, ECT_EPROTO, "exceeds the bound of 2097152 bytes");
}

static void test_reject_dtype_and_nbytes(void **state) {
    (void)state;
    const struct {
        const char *dtype;
        uint64_t nbytes;
        const char *err;
    } cases[] = {
        {"float32", 24, NULL},
        {"torch.float32", 24, NULL},
        {"torch.float33", 24, "ECHashNotification.dtype_strs[0]: Unsupported torch dtype string"},
        {"", 24, "ECHashNotification.dtype_strs[0]: must not be empty"},
        {"float32", 25, "ECHashNotification.num_bytes_list[0]: shape and dtype do not match"},
        {"bfloat16", 24, "ECHashNotification.num_bytes_list[0]: shape and dtype do not match"},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(cases); i++) {
        mb b;
        mb_init(&b);
        mb_map(&b, 5);
        mb_str(&b, "mm_hashes");
        mb_arr(&b, 1);
        mb_str(&b, "h");
        mb_str(&b, "shapes");
        mb_arr(&b, 1);
        mb_arr(&b, 2);
        mb_u(&b, 2);
        mb_u(&b, 3);
        mb_str(&b, "dtype_strs");
        mb_arr(&b, 1);
        mb_str(&b, cases[i].dtype);
        mb_str(&b, "num_bytes_list");
        mb_arr(&b, 1);
        mb_u(&b, cases[i].nbytes);
        mb_kstr(&b, "producer_session_id", "p0");
        if (!cases[i].err) {
            wire_hash_notification m;
            assert_int_equal(wire_hash_notification_decode(b.sb.data, b.sb.size, &m), 0);
            assert_string_equal(m.items[0].dtype, cases[i].dtype);
            wire_hash_notification_free(&m);
            mb_free(&b);
        } else {
            expect_notif_err(&b, ECT_EPROTO, cases[i].err);
        }
    }
}

static void test_reject_bad_keys_and_strings(void **state) {
    (void)state;
    mb b;
    mb_init(&b); /* duplicate known key */
    build_pull(&b, NULL, 1);
    mb_ku(&b, "dst_ptr", 2);
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull.dst_ptr: duplicate key");
    mb_init(&b); /* duplicate unknown key */
    build_pull(&b, NULL, 2);
    mb_ku(&b, "extra", 1);
    mb_kstr(&b, "extra", "again");
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull.extra: duplicate key");
    mb_init(&b); /* non-string key */
    build_pull(&b, NULL, 1);
    mb_u(&b, 7);
    mb_u(&b, 7);
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull: key #4 is a int, keys must be str");

    const struct {
        const char *bytes;
        size_t n;
        const char *err;
    } strs[] = {
        {"", 0, "ECTransferPull.mm_hash: must not be empty"},
        {"ab\0c", 4, "ECTransferPull.mm_hash: contains a NUL byte"},
        {"\xff", 1, "ECTransferPull.mm_hash: is not valid UTF-8"},
        {"\xc0\xaf", 2, "is not valid UTF-8"},         /* overlong '/' */
        {"\xe0\x80\xaf", 3, "is not valid UTF-8"},     /* overlong '/', 3 bytes */
        {"\xed\xa0\x80", 3, "is not valid UTF-8"},     /* surrogate */
        {"\xf4\x90\x80\x80", 4, "is not valid UTF-8"}, /* above U+10FFFF */
        {"\xe2\x82", 2, "is not valid UTF-8"},         /* cut short */
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(strs); i++) {
        mb_init(&b);
        mb_map(&b, 4);
        mb_str(&b, "mm_hash");
        mb_strn(&b, strs[i].bytes, strs[i].n);
        mb_ku(&b, "dst_ptr", 1);
        mb_ku(&b, "dst_offset", 0);
        mb_kstr(&b, "consumer_session_id", "c0");
        expect_pull_err(&b, ECT_EPROTO, strs[i].err);
    }
    mb_init(&b); /* the byte msgpack never uses */
    build_pull(&b, NULL, 1);
    mb_str(&b, "x");
    mb_raw(&b, "\xc1", 1);
    expect_pull_err(&b, ECT_EPROTO, ".x: invalid msgpack byte 0xc1");
}

static void test_unknown_keys_are_ignored(void **state) {
    (void)state;
    mb b;
    mb_init(&b);
    build_pull(&b, NULL, 11);
    mb_str(&b, "nil");
    msgpack_pack_nil(&b.pk);
    mb_str(&b, "bool");
    msgpack_pack_true(&b.pk);
    mb_str(&b, "neg");
    mb_i(&b, -100000);
    mb_str(&b, "f32");
    msgpack_pack_float(&b.pk, 1.5f);
    mb_str(&b, "f64");
    msgpack_pack_double(&b.pk, 2.5);
    mb_str(&b, "bin");
    msgpack_pack_bin(&b.pk, 2);
    msgpack_pack_bin_body(&b.pk, "\x00\xc1", 2);
    mb_str(&b, "ext");
    msgpack_pack_ext(&b.pk, 5, 1);
    msgpack_pack_ext_body(&b.pk, "\x01\x02\x03\x04\x05", 5);
    mb_str(&b, "fixext");
    mb_raw(&b, "\xd4\x01\xff", 3);
    mb_str(&b, "nested");
    mb_map(&b, 3);
    mb_u(&b, 1); /* non-string keys are fine below the top level */
    mb_arr(&b, 2);
    mb_str(&b, "x");
    mb_map(&b, 0);
    mb_ku(&b, "d", 1); /* as are duplicate keys */
    mb_ku(&b, "d", 2);
    mb_str(&b, "status"); /* another type's field */
    mb_u(&b, 3);
    mb_str(&b, "\xc3\xa9\x01");
    mb_arr(&b, 0);
    wire_transfer_pull m;
    assert_int_equal(wire_transfer_pull_decode(b.sb.data, b.sb.size, &m), 0);
    assert_string_equal(m.mm_hash, "abc");
    assert_int_equal(m.dst_ptr, 4096);
    wire_transfer_pull_free(&m);
    wire_pull_msg any; /* dst_ptr wins over status */
    assert_int_equal(wire_pull_decode_any(b.sb.data, b.sb.size, &any), 0);
    assert_int_equal(any.type, WIRE_PULL_PULL);
    wire_pull_msg_free(&any);
    mb_free(&b);
}

/* The key rule of decode_any, including its tie-breaks. */
static void test_decode_any_type_rule(void **state) {
    (void)state;
    mb b;
    wire_pull_msg any;
    mb_init(&b);
    mb_map(&b, 1);
    mb_kstr(&b, "mm_hash", "abc");
    assert_err(wire_pull_decode_any(b.sb.data, b.sb.size, &any), ECT_EPROTO,
               "pull message: unknown message type");
    mb_free(&b);
    mb_init(&b);
    mb_map(&b, 0);
    assert_err(wire_pull_decode_any(b.sb.data, b.sb.size, &any), ECT_EPROTO,
               "unknown message type");
    mb_free(&b);

    /* request_id without producer_session_id is a request ... */
    mb_init(&b);
    mb_map(&b, 2);
    mb_kstr(&b, "request_id", "r");
    mb_kstr(&b, "consumer_session_id", "c");
    assert_err(wire_pull_decode_any(b.sb.data, b.sb.size, &any), ECT_EPROTO,
               "ECTransferRequest.mm_hashes: missing field");
    mb_free(&b);
    /* ... with it, a ready. */
    mb_init(&b);
    mb_map(&b, 2);
    mb_kstr(&b, "request_id", "r");
    mb_kstr(&b, "producer_session_id", "p");
    assert_err(wire_pull_decode_any(b.sb.data, b.sb.size, &any), ECT_EPROTO,
               "ECTransferReady.mm_hashes: missing field");
    mb_free(&b);
    /* A notification is producer_session_id without request_id. */
    mb_init(&b);
    build_notif(&b, 1, 1, 1, 1);
    assert_int_equal(wire_pull_decode_any(b.sb.data, b.sb.size, &any), 0);
    assert_int_equal(any.type, WIRE_PULL_NOTIFICATION);
    assert_string_equal(wire_pull_type_name(any.type), "ECHashNotification");
    wire_pull_msg_free(&any);
    wire_pull_msg_free(NULL);
    mb_free(&b);
    assert_string_equal(wire_pull_type_name(WIRE_PULL_NONE), "unknown");
}

/* --------------------------------------------------- encoder validation */

static void test_encoder_rejects_invalid_messages(void **state) {
    (void)state;
    void *buf = (void *)1;
    size_t len;
    wire_transfer_pull p = {NULL, 1, 2, "c"};
    assert_err(wire_transfer_pull_encode(&p, &buf, &len), ECT_EINVAL,
               "ECTransferPull.mm_hash: is NULL");
    assert_null(buf);
    char big[WIRE_PULL_MAX_STR + 2];
    memset(big, 'z', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    wire_transfer_complete c = {big, 0};
    assert_err(wire_transfer_complete_encode(&c, &buf, &len), ECT_EINVAL,
               "ECTransferComplete.mm_hash: string of 257 bytes");
    wire_transfer_complete c2 = {"\xff", 0};
    assert_err(wire_transfer_complete_encode(&c2, &buf, &len), ECT_EINVAL, "not valid UTF-8");
    assert_err(wire_transfer_complete_encode(NULL, &buf, &len), ECT_EINVAL, "NULL argument");

    wire_pull_item it = {
        .mm_hash = "h", .ndim = 1, .shape = {4}, .dtype = "float32", .num_bytes = 15};
    wire_hash_notification hn = {&it, 1, "p"};
    assert_err(wire_hash_notification_encode(&hn, &buf, &len), ECT_EINVAL,
               "ECHashNotification.num_bytes_list[0]: shape and dtype do not match");
    it.num_bytes = 16;
    strcpy(it.dtype, "float128");
    assert_err(wire_hash_notification_encode(&hn, &buf, &len), ECT_EINVAL,
               "ECHashNotification.dtype_strs[0]: Unsupported torch dtype string");
    strcpy(it.dtype, "float32");
    it.ndim = WIRE_MAX_NDIM + 1;
    assert_err(wire_hash_notification_encode(&hn, &buf, &len), ECT_EINVAL,
               "ECHashNotification.shapes[0]: shape has 9 dimensions");
    it.ndim = 1;
    hn.producer_session_id = "";
    assert_err(wire_hash_notification_encode(&hn, &buf, &len), ECT_EINVAL,
               "ECHashNotification.producer_session_id: must not be empty");

    char *hashes[] = {"a", NULL};
    wire_transfer_request rq = {"r", "c", hashes, 2};
    assert_err(wire_transfer_request_encode(&rq, &buf, &len), ECT_EINVAL,
               "ECTransferRequest.mm_hashes[1]: is NULL");
    wire_transfer_ready rd = {"r", NULL, 3, "p", false};
    assert_err(wire_transfer_ready_encode(&rd, &buf, &len), ECT_EINVAL,
               "ECTransferReady.mm_hashes: items is NULL");
    wire_pull_msg m = {.type = (wire_pull_type)99};
    assert_err(wire_pull_msg_encode(&m, &buf, &len), ECT_EINVAL, "unknown type 99");
}

/* --------------------------------------------------- random mutations */

/* Mutated valid messages either fail with ECT_EPROTO or decode to something
 * that re-encodes and decodes again to the same bytes. Under the ASan build
 * this also proves the decoders neither read out of bounds nor leak. */
static void test_random_mutations_never_crash(void **state) {
    (void)state;
    const char *goldens[] = {GOLDEN_PULL, GOLDEN_COMPLETE, GOLDEN_NOTIFICATION, GOLDEN_REQUEST,
                             GOLDEN_READY};
    uint64_t st = 2024;
    int ok = 0, rejected = 0;
    for (int iter = 0; iter < 30000; iter++) {
        unsigned char raw[512];
        size_t n = unhex(goldens[iter % 5], raw, sizeof raw);
        int flips = 1 + (int)(test_rand(&st) % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = test_rand(&st) % n;
            switch (test_rand(&st) % 4) {
            case 0: raw[at] = (unsigned char)test_rand(&st); break;
            case 1: raw[at] ^= (unsigned char)(1u << (test_rand(&st) % 8)); break;
            case 2:
                raw[at] =
                    (unsigned char[]){0x00, 0x7f, 0xc0, 0xc1, 0xdd, 0xdf, 0xff}[test_rand(&st) % 7];
                break;
            default: n = at ? at : n; break; /* truncate */
            }
        }
        unsigned char *copy = malloc(n);
        memcpy(copy, raw, n);
        wire_pull_msg any;
        int rc = wire_pull_decode_any(copy, n, &any);
        if (rc) {
            assert_int_equal(rc, ECT_EPROTO);
            assert_true(strlen(ect_last_error()) > 0);
            rejected++;
        } else {
            void *e1, *e2;
            size_t l1, l2;
            assert_int_equal(wire_pull_msg_encode(&any, &e1, &l1), 0);
            wire_pull_msg again;
            assert_int_equal(wire_pull_decode_any(e1, l1, &again), 0);
            assert_int_equal(again.type, any.type);
            assert_int_equal(wire_pull_msg_encode(&again, &e2, &l2), 0);
            assert_int_equal(l1, l2);
            assert_memory_equal(e1, e2, l1);
            free(e1);
            free(e2);
            wire_pull_msg_free(&again);
            wire_pull_msg_free(&any);
            ok++;
        }
        free(copy);
    }
    print_message("mutations: %d decoded, %d rejected\n", ok, rejected);
    assert_true(ok > 0 && rejected > 0);
}

/* ------------------------------------------------- fuzz seed generator */

static void write_seed(const char *dir, const char *name, const void *buf, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, len, f) != len) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(f);
}

static void write_encoded(const char *dir, const char *name, const wire_pull_msg *m) {
    void *buf;
    size_t len;
    if (wire_pull_msg_encode(m, &buf, &len) != 0) {
        fprintf(stderr, "seed %s: %s\n", name, ect_last_error());
        exit(1);
    }
    write_seed(dir, name, buf, len);
    free(buf);
}

/* With ECT_PULL_SEED_DIR set, writes the fuzz seed corpus there (valid
 * messages of every type: the golden ones and a few richer ones). */
static void write_seed_corpus(const char *dir) {
    const struct {
        const char *name, *hex;
    } goldens[] = {{"golden_pull", GOLDEN_PULL},
                   {"golden_complete", GOLDEN_COMPLETE},
                   {"golden_notification", GOLDEN_NOTIFICATION},
                   {"golden_request", GOLDEN_REQUEST},
                   {"golden_ready", GOLDEN_READY}};
    unsigned char raw[512];
    for (size_t i = 0; i < ECT_ARRAY_LEN(goldens); i++)
        write_seed(dir, goldens[i].name, raw, unhex(goldens[i].hex, raw, sizeof raw));

    uint64_t st = 5;
    wire_pull_item items[6];
    memset(items, 0, sizeof items);
    rand_items(&st, items, 6, false);
    wire_pull_msg m = {.type = WIRE_PULL_NOTIFICATION};
    m.u.notification = (wire_hash_notification){items, 6, "producer-session-7"};
    write_encoded(dir, "notification_6_items", &m);
    m.type = WIRE_PULL_READY;
    m.u.ready = (wire_transfer_ready){"req-1", items, 3, "producer-session-7", true};
    write_encoded(dir, "ready_more", &m);
    m.u.ready = (wire_transfer_ready){"req-1", NULL, 0, "producer-session-7", false};
    write_encoded(dir, "ready_empty", &m);
    m.type = WIRE_PULL_REQUEST;
    m.u.request = (wire_transfer_request){"req-2", "consumer-session-3", NULL, 0};
    write_encoded(dir, "request_all", &m);
    m.type = WIRE_PULL_COMPLETE;
    m.u.complete = (wire_transfer_complete){"deadbeef", INT32_MIN};
    write_encoded(dir, "complete_failed", &m);
    m.type = WIRE_PULL_PULL;
    m.u.pull = (wire_transfer_pull){"deadbeef", UINT64_MAX, 1u << 20, "consumer-session-3"};
    write_encoded(dir, "pull_max_ptr", &m);
    for (size_t i = 0; i < 6; i++) free(items[i].mm_hash);

    mb b; /* keys out of order, an unknown nested key */
    mb_init(&b);
    build_pull(&b, NULL, 1);
    mb_str(&b, "trace");
    mb_map(&b, 1);
    mb_str(&b, "spans");
    mb_arr(&b, 2);
    msgpack_pack_double(&b.pk, 0.5);
    msgpack_pack_nil(&b.pk);
    write_seed(dir, "pull_unknown_key", b.sb.data, b.sb.size);
    mb_free(&b);
}

int main(void) {
    const char *seed_dir = getenv("ECT_PULL_SEED_DIR");
    if (seed_dir) {
        write_seed_corpus(seed_dir);
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_pull_and_complete),
        cmocka_unit_test(test_round_trip_notification_and_ready),
        cmocka_unit_test(test_round_trip_request),
        cmocka_unit_test(test_largest_messages_fit_bounds),
        cmocka_unit_test(test_golden_bytes),
        cmocka_unit_test(test_key_order_and_int_width_do_not_matter),
        cmocka_unit_test(test_reject_wrong_type),
        cmocka_unit_test(test_reject_missing_field),
        cmocka_unit_test(test_reject_negative_and_overflowing_int),
        cmocka_unit_test(test_reject_truncated_input),
        cmocka_unit_test(test_reject_trailing_bytes),
        cmocka_unit_test(test_reject_excessive_nesting),
        cmocka_unit_test(test_reject_mismatched_list_lengths),
        cmocka_unit_test(test_reject_over_bounds),
        cmocka_unit_test(test_reject_dtype_and_nbytes),
        cmocka_unit_test(test_reject_bad_keys_and_strings),
        cmocka_unit_test(test_unknown_keys_are_ignored),
        cmocka_unit_test(test_decode_any_type_rule),
        cmocka_unit_test(test_encoder_rejects_invalid_messages),
        cmocka_unit_test(test_random_mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
