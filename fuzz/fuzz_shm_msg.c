/*
 * fuzz_shm_msg — every decoder of the shm transport's messages
 * (xport/shm_wire.c): HELLO and its reply, BEGIN, GRANT (the message an
 * initiator trusts least: region addresses, fd counts, the CUDA IPC trailer),
 * DONE, ID and OFFER (a GRANT answering no BEGIN, with its windows' keys).
 *
 * Input: byte 0 picks the message (mod 7: HELLO, HELLO reply, BEGIN, GRANT,
 * DONE, ID, OFFER); for GRANT byte 1 picks the BEGIN's n (1..250) and byte 2
 * the number of fds "received" with it (0..n), for DONE byte 1 picks n, for
 * OFFER byte 1 the number of fds received (0..250); the rest is the
 * message.
 *
 * Invariants beyond "no crash, no sanitizer report": every refusal is
 * ECT_EPROTO with a detail; whatever decodes encodes back, through the
 * encoders the sending side uses, to the same bytes (reserved fields, which
 * the decoders do not check, compared as 0); every IPC record of an
 * accepted GRANT lies inside the message, and the fd-flagged entries number
 * its fds.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"
#include "xport/shm_wire.h"
#include "xport/xport.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A refusal must be ECT_EPROTO with a detail; returns 0 (libFuzzer's "done"). */
static int refused(int rc) {
    if (rc != ECT_EPROTO || !ect_last_error()[0]) __builtin_trap();
    return 0;
}

/* The encoding must equal the input, reserved fields (zero_at, zero_len
 * pairs) read as 0. */
static void same_bytes(const uint8_t *in, size_t len, const uint8_t *enc, size_t elen,
                       const size_t *zero_at, const size_t *zero_len, size_t nzero) {
    if (elen != len) __builtin_trap();
    uint8_t *want = malloc(len ? len : 1);
    if (!want) return;
    memcpy(want, in, len);
    for (size_t z = 0; z < nzero; z++) memset(want + zero_at[z], 0, zero_len[z]);
    if (memcmp(want, enc, len) != 0) __builtin_trap();
    free(want);
}

static void grant(const uint8_t *msg, size_t len, uint32_t n, int nfds) {
    shm_grant g;
    int rc = shm_grant_decode(msg, len, n, nfds, &g);
    if (rc) {
        (void)refused(rc);
        return;
    }
    uint8_t *out = malloc(SHM_GRANT_MAX), *ipc = malloc(SHM_IPC_LEN * SHM_CHUNK);
    size_t zat[2 * SHM_CHUNK], zlen[2 * SHM_CHUNK], nz = 0;
    if (!out || !ipc) goto done;
    uint32_t seen = 0, fds = 0, nipc = 0;
    for (uint32_t i = 0; i < g.n; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(msg, &g, i, &seen, &e);
        fds += (e.flags & SHM_GF_FD) != 0;
        if (e.flags & SHM_GF_IPC) {
            if (e.ipc_handle < msg || e.ipc_handle + SHM_IPC_LEN > msg + len) __builtin_trap();
            zat[nz] = (size_t)(e.ipc_handle - msg) + 84;
            zlen[nz++] = 4;
            shm_grant_put_ipc(ipc + SHM_IPC_LEN * (size_t)nipc++, e.ipc_handle, e.ipc_off,
                              e.proc_token, e.device);
        }
        shm_grant_put_entry(out, i, &e);
    }
    if (fds != g.nfds) __builtin_trap();
    for (uint32_t k = 0; k < g.ndrop; k++) {
        uint64_t rid = 0;
        for (int b = 7; b >= 0; b--) rid = (rid << 8) | g.drops[8 * k + (uint32_t)b];
        shm_grant_put_drop(out, g.n, k, rid);
    }
    size_t elen = shm_grant_finish(out, g.n, g.ndrop, g.nfds, ipc, nipc);
    same_bytes(msg, len, out, elen, zat, zlen, nz);
done:
    free(out);
    free(ipc);
}

