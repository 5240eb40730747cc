/* Tests for wire/pull_msg: round trips, golden bytes (also in
 * docs/PROTOCOL.md, ectransfer's extension keys included), rejections by
 * bad-input class, decode_any's type rule, encoder validation, and random
 * mutations that must never crash. The golden bytes, the decoder's
 * rejections and the encoder's refusals are tables: one row per case, one
 * loop per table. */
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
/* With the extension keys (docs/PROTOCOL.md "Extension keys"): the upstream
 * bytes with the map count raised and the pairs appended. */
static const char GOLDEN_PULL_EXT[] =
    "86a76d6d5f68617368a3616263a76473745f707472cf00007f0000001000aa6473745f6f6666736574cd1000b363"
    "6f6e73756d65725f73657373696f6e5f6964aa636f6e73756d65722d30a76473745f6b6579a26b31a5746f6b656e"
    "2a";
static const char GOLDEN_COMPLETE_EXT[] =
    "84a76d6d5f68617368a3616263a6737461747573fca5746f6b656e2aa56572726f72d9216d6d5f68617368206162"
    "6320697320756e6b6e6f776e206f722065766963746564";
/* A pull producer on shm names its offer id (docs/PROTOCOL.md "shm", "Offers"), last. */
static const char GOLDEN_COMPLETE_SHM[] =
    "84a76d6d5f68617368a3616263a673746174757300a5746f6b656e2aaa6563745f73686d5f6964b030313233"
    "343536373839616263646566";

/* Batched pulls (docs/PROTOCOL.md "Batched pulls"): a completion telling
 * ect_batch, an ECTransferPullBatch of two, an ECTransferDone of three. */
static const char GOLDEN_COMPLETE_BATCH[] =
    "84a76d6d5f68617368a3616263a673746174757300a5746f6b656e2aa96563745f6261746368cd1000";
static const char GOLDEN_PULL_BATCH[] =
    "83a96563745f70756c6c739294a3616263cd10002aa26b3194a5696d672d30cd20002ba26b31ab6563745f6473"
    "745f707472cf00007f0000001000b3636f6e73756d65725f73657373696f6e5f6964aa636f6e73756d65722d30";
static const char GOLDEN_DONE[] = "81a86563745f646f6e65932a2bcd012c";
static wire_transfer_pull golden_batch[2] = {
    {"abc", 0x7f0000001000ull, 4096, "consumer-0", .dst_key = "k1", .has_token = true, .token = 42},
    {"img-0", 0x7f0000001000ull, 8192, "consumer-0", .dst_key = "k1", .has_token = true,
     .token = 43}};
