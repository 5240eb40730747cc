/* Tests for xport/shm_wire, the shm transport's messages: the bytes each
 * encoder writes (docs/PROTOCOL.md "shm"), round trips through the decoders,
 * and one refusal per way a message can be wrong. */
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "util/util.h"
#include "xport/shm_wire.h"
#include "xport/xport.h"

static void assert_hex(const uint8_t *buf, size_t len, const char *hex) {
    char got[1024];
    assert_true(2 * len < sizeof got);
    for (size_t i = 0; i < len; i++) snprintf(got + 2 * i, 3, "%02x", buf[i]);
    assert_string_equal(got, hex);
}

static void test_layouts(void **state) {
    (void)state;
    uint8_t b[SHM_BEGIN_MAX];
    shm_hello_encode(b);
    assert_hex(b, SHM_HELLO_LEN, "4543534801000000"); /* "ECSH", version 1 */
    assert_int_equal(shm_hello_decode(b, SHM_HELLO_LEN), 0);
    shm_hello_reply_encode(b, 0);
    assert_hex(b, SHM_HELLO_REPLY_LEN, "454353480100000000040000"); /* 1024 slots */
    assert_int_equal(shm_hello_reply_decode(b, SHM_HELLO_REPLY_LEN), 0);
    shm_begin_entry e[2] = {{0x1000, 16, 0x0102030405060708}, {0x2000, 1, 9}};
    size_t len = shm_begin_encode(b, e, 2);
    assert_int_equal(len, 8 + 2 * SHM_BENT);
    assert_hex(b, len,
               "4543534202000000"                                 /* "ECSB", n = 2 */
               "001000000000000010000000000000000807060504030201" /* addr, len, key */
               "002000000000000001000000000000000900000000000000");
    uint32_t n;
    assert_int_equal(shm_begin_decode(b, len, &n), 0);
    assert_int_equal(n, 2);
    shm_begin_entry back;
    shm_begin_entry_get(b, 1, &back);
    assert_true(back.addr == 0x2000 && back.len == 1 && back.token == 9);
    shm_done_encode(b, 7);
    assert_hex(b, SHM_DONE_LEN, "4543534407000000");
    assert_int_equal(shm_done_decode(b, SHM_DONE_LEN, 7), 0);
}

/* A GRANT of three entries (an fd region, a refused write, a CUDA region),
 * one dropped region, decoded back field by field. */
static void test_grant_round_trip(void **state) {
    (void)state;
    uint8_t *b = malloc(SHM_GRANT_MAX), ipc[SHM_IPC_LEN], handle[64];
    for (int i = 0; i < 64; i++) handle[i] = (uint8_t)i;
    shm_grant_entry in[3] = {
        {.status = 0,
         .flags = SHM_GF_FD,
         .rid = 1,
         .raddr = 0x7f00,
         .rlen = 4096,
         .fd_off = 64,
         .slot = 3},
        {.status = ECT_EACCES},
        {.status = 0, .flags = SHM_GF_IPC, .rid = 2, .raddr = 0x9000, .rlen = 512, .slot = 4},
    };
    for (uint32_t i = 0; i < 3; i++) shm_grant_put_entry(b, i, &in[i]);
    shm_grant_put_drop(b, 3, 0, 77);
    shm_grant_put_ipc(ipc, handle, 256, 0xabcdef, 1);
    size_t len = shm_grant_finish(b, 3, 1, 1, ipc, 1);
    assert_int_equal(len, 16 + 3 * SHM_GENT + 8 + SHM_IPC_LEN);
    shm_grant g;
    assert_int_equal(shm_grant_decode(b, len, 3, 1, &g), 0);
    assert_true(g.n == 3 && g.ndrop == 1 && g.nfds == 1);
    uint32_t seen = 0;
    for (uint32_t i = 0; i < 3; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(b, &g, i, &seen, &e);
        assert_int_equal(e.status, in[i].status);
        assert_int_equal(e.flags, in[i].flags);
        assert_true(e.rid == in[i].rid && e.raddr == in[i].raddr && e.rlen == in[i].rlen &&
                    e.fd_off == in[i].fd_off && e.slot == in[i].slot);
        if (i == 2) {
            assert_memory_equal(e.ipc_handle, handle, 64);
            assert_true(e.ipc_off == 256 && e.proc_token == 0xabcdef && e.device == 1);
        } else {
            assert_null(e.ipc_handle);
        }
    }
    assert_int_equal(seen, 1);
    assert_int_equal(g.drops[0], 77);
    free(b);
}

