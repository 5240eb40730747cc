/*
 * shm_wire — constants of the shm transport's messages (docs/PROTOCOL.md
 * "shm") and the decoder of its one variable-layout message, GRANT, which
 * the initiator receives from the target: the header, n entries, the drop
 * list and the IPC trailer (one record per entry that grants a CUDA
 * region). Pure: no I/O, never trusts a length it did not check; the fuzz
 * target fuzz/fuzz_shm_grant.c drives it with arbitrary bytes.
 */
#ifndef ECT_SHM_WIRE_H
#define ECT_SHM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define SHM_MAGIC_HELLO 0x48534345u /* "ECSH" */
#define SHM_MAGIC_BEGIN 0x42534345u /* "ECSB" */
#define SHM_MAGIC_GRANT 0x47534345u /* "ECSG" */
#define SHM_MAGIC_DONE 0x44534345u  /* "ECSD" */
#define SHM_VERSION 1
#define SHM_CHUNK 250 /* writes per BEGIN; below SCM_MAX_FD (253) */
#define SHM_MAX_DROP 256
#define SHM_BEGIN_MAX (8 + 24 * SHM_CHUNK)
#define SHM_GENT 48    /* bytes of one GRANT entry */
#define SHM_IPC_LEN 88 /* bytes of one IPC trailer record */
#define SHM_GRANT_MAX (16 + SHM_GENT * SHM_CHUNK + 8 * SHM_MAX_DROP + SHM_IPC_LEN * SHM_CHUNK)

/* GRANT entry flags */
#define SHM_GF_FD 1u  /* the region's fd is attached (fds in entry order) */
#define SHM_GF_IPC 2u /* the region is CUDA memory: its record is in the IPC trailer */

/* One entry of a GRANT, decoded. */
typedef struct shm_grant_entry {
    int32_t status;
    uint32_t flags;
    uint64_t rid, raddr, rlen, fd_off;
    uint32_t slot;
    /* SHM_GF_IPC only: */
    const uint8_t *ipc_handle; /* 64 bytes inside the message */
    uint64_t ipc_off;          /* the region's offset in its IPC allocation */
    uint64_t proc_token;       /* the target process's token */
    uint32_t device;           /* the target's device ordinal */
} shm_grant_entry;

typedef struct shm_grant {
    uint32_t n, ndrop, nfds;
    const uint8_t *drops; /* ndrop x u64 region ids */
} shm_grant;

/* Checks a GRANT of `len` bytes answering a BEGIN of n writes, with nfds
 * descriptors received alongside: magic, counts, flags, exact length and
 * the number of fd-flagged entries. 0 and *g filled, or ECT_EPROTO with
 * detail. */
int shm_grant_decode(const uint8_t *buf, size_t len, uint32_t n, int nfds, shm_grant *g);

/* Entry i (< g->n) of a GRANT that shm_grant_decode accepted. The IPC
 * record of entry i is found by counting the IPC-flagged entries before it,
 * so call it with increasing i and pass the running count in *ipc_seen. */
void shm_grant_entry_get(const uint8_t *buf, const shm_grant *g, uint32_t i, uint32_t *ipc_seen,
                         shm_grant_entry *e);

/* Writes entry i's IPC trailer record (the target side). */
void shm_grant_put_ipc(uint8_t *rec, const uint8_t handle[64], uint64_t ipc_off,
                       uint64_t proc_token, uint32_t device);

#endif
