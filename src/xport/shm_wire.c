/*
 * shm_wire — the shm messages (see shm_wire.h). Layouts, little-endian:
 *   HELLO        u32 magic, u16 version, u16 0
 *   HELLO reply  u32 magic, u16 version, u16 0, u32 slots
 *   BEGIN        u32 magic, u32 n, n x {u64 addr, u64 len, u64 key}
 *   GRANT        u32 magic, u32 n, u32 ndrop, u32 nfds; n entries of 48 bytes
 *                {i32 status, u32 flags, u64 region id, u64 region address,
 *                u64 region length, u64 fd offset, u32 slot, u32 0}; ndrop u64
 *                region ids; one 88-byte record per SHM_GF_IPC entry, in
 *                entry order {64-byte CUDA IPC handle, u64 offset of the region
 *                in the IPC allocation, u64 target process token, u32 device
 *                ordinal, u32 0}
 *   DONE         u32 magic, u32 n
 *   ID           u32 magic, u32 0, u64 initiator id (non-zero)
 *   OFFER        u32 magic, u32 n, u32 ndrop, u32 nfds; n entries of 56 bytes
 *                {a GRANT entry (status 0, flags FD or FILE), u64 key}; ndrop
 *                u64 region ids (file drops as in a GRANT)
 */
#include <stdbool.h>
#include <string.h>

#include "util/util.h"
#include "xport/shm_wire.h"
#include "xport/xport.h"

/* ------------------------------------------------------------------ HELLO */

void shm_hello_encode(uint8_t out[SHM_HELLO_LEN]) {
    xp_put_u32(out, SHM_MAGIC_HELLO);
    xp_put_u16(out + 4, SHM_VERSION);
    xp_put_u16(out + 6, 0);
}

int shm_hello_decode(const uint8_t *buf, size_t len) {
    if (len != SHM_HELLO_LEN || xp_get_u32(buf) != SHM_MAGIC_HELLO ||
        xp_get_u16(buf + 4) != SHM_VERSION)
        return ect_set_error(ECT_EPROTO, "shm: bad HELLO (%zu bytes)", len);
    return 0;
}

uint16_t shm_hello_flags(const uint8_t *buf) { return xp_get_u16(buf + 6); }

void shm_hello_reply_encode(uint8_t out[SHM_HELLO_REPLY_LEN], uint16_t flags) {
    shm_hello_encode(out);
    xp_put_u16(out + 6, flags);
    xp_put_u32(out + 8, SHM_SLOTS);
}

/* --------------------------------------------------------------------- ID */

void shm_id_encode(uint8_t out[SHM_ID_LEN], uint64_t id) {
    xp_put_u32(out, SHM_MAGIC_ID);
    xp_put_u32(out + 4, 0);
    xp_put_u64(out + 8, id);
}

int shm_id_decode(const uint8_t *buf, size_t len, uint64_t *id) {
    if (len != SHM_ID_LEN || xp_get_u32(buf) != SHM_MAGIC_ID || xp_get_u32(buf + 4) != 0 ||
        xp_get_u64(buf + 8) == 0)
        return ect_set_error(ECT_EPROTO, "shm: malformed ID (%zu bytes)", len);
    *id = xp_get_u64(buf + 8);
    return 0;
}

uint32_t shm_msg_magic(const uint8_t *buf, size_t len) { return len >= 4 ? xp_get_u32(buf) : 0; }

int shm_hello_reply_decode(const uint8_t *buf, size_t len) {
    if (len != SHM_HELLO_REPLY_LEN || xp_get_u32(buf) != SHM_MAGIC_HELLO ||
        xp_get_u16(buf + 4) != SHM_VERSION || xp_get_u32(buf + 8) != SHM_SLOTS)
        return ect_set_error(ECT_EPROTO, "shm: bad HELLO reply (%zu bytes)", len);
    return 0;
}

/* ------------------------------------------------------------------ BEGIN */

size_t shm_begin_encode(uint8_t *out, const shm_begin_entry *e, uint32_t n) {
    xp_put_u32(out, SHM_MAGIC_BEGIN);
    xp_put_u32(out + 4, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *p = out + 8 + SHM_BENT * (size_t)i;
        xp_put_u64(p, e[i].addr);
        xp_put_u64(p + 8, e[i].len);
        xp_put_u64(p + 16, e[i].token);
    }
    return 8 + SHM_BENT * (size_t)n;
}

int shm_begin_decode(const uint8_t *buf, size_t len, uint32_t *n) {
    uint32_t k = len >= 8 ? xp_get_u32(buf + 4) : 0;
    if (len < 8 || xp_get_u32(buf) != SHM_MAGIC_BEGIN || k == 0 || k > SHM_CHUNK ||
        len != 8 + SHM_BENT * (size_t)k)
        return ect_set_error(ECT_EPROTO, "shm: malformed BEGIN (%zu bytes)", len);
    *n = k;
    return 0;
}