/* Memory files once per connection: a numbered fd entry, a FILE entry
 * naming it (no fd), a file drop; the bytes of the FILE entry exactly as
 * docs/PROTOCOL.md gives them; every flag combination the decoder must
 * refuse. */
static void test_grant_files(void **state) {
    (void)state;
    uint8_t *b = malloc(SHM_GRANT_MAX);
    shm_grant_entry in[2] = {
        {.flags = SHM_GF_FD, .rid = 5, .raddr = 0x1000, .rlen = 64, .slot = 1, .file = 1},
        {.flags = SHM_GF_FILE,
         .rid = 6,
         .raddr = 0x2000,
         .rlen = 8,
         .fd_off = 4096,
         .slot = 2,
         .file = 1},
    };
    for (uint32_t i = 0; i < 2; i++) shm_grant_put_entry(b, i, &in[i]);
    shm_grant_put_drop(b, 2, 0, SHM_DROP_FILE | 7);
    size_t len = shm_grant_finish(b, 2, 1, 1, NULL, 0);
    assert_int_equal(len, 16 + 2 * SHM_GENT + 8);
    assert_hex(b + 16 + SHM_GENT, SHM_GENT,
               "0000000004000000"
               "0600000000000000" /* status 0, flags 4 (FILE), rid 6 */
               "0020000000000000"
               "0800000000000000" /* raddr, rlen */
               "0010000000000000"
               "0200000001000000");                           /* fd_off, slot 2, file 1 */
    assert_hex(b + 16 + 2 * SHM_GENT, 8, "0700000000000080"); /* file drop: bit 63 | 7 */
    shm_grant g;
    assert_int_equal(shm_grant_decode(b, len, 2, 1, &g), 0);
    uint32_t seen = 0;
    for (uint32_t i = 0; i < 2; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(b, &g, i, &seen, &e);
        assert_int_equal(e.flags, in[i].flags);
        assert_int_equal(e.file, 1);
        assert_true(e.rid == in[i].rid && e.fd_off == in[i].fd_off && e.slot == in[i].slot);
    }
    /* FILE without a number, a number on an IPC entry, FILE with FD or IPC. */
    shm_grant_entry bad[] = {{.flags = SHM_GF_FILE},
                             {.flags = SHM_GF_IPC, .file = 1},
                             {.flags = SHM_GF_FILE | SHM_GF_FD, .file = 1},
                             {.flags = SHM_GF_FILE | SHM_GF_IPC, .file = 1},
                             {.flags = 8},
                             {.flags = 0, .file = 3}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        shm_grant_put_entry(b, 0, &bad[k]);
        uint32_t nfds = (bad[k].flags & SHM_GF_FD) ? 1 : 0,
                 nipc = (bad[k].flags & SHM_GF_IPC) ? 1 : 0;
        uint8_t ipc[SHM_IPC_LEN] = {0};
        len = shm_grant_finish(b, 1, 0, nfds, ipc, nipc);
        assert_err(shm_grant_decode(b, len, 1, (int)nfds, &g), ECT_EPROTO, "has flags");
    }
    free(b);
}

