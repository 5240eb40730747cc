/*
 * shm_wire — the GRANT decoder (see shm_wire.h). Layout, little-endian:
 * u32 magic, u32 n, u32 ndrop, u32 nfds; n entries of 48 bytes {i32 status,
 * u32 flags, u64 region id, u64 region address, u64 region length, u64 fd
 * offset, u32 slot, u32 0}; ndrop u64 region ids; then one 88-byte record
 * per entry flagged SHM_GF_IPC, in entry order {64-byte CUDA IPC handle,
 * u64 offset of the region in the IPC allocation, u64 target process token,
 * u32 device ordinal, u32 0}.
 */
#include <string.h>

#include "util/util.h"
#include "xport/shm_wire.h"
#include "xport/xport.h"

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
        if ((f & ~(SHM_GF_FD | SHM_GF_IPC)) || f == (SHM_GF_FD | SHM_GF_IPC))
            return ect_set_error(ECT_EPROTO, "shm: GRANT entry %u has flags 0x%x", i, f);
        nfd += (f & SHM_GF_FD) != 0;
        nipc += (f & SHM_GF_IPC) != 0;
    }
    if (nfd != g->nfds)
        return ect_set_error(ECT_EPROTO, "shm: GRANT names %u fds, carries %u", nfd, g->nfds);
    if (len != fixed + SHM_IPC_LEN * (size_t)nipc)
        return ect_set_error(ECT_EPROTO, "shm: malformed GRANT (%zu bytes, expected %zu)", len,
                             fixed + SHM_IPC_LEN * (size_t)nipc);
    g->drops = buf + 16 + SHM_GENT * (size_t)n;
    return 0;
}

void shm_grant_entry_get(const uint8_t *buf, const shm_grant *g, uint32_t i, uint32_t *ipc_seen,
                         shm_grant_entry *e) {
    const uint8_t *p = buf + 16 + SHM_GENT * (size_t)i;
    memset(e, 0, sizeof *e);
    e->status = (int32_t)xp_get_u32(p);
    e->flags = xp_get_u32(p + 4);
    e->rid = xp_get_u64(p + 8);
    e->raddr = xp_get_u64(p + 16);
    e->rlen = xp_get_u64(p + 24);
    e->fd_off = xp_get_u64(p + 32);
    e->slot = xp_get_u32(p + 40);
    if (e->flags & SHM_GF_IPC) {
        const uint8_t *r = buf + 16 + SHM_GENT * (size_t)g->n + 8 * (size_t)g->ndrop +
                           SHM_IPC_LEN * (size_t)(*ipc_seen)++;
        e->ipc_handle = r;
        e->ipc_off = xp_get_u64(r + 64);
        e->proc_token = xp_get_u64(r + 72);
        e->device = xp_get_u32(r + 80);
    }
}

void shm_grant_put_ipc(uint8_t *rec, const uint8_t handle[64], uint64_t ipc_off,
                       uint64_t proc_token, uint32_t device) {
    memcpy(rec, handle, 64);
    xp_put_u64(rec + 64, ipc_off);
    xp_put_u64(rec + 72, proc_token);
    xp_put_u32(rec + 80, device);
    xp_put_u32(rec + 84, 0);
}
