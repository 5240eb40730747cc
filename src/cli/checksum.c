/* checksum — cli_checksum: 64-bit FNV-1a over a byte range, printed by the
 * CLI as 16 lowercase hex digits to compare items across processes. */
#include "cli/cli.h"

uint64_t cli_checksum(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 offset basis */
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull; /* FNV-1a 64 prime */
    }
    return h;
}