/* Each way a message can be wrong, refused with ECT_EPROTO. */
static void test_refusals(void **state) {
    (void)state;
    uint8_t b[SHM_BEGIN_MAX];
    shm_hello_encode(b);
    assert_err(shm_hello_decode(b, SHM_HELLO_LEN - 1), ECT_EPROTO, "bad HELLO");
    b[4] = 2; /* version 2 */
    assert_err(shm_hello_decode(b, SHM_HELLO_LEN), ECT_EPROTO, "bad HELLO");
    shm_hello_reply_encode(b, 0);
    b[8] = 1; /* 1025 slots */
    assert_err(shm_hello_reply_decode(b, SHM_HELLO_REPLY_LEN), ECT_EPROTO, "bad HELLO reply");
    shm_begin_entry e = {1, 2, 3};
    size_t len = shm_begin_encode(b, &e, 1);
    uint32_t n;
    assert_err(shm_begin_decode(b, len + 1, &n), ECT_EPROTO, "malformed BEGIN");
    assert_err(shm_begin_decode(b, 4, &n), ECT_EPROTO, "malformed BEGIN");
    b[4] = 0; /* n = 0 */
    assert_err(shm_begin_decode(b, 8, &n), ECT_EPROTO, "malformed BEGIN");
    shm_done_encode(b, 3);
    assert_err(shm_done_decode(b, SHM_DONE_LEN, 4), ECT_EPROTO, "malformed DONE");

    uint8_t *g = malloc(SHM_GRANT_MAX);
    shm_grant_entry fd = {.flags = SHM_GF_FD, .rid = 1, .rlen = 1};
    shm_grant_put_entry(g, 0, &fd);
    size_t glen = shm_grant_finish(g, 1, 0, 1, NULL, 0);
    shm_grant d;
    assert_int_equal(shm_grant_decode(g, glen, 1, 1, &d), 0);
    assert_err(shm_grant_decode(g, glen, 2, 1, &d), ECT_EPROTO, "header"); /* answers another n */
    assert_err(shm_grant_decode(g, glen, 1, 0, &d), ECT_EPROTO, "counts"); /* fd not received */
    assert_err(shm_grant_decode(g, glen - 1, 1, 1, &d), ECT_EPROTO, "short");
    assert_err(shm_grant_decode(g, glen + SHM_IPC_LEN, 1, 1, &d), ECT_EPROTO, "expected 64");
    fd.flags = SHM_GF_FD | SHM_GF_IPC;
    shm_grant_put_entry(g, 0, &fd);
    assert_err(shm_grant_decode(g, glen, 1, 1, &d), ECT_EPROTO, "flags 0x3");
    fd.flags = 0;
    shm_grant_put_entry(g, 0, &fd);
    assert_err(shm_grant_decode(g, glen, 1, 1, &d), ECT_EPROTO, "names 0 fds, carries 1");
    free(g);
}

/* Offers (docs/PROTOCOL.md "shm", "Offers"): the HELLO flag and reply flag,
 * the ID message and an OFFER, byte-exact as documented; round trips; every
 * malformed size or field refused. */