void shm_begin_entry_get(const uint8_t *buf, uint32_t i, shm_begin_entry *e) {
    const uint8_t *p = buf + 8 + SHM_BENT * (size_t)i;
    e->addr = xp_get_u64(p);
    e->len = xp_get_u64(p + 8);
    e->token = xp_get_u64(p + 16);
}

/* ------------------------------------------------------------------ GRANT */

static void put_entry(uint8_t *o, const shm_grant_entry *e) {
    xp_put_u32(o, (uint32_t)e->status);
    xp_put_u32(o + 4, e->flags);
    xp_put_u64(o + 8, e->rid);
    xp_put_u64(o + 16, e->raddr);
    xp_put_u64(o + 24, e->rlen);
    xp_put_u64(o + 32, e->fd_off);
    xp_put_u32(o + 40, e->slot);
    xp_put_u32(o + 44, e->file);
}

void shm_grant_put_entry(uint8_t *buf, uint32_t i, const shm_grant_entry *e) {
    put_entry(buf + 16 + SHM_GENT * (size_t)i, e);
}

void shm_grant_put_drop(uint8_t *buf, uint32_t n, uint32_t k, uint64_t rid) {
    xp_put_u64(buf + 16 + SHM_GENT * (size_t)n + 8 * (size_t)k, rid);
}

size_t shm_grant_finish(uint8_t *buf, uint32_t n, uint32_t ndrop, uint32_t nfds, const uint8_t *ipc,
                        uint32_t nipc) {
    xp_put_u32(buf, SHM_MAGIC_GRANT);
    xp_put_u32(buf + 4, n);
    xp_put_u32(buf + 8, ndrop);
    xp_put_u32(buf + 12, nfds);
    size_t len = 16 + SHM_GENT * (size_t)n + 8 * (size_t)ndrop;
    if (nipc) memcpy(buf + len, ipc, SHM_IPC_LEN * (size_t)nipc);
    return len + SHM_IPC_LEN * (size_t)nipc;
}

void shm_grant_put_ipc(uint8_t *rec, const uint8_t handle[64], uint64_t ipc_off,
                       uint64_t proc_token, uint32_t device) {
    memcpy(rec, handle, 64);
    xp_put_u64(rec + 64, ipc_off);
    xp_put_u64(rec + 72, proc_token);
    xp_put_u32(rec + 80, device);
    xp_put_u32(rec + 84, 0);
}

/* At most one of FD, IPC, FILE; a file number only with FD or FILE, and
 * FILE only with one. */
static bool grant_flags_ok(uint32_t f, uint32_t file) {
    if (f & ~(SHM_GF_FD | SHM_GF_IPC | SHM_GF_FILE)) return false;
    if (f & (f - 1)) return false; /* more than one bit */
    if (f == SHM_GF_FILE) return file != 0;
    return file == 0 || f == SHM_GF_FD;
}

int shm_grant_decode(const uint8_t *buf, size_t len, uint32_t n, int nfds, shm_grant *g) {
    memset(g, 0, sizeof *g);
    if (len < 16 || xp_get_u32(buf) != SHM_MAGIC_GRANT || xp_get_u32(buf + 4) != n || n == 0 ||
        n > SHM_CHUNK)
        return ect_set_error(ECT_EPROTO, "shm: malformed GRANT (header)");
    g->n = n;
    g->ndrop = xp_get_u32(buf + 8);
    g->nfds = xp_get_u32(buf + 12);
    if (g->ndrop > SHM_MAX_DROP || g->nfds != (uint32_t)nfds || g->nfds > n)
        return ect_set_error(ECT_EPROTO, "shm: malformed GRANT (counts)");
    size_t fixed = 16 + SHM_GENT * (size_t)n + 8 * (size_t)g->ndrop;
    if (len < fixed) return ect_set_error(ECT_EPROTO, "shm: malformed GRANT (short)");
    uint32_t nfd = 0, nipc = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t f = xp_get_u32(buf + 16 + SHM_GENT * (size_t)i + 4);
        uint32_t file = xp_get_u32(buf + 16 + SHM_GENT * (size_t)i + 44);
        if (!grant_flags_ok(f, file))
            return ect_set_error(ECT_EPROTO, "shm: GRANT entry %u has flags 0x%x, file %u", i, f,
                                 file);
        nfd += (f & SHM_GF_FD) != 0;
        nipc += (f & SHM_GF_IPC) != 0;
    }
    if (nfd != g->nfds)
        return ect_set_error(ECT_EPROTO, "shm: GRANT names %u fds, carries %u", nfd, g->nfds);
    if (len != fixed + SHM_IPC_LEN * (size_t)nipc)
        return ect_set_error(ECT_EPROTO, "shm: malformed GRANT (%zu bytes, expected %zu)", len,
                             fixed + SHM_IPC_LEN * (size_t)nipc);
    g->drops = buf + 16 + SHM_GENT * (size_t)n;
    g->stride = SHM_GENT;
    return 0;
}

