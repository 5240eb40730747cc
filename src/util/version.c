/* version — the library version string compiled in by CMake, and the ABI
 * checks a binding runs at load: the ABI version and the size of every
 * public struct by name. */
#include <string.h>

#include "ect_config.h"
#include "util/util.h"

const char *ect_version(void) { return ECT_VERSION_STRING; }

int ect_abi_version(void) { return ECT_ABI_VERSION; }

const char *ect_build_info(const char *what) {
    if (!what) return NULL;
    if (strcmp(what, "build_type") == 0) return ECT_BUILD_TYPE;
    if (strcmp(what, "sanitize") == 0) return ECT_SANITIZE_MODE;
    if (strcmp(what, "transports") == 0) return ECT_HAVE_UCX ? "tcp shm ucx" : "tcp shm";
    return NULL;
}

#define T(name)                                                                                    \
    { #name, sizeof(name) }
static const struct {
    const char *name;
    size_t size;
} structs[] = {
    T(ect_pool_opts),           T(ect_pool_stat),           T(ect_cuda_info),
    T(ect_resident_info),       T(ect_xport_opts),          T(ect_write),
    T(ect_log_record),          T(ect_push_consumer_opts),  T(ect_push_view),
    T(ect_push_consumer_stat),  T(ect_push_scheduler_opts), T(ect_push_sched_item),
    T(ect_push_scheduler_stat), T(ect_push_producer_opts),  T(ect_push_item),
    T(ect_push_result),         T(ect_push_producer_stat),  T(ect_pull_meta),
    T(ect_pull_producer_opts),  T(ect_pull_producer_stat),  T(ect_pull_scheduler_opts),
    T(ect_pull_scheduler_stat), T(ect_pull_consumer_opts),  T(ect_pull_view),
    T(ect_pull_consumer_stat),
};
#undef T

size_t ect_sizeof(const char *type_name) {
    if (!type_name) return 0;
    for (size_t i = 0; i < ECT_ARRAY_LEN(structs); i++)
        if (strcmp(structs[i].name, type_name) == 0) return structs[i].size;
    return 0;
}
