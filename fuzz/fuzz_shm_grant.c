/*
 * fuzz_shm_grant — the shm transport's GRANT decoder (xport/shm_wire.c), the
 * message an initiator trusts least: it carries region addresses, fd
 * counts and the CUDA IPC trailer. Input: byte 0 picks the BEGIN's n
 * (1..250), byte 1 the number of fds "received" with it (0..n); the rest is
 * the message. An accepted message's entries are all read back, and every
 * IPC record must lie inside the message.
 */
#include <stdint.h>
#include <string.h>

#include "util/util.h"
#include "xport/shm_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int quiet;
    if (!quiet) {
        ect_log_set_level(ECT_LOG_ERROR);
        quiet = 1;
    }
    if (size < 2) return 0;
    uint32_t n = (uint32_t)data[0] % SHM_CHUNK + 1;
    int nfds = (int)((uint32_t)data[1] % (n + 1));
    const uint8_t *msg = data + 2;
    size_t len = size - 2;
    shm_grant g;
    if (shm_grant_decode(msg, len, n, nfds, &g) != 0) return 0;
    uint32_t seen = 0, fds = 0;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < g.n; i++) {
        shm_grant_entry e;
        shm_grant_entry_get(msg, &g, i, &seen, &e);
        fds += (e.flags & SHM_GF_FD) != 0;
        if (e.flags & SHM_GF_IPC) {
            if (e.ipc_handle < msg || e.ipc_handle + SHM_IPC_LEN > msg + len) __builtin_trap();
            for (int b = 0; b < 64; b++) sum += e.ipc_handle[b];
        }
        sum += e.rid + e.raddr + e.rlen + e.fd_off + e.slot + (uint64_t)e.status;
    }
    if (fds != g.nfds) __builtin_trap();
    for (uint32_t i = 0; i < g.ndrop; i++) sum += g.drops[8 * i];
    return (int)(sum & 0);
}