void shm_grant_entry_get(const uint8_t *buf, const shm_grant *g, uint32_t i, uint32_t *ipc_seen,
                         shm_grant_entry *e) {
    const uint8_t *p = buf + 16 + (size_t)g->stride * i;
    memset(e, 0, sizeof *e);
    if (g->stride == SHM_OENT) e->key = xp_get_u64(p + SHM_GENT);
    e->status = (int32_t)xp_get_u32(p);
    e->flags = xp_get_u32(p + 4);
    e->rid = xp_get_u64(p + 8);
    e->raddr = xp_get_u64(p + 16);
    e->rlen = xp_get_u64(p + 24);
    e->fd_off = xp_get_u64(p + 32);
    e->slot = xp_get_u32(p + 40);
    e->file = xp_get_u32(p + 44);
    if (e->flags & SHM_GF_IPC) {
        const uint8_t *r = buf + 16 + SHM_GENT * (size_t)g->n + 8 * (size_t)g->ndrop +
                           SHM_IPC_LEN * (size_t)(*ipc_seen)++;
        e->ipc_handle = r;
        e->ipc_off = xp_get_u64(r + 64);
        e->proc_token = xp_get_u64(r + 72);
        e->device = xp_get_u32(r + 80);
    }
}

/* ------------------------------------------------------------------ OFFER */

void shm_offer_put_entry(uint8_t *buf, uint32_t i, const shm_grant_entry *e) {
    uint8_t *o = buf + 16 + SHM_OENT * (size_t)i;
    put_entry(o, e);
    xp_put_u64(o + SHM_GENT, e->key);
}

void shm_offer_put_drop(uint8_t *buf, uint32_t n, uint32_t k, uint64_t rid) {
    xp_put_u64(buf + 16 + SHM_OENT * (size_t)n + 8 * (size_t)k, rid);
}

size_t shm_offer_finish(uint8_t *buf, uint32_t n, uint32_t ndrop, uint32_t nfds) {
    xp_put_u32(buf, SHM_MAGIC_OFFER);
    xp_put_u32(buf + 4, n);
    xp_put_u32(buf + 8, ndrop);
    xp_put_u32(buf + 12, nfds);
    return 16 + SHM_OENT * (size_t)n + 8 * (size_t)ndrop;
}

int shm_offer_decode(const uint8_t *buf, size_t len, int nfds, shm_grant *g) {
    memset(g, 0, sizeof *g);
    uint32_t n = len >= 16 ? xp_get_u32(buf + 4) : 0;
    if (len < 16 || xp_get_u32(buf) != SHM_MAGIC_OFFER || n == 0 || n > SHM_CHUNK)
        return ect_set_error(ECT_EPROTO, "shm: malformed OFFER (header)");
    g->n = n;
    g->ndrop = xp_get_u32(buf + 8);
    g->nfds = xp_get_u32(buf + 12);
    g->stride = SHM_OENT;
    if (g->ndrop > SHM_MAX_DROP || g->nfds != (uint32_t)nfds || g->nfds > n ||
        len != 16 + SHM_OENT * (size_t)n + 8 * (size_t)g->ndrop)
        return ect_set_error(ECT_EPROTO, "shm: malformed OFFER (%zu bytes)", len);
    uint32_t nfd = 0;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *p = buf + 16 + SHM_OENT * (size_t)i;
        uint32_t f = xp_get_u32(p + 4), file = xp_get_u32(p + 44);
        if (xp_get_u32(p) != 0 || (f != SHM_GF_FD && f != SHM_GF_FILE) ||
            !grant_flags_ok(f, file) || xp_get_u32(p + 40) >= SHM_SLOTS)
            return ect_set_error(ECT_EPROTO, "shm: OFFER entry %u is malformed", i);
        nfd += f == SHM_GF_FD;
    }
    if (nfd != g->nfds)
        return ect_set_error(ECT_EPROTO, "shm: OFFER names %u fds, carries %u", nfd, g->nfds);
    g->drops = buf + 16 + SHM_OENT * (size_t)n;
    return 0;
}

/* ------------------------------------------------------------------- DONE */

void shm_done_encode(uint8_t out[SHM_DONE_LEN], uint32_t n) {
    xp_put_u32(out, SHM_MAGIC_DONE);
    xp_put_u32(out + 4, n);
}

int shm_done_decode(const uint8_t *buf, size_t len, uint32_t n) {
    if (len != SHM_DONE_LEN || xp_get_u32(buf) != SHM_MAGIC_DONE || xp_get_u32(buf + 4) != n)
        return ect_set_error(ECT_EPROTO, "shm: malformed DONE (%zu bytes)", len);
    return 0;
}