/* An OFFER: what decodes encodes back to the same bytes, its entries obey
 * the rules the initiator relies on (status 0, one of FD / FILE, a slot in
 * range), and the fd-flagged entries number its fds. */
static void offer(const uint8_t *msg, size_t len, int nfds) {
    shm_grant g;
    int rc = shm_offer_decode(msg, len, nfds, &g);
    if (rc) {
        (void)refused(rc);
        return;
    }
    uint8_t *out = malloc(SHM_OFFER_MAX);
    if (!out) return;
    uint32_t seen = 0, fds = 0;
    for (uint32_t i = 0; i < g.n; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(msg, &g, i, &seen, &e);
        if (e.status != 0 || (e.flags != SHM_GF_FD && e.flags != SHM_GF_FILE) ||
            e.slot >= SHM_SLOTS || (e.flags == SHM_GF_FILE && e.file == 0))
            __builtin_trap();
        fds += e.flags == SHM_GF_FD;
        shm_offer_put_entry(out, i, &e);
    }
    if (fds != g.nfds || seen != 0) __builtin_trap();
    for (uint32_t k = 0; k < g.ndrop; k++) {
        uint64_t rid = 0;
        for (int b = 7; b >= 0; b--) rid = (rid << 8) | g.drops[8 * k + (uint32_t)b];
        shm_offer_put_drop(out, g.n, k, rid);
    }
    same_bytes(msg, len, out, shm_offer_finish(out, g.n, g.ndrop, g.nfds), NULL, NULL, 0);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) {
        ect_log_set_level(ECT_LOG_ERROR);
        quiet = 1;
    }
    if (size < 3) return 0;
    const uint8_t *msg = data + 1;
    size_t len = size - 1;
    uint8_t out[SHM_BEGIN_MAX];
    int rc;
    switch (data[0] % 7) {
    case 0:
        if ((rc = shm_hello_decode(msg, len)) != 0) return refused(rc);
        shm_hello_encode(out);
        xp_put_u16(out + 6, shm_hello_flags(msg)); /* flags: any bits, the target reads its own */
        same_bytes(msg, len, out, SHM_HELLO_LEN, NULL, NULL, 0);
        break;
    case 1:
        if ((rc = shm_hello_reply_decode(msg, len)) != 0) return refused(rc);
        shm_hello_reply_encode(out, shm_hello_flags(msg));
        same_bytes(msg, len, out, SHM_HELLO_REPLY_LEN, NULL, NULL, 0);
        break;
    case 2: {
        uint32_t n;
        if ((rc = shm_begin_decode(msg, len, &n)) != 0) return refused(rc);
        shm_begin_entry e[SHM_CHUNK];
        for (uint32_t i = 0; i < n; i++) shm_begin_entry_get(msg, i, &e[i]);
        same_bytes(msg, len, out, shm_begin_encode(out, e, n), NULL, NULL, 0);
        break;
    }
    case 3: {
        uint32_t n = (uint32_t)data[1] % SHM_CHUNK + 1;
        grant(data + 3, size - 3, n, (int)((uint32_t)data[2] % (n + 1)));
        break;
    }
    case 5: {
        uint64_t id;
        if ((rc = shm_id_decode(msg, len, &id)) != 0) return refused(rc);
        if (id == 0) __builtin_trap();
        shm_id_encode(out, id);
        same_bytes(msg, len, out, SHM_ID_LEN, NULL, NULL, 0);
        break;
    }
    case 6: offer(data + 2, size - 2, (int)((uint32_t)data[1] % (SHM_CHUNK + 1))); break;
    default: {
        uint32_t n = data[1];
        if ((rc = shm_done_decode(data + 2, size - 2, n)) != 0) return refused(rc);
        shm_done_encode(out, n);
        same_bytes(data + 2, size - 2, out, SHM_DONE_LEN, NULL, NULL, 0);
    }
    }
    return 0;
}