static uint64_t golden_done[3] = {42, 43, 300};

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
        /* with the extensions on every other round */
        wire_transfer_pull in = {.mm_hash = "hash-x",
                                 .dst_ptr = vals[k],
                                 .dst_offset = vals[ECT_ARRAY_LEN(vals) - 1 - k],
                                 .consumer_session_id = "sess",
                                 .dst_key = k % 2 ? "0123456789abcdef" : NULL,
                                 .has_token = k % 2,
                                 .token = vals[k]};
        void *buf;
        size_t len;
        assert_int_equal(wire_transfer_pull_encode(&in, &buf, &len), 0);
        wire_transfer_pull out;
        assert_int_equal(wire_transfer_pull_decode(buf, len, &out), 0);
        assert_string_equal(out.mm_hash, "hash-x");
        assert_int_equal(out.dst_ptr, in.dst_ptr);
        assert_int_equal(out.dst_offset, in.dst_offset);
        assert_string_equal(out.consumer_session_id, "sess");
        if (k % 2) assert_string_equal(out.dst_key, "0123456789abcdef");
        assert_true(out.has_token == (k % 2 == 1) && out.token == (k % 2 ? vals[k] : 0));
        wire_transfer_pull_free(&out);
        assert_null(out.mm_hash);
        free(buf);
    }
    int32_t sts[] = {0, 1, -1, -32, -33, 127, 128, -128, -129, INT32_MAX, INT32_MIN, ECT_EPROTO};
    for (size_t k = 0; k < ECT_ARRAY_LEN(sts); k++) {
        wire_transfer_complete in = {.mm_hash = "\xc3\xa9t\xc3\xa9", /* UTF-8 "été" */
                                     .status = sts[k],
                                     .has_token = k % 2,
                                     .token = (uint64_t)k,
                                     .error = k % 3 ? "why" : NULL};
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

static wire_pull_item golden_item = {.mm_hash = "abc",
                                     .ndim = 2,
                                     .shape = {576, 4096},
                                     .dtype = "torch.bfloat16",
                                     .num_bytes = 4718592};
static char *golden_filter[] = {"abc"};

/* Each message encodes to its golden bytes, and the golden bytes decode
 * (decode_any, by the key rule) to a message of that type that encodes to
 * the same bytes again: every field, extensions included, survived. */
static void test_golden_bytes(void **state) {
    (void)state;
    const struct {
        const char *hex;
        wire_pull_msg m;
    } rows[] = {
        {GOLDEN_PULL, {WIRE_PULL_PULL, .u.pull = {"abc", 0x7f0000001000ull, 4096, "consumer-0"}}},
        {GOLDEN_COMPLETE, {WIRE_PULL_COMPLETE, .u.complete = {"abc", -5}}},
        {GOLDEN_NOTIFICATION, {WIRE_PULL_NOTIFICATION, .u.notification = {&golden_item, 1, "p0"}}},
        {GOLDEN_REQUEST, {WIRE_PULL_REQUEST, .u.request = {"r1", "c0", golden_filter, 1}}},
        {GOLDEN_READY, {WIRE_PULL_READY, .u.ready = {"r1", &golden_item, 1, "p0", false}}},
        {GOLDEN_PULL_EXT,
         {WIRE_PULL_PULL, .u.pull = {"abc", 0x7f0000001000ull, 4096, "consumer-0", .dst_key = "k1",
                                     .has_token = true, .token = 42}}},
        {GOLDEN_COMPLETE_EXT,
         {WIRE_PULL_COMPLETE, .u.complete = {"abc", ECT_ENOTFOUND, .has_token = true, .token = 42,
                                             .error = "mm_hash abc is unknown or evicted"}}},
        {GOLDEN_COMPLETE_SHM,
         {WIRE_PULL_COMPLETE, .u.complete = {"abc", 0, .has_token = true, .token = 42,
                                             .shm_id = 0x0123456789abcdefull}}},
        {GOLDEN_COMPLETE_BATCH,
         {WIRE_PULL_COMPLETE,
          .u.complete = {"abc", 0, .has_token = true, .token = 42, .batch_max = 4096}}},
        {GOLDEN_PULL_BATCH, {WIRE_PULL_PULL_BATCH, .u.batch = {golden_batch, 2}}},
        {GOLDEN_DONE, {WIRE_PULL_DONE, .u.done = {golden_done, 3}}},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(rows); i++) {
        void *buf, *again;
        size_t len, alen;
        assert_int_equal(wire_pull_msg_encode(&rows[i].m, &buf, &len), 0);
        assert_bytes_hex(buf, len, rows[i].hex);
        wire_pull_msg any;
        assert_int_equal(wire_pull_decode_any(buf, len, &any), 0);
        assert_int_equal(any.type, rows[i].m.type);
        assert_int_equal(wire_pull_msg_encode(&any, &again, &alen), 0);
        assert_bytes_hex(again, alen, rows[i].hex);
        wire_pull_msg_free(&any);
        free(again);
        free(buf);
    }
    /* The extensions decoded, field by field. */
    unsigned char raw[512];
    size_t n = unhex(GOLDEN_PULL_EXT, raw, sizeof raw);
    wire_transfer_pull p;
    assert_int_equal(wire_transfer_pull_decode(raw, n, &p), 0);
    assert_string_equal(p.dst_key, "k1");
    assert_true(p.has_token);
    assert_int_equal(p.token, 42);
    assert_null(p.ext_error);
    wire_transfer_pull_free(&p);
    n = unhex(GOLDEN_COMPLETE_EXT, raw, sizeof raw);
    wire_transfer_complete c;
    assert_int_equal(wire_transfer_complete_decode(raw, n, &c), 0);
    assert_int_equal(c.status, ECT_ENOTFOUND);
    assert_true(c.has_token);
    assert_int_equal(c.token, 42);
    assert_string_equal(c.error, "mm_hash abc is unknown or evicted");
    assert_int_equal(c.shm_id, 0); /* absent */
    wire_transfer_complete_free(&c);
    n = unhex(GOLDEN_COMPLETE_SHM, raw, sizeof raw);
    assert_int_equal(wire_transfer_complete_decode(raw, n, &c), 0);
    assert_true(c.status == 0 && c.has_token && c.token == 42 && !c.ext_error);
    assert_true(c.shm_id == 0x0123456789abcdefull);
    wire_transfer_complete_free(&c);
    /* Without an id the bytes are the ones before ect_shm_id existed. */
    wire_transfer_complete plain = {.mm_hash = "abc", .status = -5};
    void *pb;
    size_t pl;
    assert_int_equal(wire_transfer_complete_encode(&plain, &pb, &pl), 0);
    assert_bytes_hex(pb, pl, GOLDEN_COMPLETE);
    free(pb);
    /* docs/PROTOCOL.md shows every one of them (hex wrapped over lines). */
    const char *doc = test_protocol_md();
    char *flat = malloc(strlen(doc) + 1);
    assert_non_null(flat);
    size_t k = 0;
    for (const char *d = doc; *d; d++)
        if (*d != '\n') flat[k++] = *d;
    flat[k] = '\0';
    for (size_t i = 0; i < ECT_ARRAY_LEN(rows); i++)
        if (!strstr(flat, rows[i].hex)) fail_msg("docs/PROTOCOL.md lacks %s", rows[i].hex);
    free(flat);
    /* An upstream message has none. */
    n = unhex(GOLDEN_PULL, raw, sizeof raw);
    assert_int_equal(wire_transfer_pull_decode(raw, n, &p), 0);
    assert_true(!p.dst_key && !p.has_token && !p.ext_error);
    wire_transfer_pull_free(&p);
}

/* ECTransferPullBatch and ECTransferDone: decoded field by field (the fast
 * path and the general decoder alike); what the decoders refuse, named; what
 * the encoders refuse. */
static void test_batch_messages(void **state) {
    (void)state;
    unsigned char raw[512];
    size_t n = unhex(GOLDEN_PULL_BATCH, raw, sizeof raw);
    for (int general = 0; general < 2; general++) {
        wire_pull_msg m;
        assert_int_equal(
            general ? wire_pull_decode_general(raw, n, &m) : wire_pull_decode_any(raw, n, &m), 0);
        assert_int_equal(m.type, WIRE_PULL_PULL_BATCH);
        assert_int_equal(m.u.batch.n, 2);
        const wire_transfer_pull *b = &m.u.batch.pulls[1];
        assert_string_equal(b->mm_hash, "img-0");
        assert_true(b->dst_ptr == 0x7f0000001000ull && b->dst_offset == 8192);
        assert_string_equal(b->consumer_session_id, "consumer-0");
        assert_string_equal(b->dst_key, "k1");
        assert_true(b->has_token && b->token == 43 && !b->ext_error);
        wire_pull_msg_free(&m);
    }
    n = unhex(GOLDEN_DONE, raw, sizeof raw);
    wire_transfer_done d;
    assert_int_equal(wire_transfer_done_decode(raw, n, &d), 0);
    assert_true(d.n == 3 && d.tokens[0] == 42 && d.tokens[2] == 300);
    wire_transfer_done_free(&d);
    n = unhex(GOLDEN_COMPLETE_BATCH, raw, sizeof raw);
    wire_transfer_complete c;
    assert_int_equal(wire_transfer_complete_decode(raw, n, &c), 0);
    assert_true(c.batch_max == 4096 && !c.ext_error);
    wire_transfer_complete_free(&c);
    /* ect_batch out of 2..4096: the extension refused, the completion kept */
    raw[n - 2] = 0x10, raw[n - 1] = 0x01; /* 4097 */
    assert_int_equal(wire_transfer_complete_decode(raw, n, &c), 0);
    assert_true(c.batch_max == 0 && c.has_token == false && c.ext_error);
    assert_non_null(strstr(c.ext_error, "ect_batch"));
    wire_transfer_complete_free(&c);
    /* refused batches, each naming where */
    static const struct {
        const char *hex, *why;
    } bad[] = {
        /* an empty list */
        {"83a96563745f70756c6c7390ab6563745f6473745f70747200b3636f6e73756d65725f7365737369"
         "6f6e5f6964a173",
         "ECTransferPullBatch.ect_pulls: empty list"},
        /* an entry of three */
        {"83a96563745f70756c6c739193a26230002aab6563745f6473745f70747200b3636f6e73756d6572"
         "5f73657373696f6e5f6964a173",
         "ECTransferPullBatch.ect_pulls[0]: expected an array of 4"},
        /* a str token */
        {"83a96563745f70756c6c739194a2623000a174a16bab6563745f6473745f70747200b3636f6e7375"
         "6d65725f73657373696f6e5f6964a173",
         "ECTransferPullBatch.ect_pulls[0][2]"},
        /* an empty dst_key */
        {"83a96563745f70756c6c739194a26230002aa0ab6563745f6473745f70747200b3636f6e73756d65"
         "725f73657373696f6e5f6964a173",
         "ECTransferPullBatch.ect_pulls[0][3]"},
        /* no consumer_session_id */
        {"82a96563745f70756c6c739194a26230002aa16bab6563745f6473745f70747200",
         "ECTransferPullBatch.consumer_session_id: missing"},
        /* an empty ECTransferDone, and one with a negative token */
        {"81a86563745f646f6e6590", "ECTransferDone.ect_done: empty list"},
        {"81a86563745f646f6e6591ff", "ECTransferDone.ect_done[0]: negative"},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(bad); i++) {
        n = unhex(bad[i].hex, raw, sizeof raw);
        wire_pull_msg m;
        assert_int_equal(wire_pull_decode_any(raw, n, &m), ECT_EPROTO);
        if (!strstr(ect_last_error(), bad[i].why))
            fail_msg("case %zu: \"%s\" lacks \"%s\"", i, ect_last_error(), bad[i].why);
    }
    /* the encoders: entries that differ in dst_ptr or session, no token, none at all */
    wire_transfer_pull two[2] = {golden_batch[0], golden_batch[1]};
    void *buf;
    size_t len;
    two[1].dst_ptr++;
    assert_int_equal(
        wire_transfer_pull_batch_encode(&(wire_transfer_pull_batch){two, 2}, &buf, &len),
        ECT_EINVAL);
    two[1] = golden_batch[1];
    two[1].has_token = false;
    assert_int_equal(
        wire_transfer_pull_batch_encode(&(wire_transfer_pull_batch){two, 2}, &buf, &len),
        ECT_EINVAL);
    assert_int_equal(
        wire_transfer_pull_batch_encode(&(wire_transfer_pull_batch){two, 0}, &buf, &len),
        ECT_EINVAL);
    assert_int_equal(wire_transfer_done_encode(&(wire_transfer_done){golden_done, 0}, &buf, &len),
                     ECT_EINVAL);
    wire_transfer_complete bm = {.mm_hash = "abc", .batch_max = 1};
    assert_int_equal(wire_transfer_complete_encode(&bm, &buf, &len), ECT_EINVAL);
    /* the largest batch fits the message bound and decodes */
    wire_transfer_pull *big = calloc(WIRE_PULL_MAX_ITEMS, sizeof *big);
    assert_non_null(big);
    char hash[WIRE_PULL_MAX_STR + 1], key[WIRE_PULL_MAX_KEY + 1];
    memset(hash, 'h', WIRE_PULL_MAX_STR);
    hash[WIRE_PULL_MAX_STR] = '\0';
    memset(key, 'k', 200);
    key[200] = '\0';
    for (size_t i = 0; i < WIRE_PULL_MAX_ITEMS; i++)
        big[i] = (wire_transfer_pull){hash,           UINT64_MAX,        UINT64_MAX,         hash,
                                      .dst_key = key, .has_token = true, .token = UINT64_MAX};
    assert_int_equal(wire_transfer_pull_batch_encode(
                         &(wire_transfer_pull_batch){big, WIRE_PULL_MAX_ITEMS}, &buf, &len),
                     0);
    assert_true(len < WIRE_PULL_MAX_MSG);
    wire_pull_msg m;
    assert_int_equal(wire_pull_decode_any(buf, len, &m), 0);
    assert_int_equal(m.u.batch.n, WIRE_PULL_MAX_ITEMS);
    wire_pull_msg_free(&m);
    free(buf);
    free(big);
}

/* ------------------------------------------- decoding, table of cases */

/* A value written by hand: 's' a str (n bytes when n > 0, else strlen), 'u'
 * an unsigned int, 'i' a signed int, 'x' raw msgpack bytes in hex, 'a' a str
 * of u bytes 'a', 'l' a list of one str, 'n' a list of one unsigned int, '-'
 * the key is left out. */
typedef struct val {
    char k;
    const char *s;
    uint64_t u;
    int64_t i;
    size_t n;
} val;
#define S(t)                                                                                       \
    { 's', t, 0, 0, 0 }
#define SN(t, len)                                                                                 \
    { 's', t, 0, 0, len }
#define U(v)                                                                                       \
    { 'u', NULL, v, 0, 0 }
#define I(v)                                                                                       \
    { 'i', NULL, 0, v, 0 }
#define X(h)                                                                                       \
    { 'x', h, 0, 0, 0 }
#define A(len)                                                                                     \
    { 'a', NULL, len, 0, 0 }
#define LS(t)                                                                                      \
    { 'l', t, 0, 0, 0 }
#define LU(v)                                                                                      \
    { 'n', NULL, v, 0, 0 }
#define ABSENT                                                                                     \
    { '-', NULL, 0, 0, 0 }

typedef struct field {
    const char *key;
    val v;
} field;

/* The valid message of each type the cases edit, in wire key order. */
static const field pull_fields[] = {{"mm_hash", S("abc")},
                                    {"dst_ptr", U(4096)},
                                    {"dst_offset", U(0)},
                                    {"consumer_session_id", S("c0")}};
static const field complete_fields[] = {{"mm_hash", S("abc")}, {"status", I(0)}};
static const field notif_fields[] = {{"mm_hashes", LS("h")},
                                     {"shapes", X("91920203")}, /* [[2, 3]] */
                                     {"dtype_strs", LS("float32")},
                                     {"num_bytes_list", LU(24)},
                                     {"producer_session_id", S("p0")}};
static const field request_fields[] = {
    {"request_id", S("r")}, {"consumer_session_id", S("c")}, {"mm_hashes", X("90")}};
static const field ready_fields[] = {
    {"request_id", S("r")},  {"mm_hashes", X("90")},      {"shapes", X("90")},
    {"dtype_strs", X("90")}, {"num_bytes_list", X("90")}, {"producer_session_id", S("p")},
    {"more", X("c2")}};

static void mb_hex(mb *b, const char *hex) {
    unsigned char raw[256];
    mb_raw(b, raw, unhex(hex, raw, sizeof raw));
}

static void mb_val(mb *b, const val *v) {
    switch (v->k) {
    case 's': mb_strn(b, v->s, v->n ? v->n : strlen(v->s)); break;
    case 'u': mb_u(b, v->u); break;
    case 'i': mb_i(b, v->i); break;
    case 'x': mb_hex(b, v->s); break;
    case 'a': {
        char *a = malloc(v->u);
        memset(a, 'a', v->u);
        mb_strn(b, a, v->u);
        free(a);
        break;
    }
    case 'l':
        mb_arr(b, 1);
        mb_str(b, v->s);
        break;
    case 'n':
        mb_arr(b, 1);
        mb_u(b, v->u);
        break;
    default: fail();
    }
}

static const field *fields_of(wire_pull_type t, size_t *n) {
    switch (t) {
    case WIRE_PULL_PULL: *n = ECT_ARRAY_LEN(pull_fields); return pull_fields;
    case WIRE_PULL_COMPLETE: *n = ECT_ARRAY_LEN(complete_fields); return complete_fields;
    case WIRE_PULL_NOTIFICATION: *n = ECT_ARRAY_LEN(notif_fields); return notif_fields;
    case WIRE_PULL_REQUEST: *n = ECT_ARRAY_LEN(request_fields); return request_fields;
    default: *n = ECT_ARRAY_LEN(ready_fields); return ready_fields;
    }
}

/* The valid message of type t with up to two edits: an edit of a key of the
 * message replaces its value (or leaves it out); a key with a leading '+',
 * or one the message lacks, is appended after the others. */
static void build_edited(mb *b, wire_pull_type t, const field *edits, size_t nedits) {
    size_t n, count = 0;
    const field *f = fields_of(t, &n);
    const val *use[8];
    for (size_t i = 0; i < n; i++) {
        use[i] = &f[i].v;
        for (size_t e = 0; e < nedits; e++)
            if (strcmp(edits[e].key, f[i].key) == 0) use[i] = &edits[e].v;
        count += use[i]->k != '-';
    }
    bool appended[2] = {false, false};
    for (size_t e = 0; e < nedits; e++) {
        bool known = false;
        for (size_t i = 0; i < n; i++) known |= strcmp(edits[e].key, f[i].key) == 0;
        appended[e] = !known;
        count += !known;
    }
    mb_map(b, count);
    for (size_t i = 0; i < n; i++) {
        if (use[i]->k == '-') continue;
        mb_str(b, f[i].key);
        mb_val(b, use[i]);
    }
    for (size_t e = 0; e < nedits; e++) {
        if (!appended[e]) continue;
        mb_str(b, edits[e].key[0] == '+' ? edits[e].key + 1 : edits[e].key);
        mb_val(b, &edits[e].v);
    }
}

/* Runs the typed decoder of t into m->u (m->type set on success). */
static int decode_typed(wire_pull_type t, const void *buf, size_t len, wire_pull_msg *m) {
    memset(m, 0, sizeof *m);
    int rc;
    switch (t) {
    case WIRE_PULL_PULL: rc = wire_transfer_pull_decode(buf, len, &m->u.pull); break;
    case WIRE_PULL_COMPLETE: rc = wire_transfer_complete_decode(buf, len, &m->u.complete); break;
    case WIRE_PULL_NOTIFICATION:
        rc = wire_hash_notification_decode(buf, len, &m->u.notification);
        break;
    case WIRE_PULL_REQUEST: rc = wire_transfer_request_decode(buf, len, &m->u.request); break;
    default: rc = wire_transfer_ready_decode(buf, len, &m->u.ready); break;
    }
    if (!rc) m->type = t;
    return rc;
}

#define PULL WIRE_PULL_PULL
#define COMPLETE WIRE_PULL_COMPLETE
#define NOTIF WIRE_PULL_NOTIFICATION
#define READY WIRE_PULL_READY

/* A case: the valid message of `type` with its edits; `err` is what the
 * typed decoder refuses it with (ECT_EPROTO), or NULL when it decodes. With
 * `any`, decode_any must say the same. */
typedef struct decode_case {
    wire_pull_type type;
    field edit[2];
    const char *err;
    bool any;
} decode_case;

static void run_decode_cases(const decode_case *cases, size_t n) {
    for (size_t c = 0; c < n; c++) {
        const decode_case *dc = &cases[c];
        mb b;
        mb_init(&b);
        build_edited(&b, dc->type, dc->edit, dc->edit[1].key ? 2 : 1);
        wire_pull_msg m;
        int rc = decode_typed(dc->type, b.sb.data, b.sb.size, &m);
        if (!dc->err) {
            if (rc) print_error("case %zu: %s\n", c, ect_last_error());
            assert_int_equal(rc, 0);
        } else {
            if (rc == 0) print_error("case %zu decoded, want '%s'\n", c, dc->err);
            assert_err(rc, ECT_EPROTO, dc->err);
            assert_int_equal(m.type, WIRE_PULL_NONE);
            wire_pull_msg zero;
            memset(&zero, 0, sizeof zero);
            assert_memory_equal(&m, &zero, sizeof m); /* owns nothing */
        }
        wire_pull_msg_free(&m);
        if (dc->any) {
            wire_pull_msg any;
            assert_err(wire_pull_decode_any(b.sb.data, b.sb.size, &any), ECT_EPROTO, dc->err);
            assert_int_equal(any.type, WIRE_PULL_NONE);
        }
        mb_free(&b);
    }
}

static void test_reject_by_class(void **state) {
    (void)state;
    static const decode_case cases[] = {
        /* wrong types */
        {PULL, {{"dst_ptr", S("4096")}}, "ECTransferPull.dst_ptr: expected an int, got str", 1},
        {PULL,
         {{"mm_hash", X("c403616263")}},
         "ECTransferPull.mm_hash: expected a str, got bin",
         1},
        {PULL,
         {{"dst_offset", X("cb3ff0000000000000")}},
         "ECTransferPull.dst_offset: expected an int, got float",
         1},
        {NOTIF,
         {{"shapes", X("9106")}},
         "ECHashNotification.shapes[0]: expected an array, got int",
         0},
        {READY, {{"more", U(1)}}, "ECTransferReady.more: expected a bool, got int", 0},
        /* missing fields; decode_any still picks the type by the keys left */
        {PULL, {{"mm_hash", ABSENT}}, "ECTransferPull.mm_hash: missing field", 1},
        {PULL, {{"dst_ptr", ABSENT}}, "ECTransferPull.dst_ptr: missing field", 0},
        {PULL, {{"dst_offset", ABSENT}}, "ECTransferPull.dst_offset: missing field", 1},
        {PULL,
         {{"consumer_session_id", ABSENT}},
         "ECTransferPull.consumer_session_id: missing field",
         1},
        /* negative and overflowing ints */
        {PULL, {{"dst_ptr", I(-1)}}, "ECTransferPull.dst_ptr: negative int -1", 1},
        {COMPLETE,
         {{"status", I((int64_t)INT32_MAX + 1)}},
         "ECTransferComplete.status: int 2147483648 out of the int32 range",
         0},
        {COMPLETE,
         {{"status", I((int64_t)INT32_MIN - 1)}},
         "ECTransferComplete.status: int -2147483649 out of the int32 range",
         0},
        {COMPLETE, {{"status", I(INT64_MIN)}}, "out of the int32 range", 0},
        {COMPLETE,
         {{"status", U(UINT64_MAX)}},
         "ECTransferComplete.status: int 18446744073709551615 out of the int32 range",
         0},
        {NOTIF, {{"shapes", X("919202fd")}}, "ECHashNotification.shapes[0][1]: negative int -3", 0},
        {NOTIF,
         {{"shapes", X("9192cf0000010000000000cf0000010000000000")}}, /* 2^40 x 2^40 */
         "ECHashNotification.num_bytes_list[0]: shape product overflows",
         0},
        /* bounds */
        {COMPLETE, {{"mm_hash", A(WIRE_PULL_MAX_STR)}}, NULL, 0},
        {COMPLETE,
         {{"mm_hash", A(WIRE_PULL_MAX_STR + 1)}},
         "ECTransferComplete.mm_hash: string of 257 bytes exceeds the bound of 256",
         0},
        {PULL,
         {{"consumer_session_id", A(WIRE_PULL_MAX_STR + 1)}},
         "ECTransferPull.consumer_session_id: string of 257 bytes",
         1},
        {NOTIF,
         {{"shapes", X("9199010101010101010101")}},
         "ECHashNotification.shapes[0]: shape has 9 dimensions",
         0},
        /* dtype and byte count */
        {NOTIF, {{"dtype_strs", LS("torch.float32")}}, NULL, 0},
        {NOTIF,
         {{"dtype_strs", LS("torch.float33")}},
         "ECHashNotification.dtype_strs[0]: Unsupported torch dtype string",
         0},
        {NOTIF, {{"dtype_strs", LS("")}}, "ECHashNotification.dtype_strs[0]: must not be empty", 0},
        {NOTIF,
         {{"num_bytes_list", LU(25)}},
         "ECHashNotification.num_bytes_list[0]: shape and dtype do not match",
         0},
        {NOTIF,
         {{"dtype_strs", LS("bfloat16")}},
         "ECHashNotification.num_bytes_list[0]: shape and dtype do not match",
         0},
        {NOTIF, {{"dtype_strs", LS("bfloat16")}, {"num_bytes_list", LU(12)}}, NULL, 0},
        /* keys */
        {PULL, {{"+dst_ptr", U(2)}}, "ECTransferPull.dst_ptr: duplicate key", 1},
        {PULL,
         {{"+extra", U(1)}, {"+extra", S("again")}},
         "ECTransferPull.extra: duplicate key",
         1},
        {PULL, {{"+x", X("c1")}}, ".x: invalid msgpack byte 0xc1", 1},
        /* strings: non-empty UTF-8 without NUL */
        {PULL, {{"mm_hash", SN("", 0)}}, "ECTransferPull.mm_hash: must not be empty", 1},
        {PULL, {{"mm_hash", SN("ab\0c", 4)}}, "ECTransferPull.mm_hash: contains a NUL byte", 1},
        {PULL, {{"mm_hash", S("\xff")}}, "ECTransferPull.mm_hash: is not valid UTF-8", 1},
        {PULL, {{"mm_hash", S("\xc0\xaf")}}, "is not valid UTF-8", 1},         /* overlong '/' */
        {PULL, {{"mm_hash", S("\xe0\x80\xaf")}}, "is not valid UTF-8", 1},     /* overlong, 3 B */
        {PULL, {{"mm_hash", S("\xed\xa0\x80")}}, "is not valid UTF-8", 1},     /* surrogate */
        {PULL, {{"mm_hash", S("\xf4\x90\x80\x80")}}, "is not valid UTF-8", 1}, /* > U+10FFFF */
        {PULL, {{"mm_hash", S("\xe2\x82")}}, "is not valid UTF-8", 1},         /* cut short */
        {PULL, {{"mm_hash", S("\xc3\xa9t\xc3\xa9")}}, NULL, 0},                /* "été" */
    };
    run_decode_cases(cases, ECT_ARRAY_LEN(cases));
}

static void test_reject_mismatched_list_lengths(void **state) {
    (void)state;
    static const decode_case cases[] = {
        {NOTIF,
         {{"shapes", X("92920203920203")}},
         "ECHashNotification.shapes: list has 2 entries but mm_hashes has 1",
         0},
        {NOTIF, {{"dtype_strs", X("90")}}, "ECHashNotification.dtype_strs: list has 0 entries", 0},
        {NOTIF,
         {{"num_bytes_list", X("921818")}},
         "ECHashNotification.num_bytes_list: list has 2 entries",
         0},
        {NOTIF,
         {{"mm_hashes", X("92a168a169")}, {"shapes", X("92920203920203")}},
         "ECHashNotification.dtype_strs: list has 1 entries but mm_hashes has 2",
         0},
    };
    run_decode_cases(cases, ECT_ARRAY_LEN(cases));
}

/* A present extension key that is malformed does not fail the decode (the
 * upstream fields still say what to answer): every extension field is left
 * absent and ext_error says why. */
static void test_extension_keys(void **state) {
    (void)state;
    static const struct {
        wire_pull_type type;
        field edit;
        const char *ext_error; /* NULL: the extension decodes */
    } cases[] = {
        {PULL, {"dst_key", S("k")}, NULL},
        {PULL, {"dst_key", A(WIRE_PULL_MAX_KEY)}, NULL},
        {PULL, {"token", U(UINT64_MAX)}, NULL},
        {PULL, {"dst_key", U(5)}, "ECTransferPull.dst_key: expected a str, got int"},
        {PULL, {"dst_key", SN("", 0)}, "ECTransferPull.dst_key: must not be empty"},
        {PULL,
         {"dst_key", A(WIRE_PULL_MAX_KEY + 1)},
         "ECTransferPull.dst_key: string of 2048 bytes exceeds the bound of 2047"},
        {PULL, {"token", S("x")}, "ECTransferPull.token: expected an int, got str"},
        {PULL, {"token", I(-1)}, "ECTransferPull.token: negative int -1"},
        {COMPLETE, {"token", U(7)}, NULL},
        {COMPLETE, {"error", A(WIRE_PULL_MAX_STR)}, NULL},
        {COMPLETE, {"dst_key", U(5)}, NULL}, /* not an extension of a completion: ignored */
        {COMPLETE, {"token", X("c3")}, "ECTransferComplete.token: expected an int, got bool"},
        {COMPLETE,
         {"error", A(WIRE_PULL_MAX_STR + 1)},
         "ECTransferComplete.error: string of 257 bytes exceeds the bound of 256"},
        {COMPLETE, {"error", S("\xff")}, "ECTransferComplete.error: is not valid UTF-8"},
        {COMPLETE, {"ect_shm_id", S("00000000000000ff")}, NULL},
        {COMPLETE, {"ect_shm_id", S("00000000000000FF")}, "ect_shm_id: expected 16 lowercase hex"},
        {COMPLETE, {"ect_shm_id", S("0000000000000000")}, "ect_shm_id: expected 16 lowercase hex"},
        {COMPLETE, {"ect_shm_id", S("ff")}, "ECTransferComplete: ect_shm_id: expected 16"},
        {COMPLETE, {"ect_shm_id", U(255)}, "ect_shm_id: expected 16 lowercase hex"},
    };
    for (size_t c = 0; c < ECT_ARRAY_LEN(cases); c++) {
        mb b;
        mb_init(&b);
        /* the token is always there too, so a refusal must also clear it */
        field edits[2] = {cases[c].edit, {"+token", U(9)}};
        bool with_token = strcmp(cases[c].edit.key, "token") != 0;
        build_edited(&b, cases[c].type, edits, with_token ? 2 : 1);
        wire_pull_msg m;
        assert_int_equal(decode_typed(cases[c].type, b.sb.data, b.sb.size, &m), 0);
        const char *ext = m.type == PULL ? m.u.pull.ext_error : m.u.complete.ext_error;
        bool has_token = m.type == PULL ? m.u.pull.has_token : m.u.complete.has_token;
        if (cases[c].ext_error) {
            if (!ext || !strstr(ext, cases[c].ext_error))
                print_error("case %zu: ext_error '%s', want '%s'\n", c, ext ? ext : "(none)",
                            cases[c].ext_error);
            assert_true(ext && strstr(ext, cases[c].ext_error));
            assert_false(has_token);
            assert_null(m.type == PULL ? m.u.pull.dst_key : m.u.complete.error);
        } else {
            assert_null(ext);
            assert_true(has_token);
        }
        /* the upstream fields are there either way */
        assert_string_equal(m.type == PULL ? m.u.pull.mm_hash : m.u.complete.mm_hash, "abc");
        wire_pull_msg_free(&m);
        mb_free(&b);
    }
}

/* Error texts are never refused by the encoder: cut to 256 bytes at a
 * UTF-8 boundary, and made ASCII where they are not UTF-8 at all. */
static void test_error_text_is_always_sendable(void **state) {
    (void)state;
    char lng[600], acc[300],
        bad[8] = "a\xff\xfe"
                 "b";
    memset(lng, 'e', sizeof lng - 1);
    lng[sizeof lng - 1] = '\0';
    memset(acc, 'a', 255);
    strcpy(acc + 255, "\xc3\xa9tail"); /* "é" straddles byte 256 */
    const struct {
        const char *in, *out;
        size_t out_len;
    } rows[] = {{lng, NULL, 256}, {acc, NULL, 255}, {bad, "a??b", 4}, {"", NULL, 0}};
    for (size_t i = 0; i < ECT_ARRAY_LEN(rows); i++) {
        wire_transfer_complete c = {"abc", -4, .error = (char *)rows[i].in};
        void *buf;
        size_t len;
        assert_int_equal(wire_transfer_complete_encode(&c, &buf, &len), 0);
        wire_transfer_complete d;
        assert_int_equal(wire_transfer_complete_decode(buf, len, &d), 0);
        assert_null(d.ext_error);
        if (rows[i].out_len == 0) {
            assert_null(d.error); /* an empty text is not sent */
        } else {
            assert_int_equal(strlen(d.error), rows[i].out_len);
            assert_memory_equal(d.error, rows[i].out ? rows[i].out : rows[i].in, rows[i].out_len);
        }
        wire_transfer_complete_free(&d);
        free(buf);
    }
}

static void test_reject_limits(void **state) {
    (void)state;
    mb b;
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

    /* The message itself must be a map. */
    mb_init(&b);
    mb_arr(&b, 0);
    expect_pull_err(&b, ECT_EPROTO, "expected a msgpack map at the top level");

    /* A non-string key at the top level. */
    mb_init(&b);
    build_pull(&b, NULL, 1);
    mb_u(&b, 7);
    mb_u(&b, 7);
    expect_pull_err(&b, ECT_EPROTO, "ECTransferPull: key #4 is a int, keys must be str");
}

/* --------------------------------------------------- encoder validation */

static void test_encoder_rejects_invalid_messages(void **state) {
    (void)state;
    static char big[WIRE_PULL_MAX_STR + 2], bigkey[WIRE_PULL_MAX_KEY + 2];
    memset(big, 'z', sizeof big - 1);
    memset(bigkey, 'k', sizeof bigkey - 1);
    static wire_pull_item it[4] = {
        {.mm_hash = "h", .ndim = 1, .shape = {4}, .dtype = "float32", .num_bytes = 15},
        {.mm_hash = "h", .ndim = 1, .shape = {4}, .dtype = "float128", .num_bytes = 16},
        {.mm_hash = "h", .ndim = WIRE_MAX_NDIM + 1, .shape = {4}, .dtype = "float32"},
        {.mm_hash = "h", .ndim = 1, .shape = {4}, .dtype = "float32", .num_bytes = 16},
    };
    static char *hashes[] = {"a", NULL};
    const struct {
        wire_pull_msg m;
        const char *err;
    } rows[] = {
        {{PULL, .u.pull = {NULL, 1, 2, "c"}}, "ECTransferPull.mm_hash: is NULL"},
        {{PULL, .u.pull = {"h", 1, 2, "c", .dst_key = ""}},
         "ECTransferPull.dst_key: must not be empty"},
        {{PULL, .u.pull = {"h", 1, 2, "c", .dst_key = bigkey}},
         "ECTransferPull.dst_key: string of 2048 bytes exceeds the bound of 2047"},
        {{COMPLETE, .u.complete = {big, 0}}, "ECTransferComplete.mm_hash: string of 257 bytes"},
        {{COMPLETE, .u.complete = {"\xff", 0}}, "not valid UTF-8"},
        {{NOTIF, .u.notification = {&it[0], 1, "p"}},
         "ECHashNotification.num_bytes_list[0]: shape and dtype do not match"},
        {{NOTIF, .u.notification = {&it[1], 1, "p"}},
         "ECHashNotification.dtype_strs[0]: Unsupported torch dtype string"},
        {{NOTIF, .u.notification = {&it[2], 1, "p"}},
         "ECHashNotification.shapes[0]: shape has 9 dimensions"},
        {{NOTIF, .u.notification = {&it[3], 1, ""}},
         "ECHashNotification.producer_session_id: must not be empty"},
        {{WIRE_PULL_REQUEST, .u.request = {"r", "c", hashes, 2}},
         "ECTransferRequest.mm_hashes[1]: is NULL"},
        {{READY, .u.ready = {"r", NULL, 3, "p", false}},
         "ECTransferReady.mm_hashes: items is NULL"},
        {{.type = (wire_pull_type)99}, "unknown type 99"},
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(rows); i++) {
        void *buf = (void *)1;
        size_t len;
        assert_err(wire_pull_msg_encode(&rows[i].m, &buf, &len), ECT_EINVAL, rows[i].err);
        assert_null(buf);
    }
    void *buf;
    size_t len;
    assert_err(wire_transfer_complete_encode(NULL, &buf, &len), ECT_EINVAL, "NULL argument");
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

static void test_reject_truncated_input(void **state) {
    (void)state;
    const char *goldens[] = {GOLDEN_PULL,  GOLDEN_COMPLETE, GOLDEN_NOTIFICATION, GOLDEN_REQUEST,
                             GOLDEN_READY, GOLDEN_PULL_EXT, GOLDEN_COMPLETE_EXT};
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

/* --------------------------------------------------- random mutations */

/* Mutated valid messages either fail with ECT_EPROTO or decode to something
 * that re-encodes and decodes again to the same bytes. Under the ASan build
 * this also proves the decoders neither read out of bounds nor leak. */
static void test_random_mutations_never_crash(void **state) {
    (void)state;
    const char *goldens[] = {GOLDEN_PULL,  GOLDEN_COMPLETE, GOLDEN_NOTIFICATION, GOLDEN_REQUEST,
                             GOLDEN_READY, GOLDEN_PULL_EXT, GOLDEN_COMPLETE_EXT};
    uint64_t st = 2024;
    int ok = 0, rejected = 0;
    for (int iter = 0; iter < 30000; iter++) {
        unsigned char raw[512];
        size_t n = unhex(goldens[iter % ECT_ARRAY_LEN(goldens)], raw, sizeof raw);
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
                   {"golden_ready", GOLDEN_READY},
                   {"golden_pull_ext", GOLDEN_PULL_EXT},
                   {"golden_complete_ext", GOLDEN_COMPLETE_EXT},
                   {"golden_complete_shm", GOLDEN_COMPLETE_SHM},
                   {"golden_complete_batch", GOLDEN_COMPLETE_BATCH},
                   {"golden_pull_batch", GOLDEN_PULL_BATCH},
                   {"golden_done", GOLDEN_DONE}};
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
    m.u.complete = (wire_transfer_complete){.mm_hash = "deadbeef", .status = INT32_MIN};
    write_encoded(dir, "complete_failed", &m);
    m.type = WIRE_PULL_PULL;
    m.u.pull = (wire_transfer_pull){.mm_hash = "deadbeef",
                                    .dst_ptr = UINT64_MAX,
                                    .dst_offset = 1u << 20,
                                    .consumer_session_id = "consumer-session-3"};
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

/* ----------------------------------------- the per-pull messages' packer */

/* msgpack-c's bytes for a str, an unsigned and an int32 (the forms the
 * encoders used to emit through it). */
static void ref_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void expect_same(const msgpack_sbuffer *ref, const void *buf, size_t len) {
    if (ref->size != len || memcmp(ref->data, buf, len) != 0) {
        print_error("msgpack-c: ");
        for (size_t i = 0; i < ref->size; i++) print_error("%02x", (unsigned char)ref->data[i]);
        print_error("\nours:      ");
        for (size_t i = 0; i < len; i++) print_error("%02x", ((const unsigned char *)buf)[i]);
        print_error("\n");
        fail();
    }
}

/* ECTransferPull and ECTransferComplete, packed by their own packer, are
 * byte for byte what msgpack-c's packer makes of them: every width class of
 * every unsigned (fixint, uint8..64) and int32 (negative fixint, int8..32),
 * str lengths around each class boundary (fixstr, str8, str16), with and
 * without the extension keys. */
static void test_pull_packer_matches_msgpack_c(void **st) {
    (void)st;
    static const uint64_t u[] = {0,     1,     127,           128,           255,   256,
                                 65535, 65536, 4294967295ull, 4294967296ull, ~0ull, 1ull << 47};
    static const int32_t s32[] = {INT32_MIN, -32769, -32768, -129, -128, -33,   -32,   -1,       0,
                                  1,         127,    128,    255,  256,  65535, 65536, INT32_MAX};
    static const size_t lens[] = {1, 31, 32, 255, 256};
    char text[5][WIRE_PULL_MAX_STR + 1], key[2100];
    for (int l = 0; l < 5; l++) {
        memset(text[l], 'a' + l, lens[l]);
        text[l][lens[l]] = '\0';
    }
    memset(key, 'k', 2047);
    key[2047] = '\0';
    const char *keys[] = {NULL, "9e01c4d27a3f58b6", key};
    for (size_t i = 0; i < ECT_ARRAY_LEN(u); i++)
        for (int l = 0; l < 5; l++)
            for (int k = 0; k < 3; k++) {
                wire_transfer_pull m = {.mm_hash = text[l],
                                        .dst_ptr = u[i],
                                        .dst_offset = u[(i + 3) % ECT_ARRAY_LEN(u)],
                                        .consumer_session_id = text[4 - l],
                                        .dst_key = (char *)keys[k],
                                        .has_token = k != 1,
                                        .token = u[(i + 7) % ECT_ARRAY_LEN(u)]};
                msgpack_sbuffer ref;
                msgpack_packer pk;
                msgpack_sbuffer_init(&ref);
                msgpack_packer_init(&pk, &ref, msgpack_sbuffer_write);
                msgpack_pack_map(&pk, 4 + !!m.dst_key + m.has_token);
                ref_str(&pk, "mm_hash");
                ref_str(&pk, m.mm_hash);
                ref_str(&pk, "dst_ptr");
                msgpack_pack_uint64(&pk, m.dst_ptr);
                ref_str(&pk, "dst_offset");
                msgpack_pack_uint64(&pk, m.dst_offset);
                ref_str(&pk, "consumer_session_id");
                ref_str(&pk, m.consumer_session_id);
                if (m.dst_key) {
                    ref_str(&pk, "dst_key");
                    ref_str(&pk, m.dst_key);
                }
                if (m.has_token) {
                    ref_str(&pk, "token");
                    msgpack_pack_uint64(&pk, m.token);
                }
                void *buf;
                size_t len;
                assert_int_equal(wire_transfer_pull_encode(&m, &buf, &len), 0);
                expect_same(&ref, buf, len);
                free(buf);
                msgpack_sbuffer_destroy(&ref);
            }
    for (size_t i = 0; i < ECT_ARRAY_LEN(s32); i++)
        for (int l = 0; l < 5; l++)
            for (int k = 0; k < 4; k++) {
                wire_transfer_complete m = {.mm_hash = text[l],
                                            .status = s32[i],
                                            .has_token = k & 1,
                                            .token = u[(i + (size_t)l) % ECT_ARRAY_LEN(u)],
                                            .error = k & 2 ? text[4 - l] : NULL};
                msgpack_sbuffer ref;
                msgpack_packer pk;
                msgpack_sbuffer_init(&ref);
                msgpack_packer_init(&pk, &ref, msgpack_sbuffer_write);
                msgpack_pack_map(&pk, 2 + m.has_token + !!m.error);
                ref_str(&pk, "mm_hash");
                ref_str(&pk, m.mm_hash);
                ref_str(&pk, "status");
                msgpack_pack_int32(&pk, m.status);
                if (m.has_token) {
                    ref_str(&pk, "token");
                    msgpack_pack_uint64(&pk, m.token);
                }
                if (m.error) {
                    ref_str(&pk, "error");
                    ref_str(&pk, m.error);
                }
                void *buf;
                size_t len;
                assert_int_equal(wire_transfer_complete_encode(&m, &buf, &len), 0);
                expect_same(&ref, buf, len);
                free(buf);
                msgpack_sbuffer_destroy(&ref);
            }
}

/* The one-pass path for ECTransferPull / ECTransferComplete gives what the
 * general decoder gives: the same result code and, decoded, the same
 * message (its encoding and ext_error), for the usual shape and for every
 * way out of it (another form of a value or key, an unknown or duplicate
 * key, a text or extension the decoder refuses, trailing bytes). */
static void test_fast_path_matches_general(void **st) {
    (void)st;
    static const char *const hex[] = {
        GOLDEN_PULL,
        GOLDEN_COMPLETE,
        GOLDEN_PULL_EXT,
        GOLDEN_COMPLETE_EXT,
        /* status -1 (negative fixint), -200 (int16), 70000 (uint32), as int8 5 */
        "82a76d6d5f68617368a161a6737461747573ff",
        "82a76d6d5f68617368a161a6737461747573d1ff38",
        "82a76d6d5f68617368a161a6737461747573ce00011170",
        "82a76d6d5f68617368a161a6737461747573d005",
        /* status 2^31 (out of int32), as uint64 1, token negative */
        "82a76d6d5f68617368a161a6737461747573ce80000000",
        "82a76d6d5f68617368a161a6737461747573cf0000000000000001",
        "83a76d6d5f68617368a161a673746174757300a5746f6b656eff",
        /* mm_hash as str8, as bin, empty, with a NUL, bad UTF-8 */
        "82a76d6d5f68617368d90161a673746174757300",
        "82a76d6d5f68617368c40161a673746174757300",
        "82a76d6d5f68617368a0a673746174757300",
        "82a76d6d5f68617368a26100a673746174757300",
        "82a76d6d5f68617368a1ffa673746174757300",
        /* a duplicate key, an unknown key, dst_key on a completion, trailing byte */
        "83a76d6d5f68617368a161a673746174757300a6737461747573c0",
        "83a76d6d5f68617368a161a673746174757300a178c0",
        "83a76d6d5f68617368a161a673746174757300a76473745f6b6579a16b",
        "82a76d6d5f68617368a161a673746174757300c0",
        /* a pull: dst_key empty (refused extension), token as int8, error key on a pull */
        "85a76d6d5f68617368a161a76473745f70747201aa6473745f6f666673657402b3636f6e73756d65725f736573"
        "73696f6e5f6964a173a76473745f6b6579a0",
        "85a76d6d5f68617368a161a76473745f70747201aa6473745f6f666673657402b3636f6e73756d65725f736573"
        "73696f6e5f6964a173a5746f6b656ed005",
        "85a76d6d5f68617368a161a76473745f70747201aa6473745f6f666673657402b3636f6e73756d65725f736573"
        "73696f6e5f6964a173a56572726f72a165",
        /* a pull without consumer_session_id; dst_ptr and status together */
        "83a76d6d5f68617368a161a76473745f70747201aa6473745f6f666673657402",
        "83a76d6d5f68617368a161a76473745f70747201a673746174757300",
        /* ect_shm_id: as fixstr, uppercase (refused), as str8, on a pull (ignored) */
        GOLDEN_COMPLETE_SHM,
        "83a76d6d5f68617368a161a673746174757300aa6563745f73686d5f6964b03031323334353637383941424344"
        "4546",
        "83a76d6d5f68617368a161a673746174757300aa6563745f73686d5f6964d91030313233343536373839616263"
        "646566",
        "85a76d6d5f68617368a161a76473745f70747201aa6473745f6f666673657402b3636f6e73756d65725f736573"
        "73696f6e5f6964a173aa6563745f73686d5f6964b030313233343536373839616263646566",
    };
    for (size_t i = 0; i < ECT_ARRAY_LEN(hex); i++) {
        unsigned char buf[512];
        size_t len = unhex(hex[i], buf, sizeof buf);
        wire_pull_msg a, g;
        int arc = wire_pull_decode_any(buf, len, &a);
        int grc = wire_pull_decode_general(buf, len, &g);
        if (arc != grc) fail_msg("case %zu: decode_any %d, general %d", i, arc, grc);
        if (arc) continue;
        assert_int_equal(a.type, g.type);
        const char *ae = a.type == WIRE_PULL_PULL ? a.u.pull.ext_error : a.u.complete.ext_error;
        const char *ge = g.type == WIRE_PULL_PULL ? g.u.pull.ext_error : g.u.complete.ext_error;
        assert_true((!ae && !ge) || (ae && ge && strcmp(ae, ge) == 0));
        void *ea, *eg;
        size_t la, lg;
        assert_int_equal(wire_pull_msg_encode(&a, &ea, &la), 0);
        assert_int_equal(wire_pull_msg_encode(&g, &eg, &lg), 0);
        if (la != lg || memcmp(ea, eg, la) != 0) fail_msg("case %zu: different messages", i);
        free(ea);
        free(eg);
        wire_pull_msg_free(&a);
        wire_pull_msg_free(&g);
    }
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
        cmocka_unit_test(test_batch_messages),
        cmocka_unit_test(test_pull_packer_matches_msgpack_c),
        cmocka_unit_test(test_fast_path_matches_general),
        cmocka_unit_test(test_reject_by_class),
        cmocka_unit_test(test_reject_mismatched_list_lengths),
        cmocka_unit_test(test_extension_keys),
        cmocka_unit_test(test_error_text_is_always_sendable),
        cmocka_unit_test(test_reject_limits),
        cmocka_unit_test(test_encoder_rejects_invalid_messages),
        cmocka_unit_test(test_key_order_and_int_width_do_not_matter),
        cmocka_unit_test(test_reject_truncated_input),
        cmocka_unit_test(test_reject_trailing_bytes),
        cmocka_unit_test(test_reject_excessive_nesting),
        cmocka_unit_test(test_unknown_keys_are_ignored),
        cmocka_unit_test(test_decode_any_type_rule),
        cmocka_unit_test(test_random_mutations_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