static void test_offer(void **state) {
    (void)state;
    uint8_t b[SHM_OFFER_MAX];
    shm_hello_encode(b);
    xp_put_u16(b + 6, SHM_HELLO_FILES | SHM_HELLO_OFFERS);
    assert_hex(b, SHM_HELLO_LEN, "4543534801000600");
    assert_int_equal(shm_hello_decode(b, SHM_HELLO_LEN), 0);
    assert_int_equal(shm_hello_flags(b), SHM_HELLO_FILES | SHM_HELLO_OFFERS);
    shm_hello_reply_encode(b, SHM_HELLO_OFFERS);
    assert_hex(b, SHM_HELLO_REPLY_LEN, "454353480100040000040000");
    assert_int_equal(shm_hello_reply_decode(b, SHM_HELLO_REPLY_LEN), 0);
    assert_int_equal(shm_hello_flags(b), SHM_HELLO_OFFERS);
    uint64_t id = 0;
    shm_id_encode(b, 0x0123456789abcdefull);
    assert_hex(b, SHM_ID_LEN, "4543534900000000efcdab8967452301");
    assert_int_equal(shm_id_decode(b, SHM_ID_LEN, &id), 0);
    assert_true(id == 0x0123456789abcdefull);
    assert_err(shm_id_decode(b, SHM_ID_LEN - 1, &id), ECT_EPROTO, "malformed ID");
    assert_err(shm_id_decode(b, SHM_ID_LEN + 1, &id), ECT_EPROTO, "malformed ID");
    b[4] = 1; /* reserved */
    assert_err(shm_id_decode(b, SHM_ID_LEN, &id), ECT_EPROTO, "malformed ID");
    shm_id_encode(b, 0);
    assert_err(shm_id_decode(b, SHM_ID_LEN, &id), ECT_EPROTO, "malformed ID");

    /* Window region 6, address 0x2000, 8 bytes at offset 4096 of file 1,
     * slot 2, key 0102030405060708; region 5 dropped. */
    shm_grant_entry e = {.key = 0x0102030405060708ull,
                         .flags = SHM_GF_FILE,
                         .rid = 6,
                         .raddr = 0x2000,
                         .rlen = 8,
                         .fd_off = 4096,
                         .slot = 2,
                         .file = 1};
    shm_offer_put_entry(b, 0, &e);
    shm_offer_put_drop(b, 1, 0, 5);
    size_t len = shm_offer_finish(b, 1, 1, 0);
    assert_int_equal(len, 16 + SHM_OENT + 8);
    assert_hex(b, len,
               "4543534f010000000100000000000000" /* "ECSO", n 1, ndrop 1, nfds 0 */
               "00000000040000000600000000000000002000000000000008000000000000000010000000000000"
               "0200000001000000"
               "0807060504030201"   /* the window's key */
               "0500000000000000"); /* drop: region 5 */
    shm_grant g;
    assert_int_equal(shm_offer_decode(b, len, 0, &g), 0);
    assert_int_equal(g.n, 1);
    assert_int_equal(g.ndrop, 1);
    shm_grant_entry back;
    uint32_t seen = 0;
    shm_grant_entry_get(b, &g, 0, &seen, &back);
    assert_true(back.key == e.key && back.rid == 6 && back.raddr == 0x2000 && back.rlen == 8 &&
                back.fd_off == 4096 && back.slot == 2 && back.file == 1 &&
                back.flags == SHM_GF_FILE && back.status == 0);
    assert_int_equal(shm_msg_magic(b, len), SHM_MAGIC_OFFER);
    /* docs/PROTOCOL.md ("Offers") shows these bytes. */
    const char *doc = test_protocol_md();
    static const char *const shown[] = {
        "`4543534900000000efcdab8967452301`", "`4543534801000600`", "`454353480100040000040000`",
        "`4543534f 01000000 01000000 00000000`", "0807060504030201`, the drop `0500000000000000`"};
    for (size_t i = 0; i < sizeof shown / sizeof shown[0]; i++)
        assert_non_null(strstr(doc, shown[i]));
    assert_int_equal(shm_msg_magic(b, 3), 0);
    /* Malformed: sizes, counts, fds, and each entry field an OFFER forbids. */
    assert_err(shm_offer_decode(b, len - 1, 0, &g), ECT_EPROTO, "malformed OFFER");
    assert_err(shm_offer_decode(b, len + 1, 0, &g), ECT_EPROTO, "malformed OFFER");
    assert_err(shm_offer_decode(b, 15, 0, &g), ECT_EPROTO, "header");
    assert_err(shm_offer_decode(b, len, 1, &g), ECT_EPROTO, "malformed OFFER"); /* an extra fd */
    struct {
        uint32_t flags, file, slot;
        int32_t status;
    } bad[] = {{SHM_GF_IPC, 0, 2, 0},
               {SHM_GF_FD | SHM_GF_FILE, 1, 2, 0},
               {0, 0, 2, 0},
               {SHM_GF_FILE, 0, 2, 0},
               {SHM_GF_FILE, 1, SHM_SLOTS, 0},
               {SHM_GF_FILE, 1, 2, ECT_EACCES}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shm_grant_entry x = e;
        x.flags = bad[i].flags;
        x.file = bad[i].file;
        x.slot = bad[i].slot;
        x.status = bad[i].status;
        shm_offer_put_entry(b, 0, &x);
        assert_err(shm_offer_decode(b, len, 0, &g), ECT_EPROTO, "entry 0 is malformed");
    }
    e.flags = SHM_GF_FD; /* an fd named, none received */
    shm_offer_put_entry(b, 0, &e);
    assert_err(shm_offer_decode(b, len, 0, &g), ECT_EPROTO, "names 1 fds, carries 0");
    shm_offer_finish(b, 1, 1, 1);
    assert_int_equal(shm_offer_decode(b, len, 1, &g), 0);
    xp_put_u32(b + 4, 0); /* n = 0 */
    assert_err(shm_offer_decode(b, 16 + 8, 0, &g), ECT_EPROTO, "header");
    xp_put_u32(b + 4, SHM_CHUNK + 1);
    assert_err(shm_offer_decode(b, len, 0, &g), ECT_EPROTO, "header");
    shm_offer_finish(b, 1, SHM_MAX_DROP + 1, 0);
    assert_err(shm_offer_decode(b, 16 + SHM_OENT + 8 * (SHM_MAX_DROP + 1), 0, &g), ECT_EPROTO,
               "malformed OFFER");
    shm_grant_finish(b, 1, 1, 0, NULL, 0); /* a GRANT is no OFFER */
    assert_err(shm_offer_decode(b, len, 0, &g), ECT_EPROTO, "header");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layouts),     cmocka_unit_test(test_grant_round_trip),
        cmocka_unit_test(test_grant_files), cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_offer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
